"""What a verb reads about one link, asked of the kernel for that link only.

pyroute2's addr("dump", index=...) sends an unfiltered dump and matches in Python: every pod's
addresses of the namespace (each host veth's IPv6 link-local) would cross the socket and be
decoded, so a verb's cost would grow with the node. Here the dump request carries the link's
index in its header, on a socket with NETLINK_GET_STRICT_CHK (netns.new_socket:
strict_check=True), and the kernel answers for that link only. A qdisc dump has no such
filter (the kernel walks every link whatever the header says), so a qdisc is asked for by its
link and parent instead: an RTM_GETQDISC the kernel answers only with NLM_F_ECHO.
pyroute2 builds, sends and parses every message.
"""

from __future__ import annotations

import errno
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


def qdisc(ipr: IPRoute, index: int, parent: int, msg_class: type | None = None) -> Any:
    """The link's qdisc at `parent` (TC_H_ROOT, TC_H_INGRESS), or None: one request, whatever
    the number of links. The kernel answers a get with the qdisc only when asked to echo it,
    with a bare ACK when there is none (the builtin noop), ENOENT when the link never had an
    ingress queue; a link that is gone is None too, as a dump would have found nothing."""
    from pyroute2 import NetlinkError
    from pyroute2.netlink import NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETQDISC, RTM_NEWQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = (msg_class or tcmsg)()
    msg["index"] = index
    msg["parent"] = parent
    try:
        replies = ipr.nlm_request(msg, RTM_GETQDISC,
                                  msg_flags=NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO)
    except NetlinkError as e:
        if e.code in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
            return None
        raise
    return next((m for m in replies if m["header"]["type"] == RTM_NEWQDISC
                 and m["index"] == index), None)
