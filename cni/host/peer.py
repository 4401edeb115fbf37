"""Find the host end of a container's veth: the peer of CNI_IFNAME, seen from the host namespace.

Inside the container, the veth's IFLA_LINK is its peer's ifindex in the other namespace. We then
look that index up in the host namespace and check the link there points back at the container's
index, so an unrelated link that happens to share the index is never taken for the peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from cni.host import netns


class PeerError(Exception):
    """Why the host end could not be found (the plugin turns this into a CNI error)."""


@dataclass(frozen=True)
class HostVeth:
    name: str
    index: int
    mtu: int


def _container_side(target: int | str, ifname: str) -> tuple[int, int]:
    """(container ifindex, peer ifindex) of the veth named ifname in the container."""
    from pyroute2 import NetlinkError

    with netns.iproute(target) as ipr:
        try:  # one RTM_GETLINK by name, read without pyroute2's decoder (nlsync)
            link = ipr.link_fields(name=ifname)
        except NetlinkError:
            link = None  # what link_lookup made of any error
        if link is None:
            raise PeerError(f"container interface {ifname} not found")
        if link["kind"] != "veth" or not link["peer_index"]:
            raise PeerError(f"container interface {ifname} has no veth peer")
        return link["index"], link["peer_index"]


def host_veth(target: int | str, ifname: str) -> HostVeth:
    """The host-side peer of `ifname` in the container namespace `target`."""
    index, peer = _container_side(target, ifname)
    from pyroute2 import NetlinkError

    with netns.iproute() as ipr:
        try:
            link = ipr.link_fields(index=peer)
        except NetlinkError:
            link = None
        if link is None or link["peer_index"] != index:
            raise PeerError(f"veth peer with index {peer} of container interface {ifname} "
                            "is not in the host namespace")
        return HostVeth(link["name"], peer, link["mtu"])
