"""What a verb reads about one link, asked of the kernel for that link only.

pyroute2's addr("dump", index=...) sends an unfiltered dump and matches in Python: every pod's
addresses of the namespace (each host veth's IPv6 link-local) would cross the socket and be
decoded, so a verb's cost would grow with the node. Here the dump request carries the link's
index in its header, on a socket with NETLINK_GET_STRICT_CHK (netns.new_socket:
strict_check=True), and the kernel answers for that link only. A qdisc dump has no such
filter (the kernel walks every link whatever the header says), so a qdisc is asked for by its
link and parent instead: an RTM_GETQDISC the kernel answers only with NLM_F_ECHO.
pyroute2 builds, sends and parses every message.

together() sends several such reads in one send (pyroute2's nlm_request_batch): the kernel
answers each in turn, and a verb that reads three things about a link waits on one round trip,
not three. writes() does the same for write requests that do not depend on each other, with
each one's outcome.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyroute2 import IPRoute


def request(ipr: IPRoute, msg: Any) -> list[Any]:
    """Send one request built complete (header type and flags set: an ACK or a dump asked
    for) and return its replies (none for a bare ACK); a kernel error is raised as pyroute2's
    NetlinkError, as IPRoute's own methods raise it. pyroute2's nlm_request_batch with one
    message: the request is sent and its whole answer read in one turn of the socket's event
    loop, where nlm_request and link(...) take one per reply (~25-45 us less a request)."""
    return ipr.nlm_request_batch((msg,))


def address_request(index: int, family: int = 0) -> Any:
    """The RTM_GETADDR dump of the link's addresses (of `family`, 0: any), for request() or
    one batch after a request it must follow (links.set_loopback)."""
    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETADDR
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

    msg = ifaddrmsg()
    msg["family"] = family
    msg["index"] = index
    msg["header"]["type"] = RTM_GETADDR
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
    return msg


def address_messages(ipr: IPRoute, index: int, family: int = 0,
                     replies: list[Any] | None = None) -> list[Any]:
    """The link's RTM_NEWADDR messages (of `family`, 0: any); `replies`: those of an
    address_request(index, family) already sent (with others: the ACKs of those are among
    them)."""
    from pyroute2.netlink.rtnl import RTM_NEWADDR

    if replies is None:
        replies = request(ipr, address_request(index, family))
    # a kernel without strict checking ignores the index: filter here too
    return [m for m in replies if m["header"]["type"] == RTM_NEWADDR
            and m["index"] == index and (not family or m["family"] == family)]


def addresses(ipr: IPRoute, index: int, replies: list[Any] | None = None) -> list[str]:
    """The link's addresses as 'ip/prefix', v4 first, each family in the kernel's order;
    `replies`: as address_messages'."""
    found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for m in address_messages(ipr, index, replies=replies):
        address = m.get_attr("IFA_ADDRESS")
        if m["family"] in found and address is not None:
            found[m["family"]].append(f"{address}/{m['prefixlen']}")
    return found[socket.AF_INET] + found[socket.AF_INET6]


def address_entries(ipr: IPRoute, index: int, family: int,
                    replies: list[Any] | None = None) -> list[tuple[str, int, int]]:
    """The link's addresses of `family` as (IFA_ADDRESS, prefixlen, flags): IFA_FLAGS if the
    kernel sent it, else ifaddrmsg's 8 bits; `replies`: as address_messages'."""
    found = []
    for m in address_messages(ipr, index, family, replies):
        address = m.get_attr("IFA_ADDRESS")
        if address is not None:
            flags = m.get_attr("IFA_FLAGS")
            found.append((address, m["prefixlen"], m["flags"] if flags is None else flags))
    return found


def together(ipr: IPRoute, requests: list[Any]) -> list[list[Any]]:
    """Several read requests (built complete, header type and flags set: links.get_request,
    qdisc_request, filters_request, address_request) in one send; -> each request's replies, in
    the order asked: the messages of its answer type (RTM_NEWLINK for an RTM_GETLINK, ...). A
    request the kernel refused (a link that is not there: ENODEV, ...) has no replies, as one
    that found nothing: pyroute2 drops the error (noraise) after cleaning up after the request.
    So a caller that finds no reply asks that one again alone, and gets what the single request
    gives (None, or the error raised): the batch never changes a decision, it only saves the
    round trips of the usual case. At most one dump per batch (the kernel runs one dump at a
    time on a socket), last."""
    from pyroute2.netlink import rtnl

    answer = {rtnl.RTM_GETLINK: rtnl.RTM_NEWLINK, rtnl.RTM_GETQDISC: rtnl.RTM_NEWQDISC,
              rtnl.RTM_GETTFILTER: rtnl.RTM_NEWTFILTER, rtnl.RTM_GETADDR: rtnl.RTM_NEWADDR,
              rtnl.RTM_GETROUTE: rtnl.RTM_NEWROUTE}
    wanted = [answer[r["header"]["type"]] for r in requests]  # (a KeyError: not a read here)
    replies = ipr.nlm_request_batch(requests, noraise=True)
    # NetlinkRequest numbered each request's header in place; replies carry that number.
    found: dict[int, tuple[int, list[Any]]] = {
        r["header"]["sequence_number"]: (kind, [])
        for r, kind in zip(requests, wanted, strict=True)}
    for msg in replies:
        header = msg["header"]
        kind, mine = found.get(header["sequence_number"], (None, None))
        if mine is not None and header["type"] == kind:
            mine.append(msg)
    return [found[r["header"]["sequence_number"]][1] for r in requests]


def writes(ipr: IPRoute, requests: list[Any]) -> list[list[Any] | None]:
    """Several write requests (built complete, each with NLM_F_ACK: tc.tbf_add_message,
    ifb.add_message, ...) in one send; -> per request, in order, its replies if the kernel did
    it (its ACK, or what it echoed), None if it refused it.

    The kernel runs every message of a send in turn, whatever became of the ones before: a
    caller sends together only requests that do not depend on each other, and takes back each
    that was done when another failed. pyroute2's nlm_request_batch with noraise reads each
    request's whole answer and drops an error, so a refused request has no reply and a done
    one at least its ACK (what proves it done: never guessed from a missing echo). The error
    itself is dropped: send that request again alone (request()) for pyroute2's NetlinkError,
    the one it would have raised (or its success, if the kernel's state changed meanwhile).
    Without noraise, pyroute2 raises at the first error and leaves the later requests' reply
    queues and sequence numbers behind on the socket: never used here."""
    from pyroute2.netlink import NLM_F_ACK

    if any(not r["header"]["flags"] & NLM_F_ACK for r in requests):
        raise ValueError("dumps.writes: every request must ask for an ACK")
    replies = ipr.nlm_request_batch(requests, noraise=True)
    # NetlinkRequest numbered each request's header in place; replies carry that number.
    found: dict[int, list[Any]] = {r["header"]["sequence_number"]: [] for r in requests}
    for msg in replies:
        mine = found.get(msg["header"]["sequence_number"])
        if mine is not None:
            mine.append(msg)
    return [found[r["header"]["sequence_number"]] or None for r in requests]


def qdisc_request(index: int, parent: int, msg_class: type | None = None) -> Any:
    """The RTM_GETQDISC qdisc() sends, for together()."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = (msg_class or tcmsg)()
    msg["index"] = index
    msg["parent"] = parent
    msg["header"]["type"] = RTM_GETQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO
    return msg


def qdisc_in(replies: list[Any], index: int) -> Any:
    """The link's qdisc among a qdisc request's replies, or None."""
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    return next((m for m in replies if m["header"]["type"] == RTM_NEWQDISC
                 and m["index"] == index), None)


def filters_request(index: int, parent: int) -> Any:
    """The RTM_GETTFILTER dump pyroute2's get_filters(index=, parent=) sends, for together()."""
    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETTFILTER
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = tcmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = index
    msg["parent"] = parent
    msg["header"]["type"] = RTM_GETTFILTER
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
    return msg


def qdisc(ipr: IPRoute, index: int, parent: int, msg_class: type | None = None) -> Any:
    """The link's qdisc at `parent` (TC_H_ROOT, TC_H_INGRESS), or None: one request, whatever
    the number of links. The kernel answers a get with the qdisc only when asked to echo it,
    with a bare ACK when there is none (the builtin noop), ENOENT when the link never had an
    ingress queue; a link that is gone is None too, as a dump would have found nothing."""
    from pyroute2 import NetlinkError

    msg = qdisc_request(index, parent, msg_class)
    try:
        replies = request(ipr, msg)
    except NetlinkError as e:
        if e.code in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
            return None
        raise
    return qdisc_in(replies, index)


def writes_redone(ipr: IPRoute, requests: list[tuple[Any, Callable[[], Any]]]) -> None:
    """Write requests that a caller used to send one by one, in order, in one send (writes());
    then for each the kernel refused, in order, its `redo`: what the caller did with that request
    alone (sends it again and raises the caller's error for it, or accepts what the kernel says
    now: an identical route already there...). So the first refusal is reported as it was; the
    requests after it were done by the kernel all the same (it runs a send's messages whatever
    became of the ones before): a caller batches only requests whose effects its own undo
    removes, or that are harmless when a later step fails."""
    outcomes = writes(ipr, [msg for msg, _ in requests])
    for (_, redo), got in zip(requests, outcomes, strict=True):
        if got is None:
            redo()
