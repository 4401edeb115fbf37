"""Find the host end of a container's veth: the peer of CNI_IFNAME, seen from the host namespace.

Inside the container, the veth's IFLA_LINK is its peer's ifindex in the other namespace. We then
look that index up in the host namespace and check the link there points back at the container's
index, so an unrelated link that happens to share the index is never taken for the peer. The one
place that does this: bridge's CHECK and bandwidth use it alike.
"""

from __future__ import annotations

from typing import NamedTuple

from cni.host import links, netns
from cni.host.errors import HostError


class PeerError(HostError):
    """Why the container's veth or its host end could not be found."""


class HostVeth(NamedTuple):
    name: str
    index: int
    mtu: int


def container_veth(target: int | str, ifname: str, replies: list | None = None) -> links.Link:
    """The veth named ifname in the container namespace `target`; `replies`: those of a
    links.get_request(ifname=ifname) sent there in a dumps.together batch (see links.get)."""
    with netns.iproute(target) as ipr:
        link = links.get(ipr, ifname, replies=replies)
    if link is None:
        raise PeerError(f"container interface {ifname} not found")
    if link.kind != "veth" or not link.peer_index:
        raise PeerError(f"container interface {ifname} has no veth peer")
    return link


def host_end(container: links.Link) -> links.Link | None:
    """The container veth's peer in the current namespace, if it is there and points back."""
    with netns.iproute() as ipr:
        return points_back(container, links.by_index(ipr, container.peer_index))


def points_back(container: links.Link, link: links.Link | None) -> links.Link | None:
    """`link` (the host's link of the container veth's peer index) if it is that veth's peer."""
    if link is None or link.kind != "veth" or link.peer_index != container.index:
        return None
    return link


def host_veth(target: int | str, ifname: str) -> HostVeth:
    """The host-side peer of `ifname` in the container namespace `target`."""
    container = container_veth(target, ifname)
    return host_veth_of(container, host_end(container), ifname)


def host_veth_of(container: links.Link, link: links.Link | None, ifname: str) -> HostVeth:
    """What host_veth returns for the container veth and its host end (host_end, or
    points_back of a link read otherwise); PeerError if there is none."""
    if link is None:
        raise PeerError(f"veth peer with index {container.peer_index} of container interface "
                        f"{ifname} is not in the host namespace")
    return HostVeth(link.name, link.index, link.mtu)
