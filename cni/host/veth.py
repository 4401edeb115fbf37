"""veth pairs between the host namespace (where we run) and a container namespace.

The container end is created directly inside the container namespace (the peer gets the
namespace fd in the same RTM_NEWLINK), so it never appears on the host under a name that could
clash with a host interface, and there is no window where it sits half-moved.
"""

from __future__ import annotations

import errno
import os
from contextlib import nullcontext
from typing import NamedTuple

from cni.host import dumps, links, netns, sysctl
from cni.host.errors import HostError

ATTEMPTS = 10


class Pair(NamedTuple):
    host: links.Link  # name and index only (see _finish); look it up for anything else
    container: links.Link


def random_name() -> str:
    """`veth` + 8 random hex digits, as the reference names host ends."""
    return "veth" + os.urandom(4).hex()


def create(container_ns: int | str, ifname: str, mtu: int = 0, mac: str = "",
           host_name: str = "", master: int = 0) -> Pair:
    """Create the pair; the host end is up with accept_ra=0 (and a port of bridge `master`
    if given), the container end is down.

    Retries with a new random host name on EEXIST when that name is taken on the host (another
    plugin raced us for it); otherwise EEXIST is the container's name, already there.
    """
    from pyroute2 import NetlinkError

    fd = netns.open_ns(container_ns)
    try:
        with netns.iproute() as ipr:
            for _ in range(ATTEMPTS):
                name = host_name or random_name()
                try:
                    _add(ipr, name, ifname, fd, mtu, mac, master)
                except NetlinkError as e:
                    if e.code == errno.EEXIST and not host_name and links.get(ipr, name):
                        continue  # our random name was taken: draw another
                    if e.code == errno.EEXIST:
                        raise HostError(f"container veth name provided ({ifname}) "
                                       "already exists") from None
                    if master and links.by_index(ipr, master) is None:
                        raise HostError(f"failed to connect {name!r} to bridge: bridge "
                                        f"index {master} not found") from None
                    raise HostError(f"failed to make veth pair: {e}") from None
                return _finish(name, container_ns, ifname, master)
    finally:
        os.close(fd)
    raise HostError("failed to find a unique veth name")


def _add(ipr, name: str, peer: str, peer_ns_fd: int, mtu: int, peer_mac: str,
         master: int) -> None:
    """The pair in one RTM_NEWLINK, the peer made directly in the namespace of `peer_ns_fd`,
    the host end up at once (no second request to set it up). The host end gets txqueuelen 0;
    the pod's end keeps the kernel's default (1000), as the reference's do (a qdisc a pod
    installs on its eth0 gets a real queue)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    # pyroute2's ifinfmsg as link('add', ifname=, txqlen=0, kind='veth', peer={...},
    # state='up', mtu=, master=) builds it (its request filters cost ~0.1 ms): NLM_F_CREATE |
    # NLM_F_EXCL, so a name that is taken (either end) is EEXIST.
    peer_nlas: list[list] = [["IFLA_IFNAME", peer], ["IFLA_NET_NS_FD", peer_ns_fd]]
    if peer_mac:
        peer_nlas.append(["IFLA_ADDRESS", peer_mac])
    nlas: list[tuple] = [("IFLA_TXQLEN", 0)]
    if mtu:
        nlas.append(("IFLA_MTU", mtu))
        peer_nlas.append(["IFLA_MTU", mtu])
    if master:  # enslaved in the same request (IFLA_MASTER), as `ip link add ... master`
        nlas.append(("IFLA_MASTER", master))
    peer_msg = {"attrs": peer_nlas, "family": 0, "ifi_type": 0, "index": 0, "flags": 0,
                "change": 0}
    nlas.append(("IFLA_LINKINFO", {"attrs": [
        ["IFLA_INFO_KIND", "veth"],
        ["IFLA_INFO_DATA", {"attrs": [["VETH_INFO_PEER", peer_msg]]}]]}))
    msg = links.message(RTM_NEWLINK, ifname=name, flags=links.IFF_UP, change=links.IFF_UP,
                        attrs=tuple(nlas))
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    dumps.request(ipr, msg)


def _finish(name: str, container_ns: int | str, ifname: str, master: int) -> Pair:
    """The pair as made: the container end looked up in its namespace (one request); the host
    end is known from it without a request of its own: the container end's IFLA_LINK is its
    peer's index, and the peer is the link `name` this request created (up, so created). The
    host end's MAC and state are not read here: callers look it up when they need them."""
    try:
        sysctl.write(sysctl.conf(6, name, "accept_ra"), 0)  # we own this interface's routes
    except OSError:
        pass  # IPv6 disabled on the host: nothing to accept RAs anyway
    with netns.iproute(container_ns) as cipr:
        container = links.get(cipr, ifname)
    if container is None:
        raise HostError(f"failed to lookup {ifname!r} in the container")
    if not container.peer_index:
        raise HostError(f"failed to lookup {name!r} after creating it")
    host = links.Link(name=name, index=container.peer_index, mac="", mtu=container.mtu,
                      kind="veth", master=master, up=True, promisc=False, operstate="",
                      peer_index=container.index)
    return Pair(host=host, container=container)


def delete_container_end(container_ns: int | str, ifname: str) -> bool:
    """Delete the container's veth (the host end goes with it); False if the link was not
    there. A missing namespace raises errors.NamespaceMissing. Returns once both ends are gone,
    without the kernel's clean-up wait after (linkgone.py)."""
    from pyroute2 import NetlinkError

    from cni.host import linkgone

    with netns.iproute(container_ns) as cipr:
        link = links.get(cipr, ifname)
        if link is None:
            return False
        is_veth = link.kind == "veth" and bool(link.peer_index)
        with netns.iproute() if is_veth else nullcontext() as ipr:  # the host end's namespace
            try:
                linkgone.remove(cipr, link.index, (ipr, link.peer_index) if is_veth else None)
            except NetlinkError as e:  # e.g. CNI_IFNAME=lo: the kernel refuses, nothing changed
                raise HostError(f"failed to delete {ifname!r} in the container: "
                                f"{e.args[-1]}") from None
        return True


def delete_host_end(name: str) -> None:
    """Undo for a failed ADD: deleting the host end removes both ends."""
    with netns.iproute() as ipr:
        links.delete(ipr, name)
