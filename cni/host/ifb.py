"""ifb links for egress shaping, marked with an alias so GC finds exactly ours.

The alias reads `pycni-bandwidth <network> <containerID>`: neither may contain spaces (skel
enforces the reference's name rule), so it splits back unambiguously. ifbs without our alias
(the spare ifb0/ifb1 the module creates, the reference plugin's, anyone else's) are never touched.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, NamedTuple

from cni.host import links
from cni.host.errors import HostError

if TYPE_CHECKING:
    from pyroute2 import IPRoute

MARK = "pycni-bandwidth"


class Ifb(NamedTuple):
    name: str
    index: int
    mac: str
    network: str = ""
    container_id: str = ""


def alias_for(network: str, container_id: str) -> str:
    return f"{MARK} {network} {container_id}"


def made(ipr: IPRoute, name: str, replies: list[Any]) -> Ifb:
    """The ifb add_message just made, from that request's `replies`: its index and MAC.

    The add asks the kernel to echo the link it made (NLM_F_ECHO, which link requests honour
    since Linux 6.3): they come with the answer. An older kernel answers with a bare ACK, and
    they are asked for by name, as they always were. (mark_message's up keeps the MAC.)"""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    echoed = [m for m in replies if m["header"]["type"] == RTM_NEWLINK]
    link = links.get(ipr, name, replies=echoed or None)
    if link is None:
        raise HostError(f"ifb {name} vanished right after it was created")
    return Ifb(name, link.index, link.mac)


# An ifb is made by two requests (bandwidth sends each with others: dumps.writes), the messages
# pyroute2's link() builds for the same calls (the tests compare their bytes:
# tests/test_bandwidth.py), built here as its ifinfmsg: the add (then made()) and the mark,
# which sets it up.

def add_message(name: str, mtu: int) -> Any:
    """link((RTM_NEWLINK, create|exclusive|echo), ifname=name, kind="ifb", mtu=mtu,
    txqlen=0)'s request: link()'s "add", echoed."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    msg = links.message(RTM_NEWLINK, ifname=name, attrs=(
        ("IFLA_MTU", mtu), ("IFLA_TXQLEN", 0),
        ("IFLA_LINKINFO", {"attrs": [["IFLA_INFO_KIND", "ifb"]]})))
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO
    return msg


def mark_message(index: int, alias: str) -> Any:
    """link("set", index=index, ifalias=alias, state="up")'s request."""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    return links.message(RTM_NEWLINK, index, flags=links.IFF_UP, change=links.IFF_UP,
                         attrs=(("IFLA_IFALIAS", alias),))


def lookup(ipr: IPRoute, name: str, replies: list | None = None) -> int | None:
    """The ifb's index, or None; `replies`: a links.get_request(ifname=name)'s (links.get)."""
    link = links.get(ipr, name, replies=replies)
    return link.index if link is not None else None


def delete(ipr: IPRoute, name: str, index: int | None = None) -> bool:
    """Delete the link by name (or by `index`, when the caller just looked it up); False if it
    was not there. Returns once the ifb is gone, without the kernel's clean-up wait after
    (linkgone.py)."""
    from pyroute2 import NetlinkError

    from cni.host import linkgone

    if index is None:
        index = lookup(ipr, name)
    if index is None:
        return False
    try:
        linkgone.remove(ipr, index)
    except NetlinkError as e:
        if e.code in (errno.ENODEV, errno.ENOENT):
            return False
        raise
    return True


def marked(ipr: IPRoute) -> list[Ifb]:
    """Every ifb in this namespace that carries our mark."""
    out = []
    for msg in ipr.link("dump"):
        parts = (msg.get_attr("IFLA_IFALIAS") or "").split(" ")
        link = links.from_message(msg)
        if link.kind != "ifb" or len(parts) != 3 or parts[0] != MARK:
            continue
        out.append(Ifb(link.name, link.index, link.mac, parts[1], parts[2]))
    return out
