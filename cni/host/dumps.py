"""The dumps a verb makes about one link, filtered by the kernel where it can.

pyroute2's addr("dump", index=...) sends an unfiltered dump and matches in Python: every pod's
addresses of the namespace (each host veth's IPv6 link-local) would cross the socket and be
decoded, so a verb's cost would grow with the node. Here the dump request carries the link's
index in its header, on a socket with NETLINK_GET_STRICT_CHK (netns.new_socket:
strict_check=True), and the kernel answers for that link only. The kernel has no such filter
for qdisc dumps (it walks every link whatever the header says): those are matched here.
pyroute2 builds, sends and parses every message.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyroute2 import IPRoute


def _dump(ipr: IPRoute, msg: Any, msg_type: int) -> list[Any]:
    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST

    return list(ipr.nlm_request(msg, msg_type, msg_flags=NLM_F_REQUEST | NLM_F_DUMP))


def address_messages(ipr: IPRoute, index: int, family: int = 0) -> list[Any]:
    """The link's RTM_NEWADDR messages (of `family`, 0: any)."""
    from pyroute2.netlink.rtnl import RTM_GETADDR
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

    msg = ifaddrmsg()
    msg["family"] = family
    msg["index"] = index
    # a kernel without strict checking ignores the index: filter here too
    return [m for m in _dump(ipr, msg, RTM_GETADDR)
            if m["index"] == index and (not family or m["family"] == family)]


def addresses(ipr: IPRoute, index: int) -> list[str]:
    """The link's addresses as 'ip/prefix', v4 first, each family in the kernel's order."""
    found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for m in address_messages(ipr, index):
        address = m.get_attr("IFA_ADDRESS")
        if m["family"] in found and address is not None:
            found[m["family"]].append(f"{address}/{m['prefixlen']}")
    return found[socket.AF_INET] + found[socket.AF_INET6]


def address_entries(ipr: IPRoute, index: int, family: int) -> list[tuple[str, int, int]]:
    """The link's addresses of `family` as (IFA_ADDRESS, prefixlen, flags): IFA_FLAGS if the
    kernel sent it, else ifaddrmsg's 8 bits."""
    found = []
    for m in address_messages(ipr, index, family):
        address = m.get_attr("IFA_ADDRESS")
        if address is not None:
            flags = m.get_attr("IFA_FLAGS")
            found.append((address, m["prefixlen"], m["flags"] if flags is None else flags))
    return found


def qdiscs(ipr: IPRoute, index: int) -> list[Any]:
    """The link's qdiscs (pyroute2 tcmsg)."""
    from pyroute2.netlink.rtnl import RTM_GETQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = tcmsg()
    msg["index"] = index
    return [m for m in _dump(ipr, msg, RTM_GETQDISC) if m["index"] == index]
