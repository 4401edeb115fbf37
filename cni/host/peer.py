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
        try:  # the reply to a lookup by name is the link itself: one request, not two
            found = ipr.link("get", ifname=ifname)
        except NetlinkError:
            found = []  # what link_lookup made of any error
        if not found:
            raise PeerError(f"container interface {ifname} not found")
        link = found[0]
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        peer = link.get_attr("IFLA_LINK")
        if kind != "veth" or not peer:
            raise PeerError(f"container interface {ifname} has no veth peer")
        return link["index"], peer


def host_veth(target: int | str, ifname: str) -> HostVeth:
    """The host-side peer of `ifname` in the container namespace `target`."""
    index, peer = _container_side(target, ifname)
    from pyroute2 import NetlinkError

    with netns.iproute() as ipr:
        try:
            links = ipr.get_links(peer)
        except NetlinkError:
            links = []
        if not links or links[0].get_attr("IFLA_LINK") != index:
            raise PeerError(f"veth peer with index {peer} of container interface {ifname} "
                            "is not in the host namespace")
        link = links[0]
        return HostVeth(link.get_attr("IFLA_IFNAME"), peer, link.get_attr("IFLA_MTU"))
