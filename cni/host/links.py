"""Links: bring up, look up, read addresses. Everything by name inside a namespace, through
pyroute2's IPRoute (a netns.iproute() socket)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, NamedTuple

from cni.host import dumps, netns

if TYPE_CHECKING:
    from pyroute2 import IPRoute

IFF_UP = 0x1
IFF_PROMISC = 0x100
IFF_ALLMULTI = 0x200
LOOPBACK_IFINDEX = 1  # include/net/net_namespace.h: each namespace's lo has this index


def set_loopback(target: int | str, up: bool) -> list[str]:
    """Set lo up or down in the namespace; returns lo's addresses (after the change). One
    request to set it by name (the kernel finds it: no lookup first), and for up an address
    dump of LOOPBACK_IFINDEX after it in the same send: the kernel gives every namespace's lo
    that index. (Should the set fail, pyroute2 raises its error and leaves the dump's answer
    unread under its own sequence number, where no other request looks; the socket is the
    request's, closed at its end, but for a pod whose namespace is the spare's own.)"""
    from pyroute2 import NetlinkError
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    set_lo = message(RTM_NEWLINK, ifname="lo", flags=IFF_UP if up else 0, change=IFF_UP)
    with netns.entered(target), netns.iproute() as ipr:
        try:
            if not up:
                dumps.request(ipr, set_lo)
                return []
            # Both in one send (pyroute2's nlm_request_batch, ~30 us less): the kernel runs
            # them in turn, so the dump sees lo up (and the addresses lo gets when it goes up);
            # a refused set raises its error, as alone.
            replies = ipr.nlm_request_batch((set_lo, dumps.address_request(LOOPBACK_IFINDEX)))
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                raise OSError(errno.ENODEV, "netlink: no link 'lo'") from None
            raise
        return dumps.addresses(ipr, LOOPBACK_IFINDEX, replies)


def loopback_is_up(target: int | str) -> bool:
    """Whether lo is up: its RTM_NEWLINK's name and flags only (from_message reads eight
    NLAs, ~25 us)."""
    with netns.entered(target), netns.iproute() as ipr:
        lo = _reply(ipr, ifname="lo")
        # as get(ipr, "lo"): the kernel also resolves alternative names
        if lo is None or lo.get_attr("IFLA_IFNAME") != "lo":
            raise OSError(errno.ENODEV, "netlink: no link 'lo'")
        return bool(lo["flags"] & IFF_UP)


# --- generic link helpers (bridge, veth) -------------------------------------------------------

IFNAMSIZ = 16


class Link(NamedTuple):
    """What the plugins need to know about a link, read from one RTM_NEWLINK message."""

    name: str
    index: int
    mac: str
    mtu: int
    kind: str
    master: int
    up: bool
    promisc: bool
    operstate: str
    peer_index: int  # IFLA_LINK: for a veth, the peer's index (in the peer's namespace)
    port_state: int | None = None  # IFLA_BRPORT_STATE of a bridge port, when asked for
    txqlen: int = 0
    allmulti: bool = False  # IFF_ALLMULTI as asked for (the kernel reports the user's flag)


_FIELDS = ("IFLA_IFNAME", "IFLA_ADDRESS", "IFLA_MTU", "IFLA_MASTER", "IFLA_OPERSTATE",
           "IFLA_LINK", "IFLA_LINKINFO", "IFLA_TXQLEN")


_KIND_INFO = ("IFLA_INFO_KIND",)
_PORT_INFO = ("IFLA_INFO_KIND", "IFLA_INFO_SLAVE_KIND", "IFLA_INFO_SLAVE_DATA")


def _attrs(msg: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The first value of each NLA in `names`, in one pass over the message (pyroute2 decodes
    an NLA when its value is read: the others, statistics and all, stay undecoded)."""
    found: dict[str, Any] = {}
    for slot in msg["attrs"]:
        name = slot[0]
        if name in names and name not in found:
            found[name] = slot[1]
    return found


def from_message(msg: Any, port_state: bool = False) -> Link:
    """A Link from pyroute2's ifinfmsg (an RTM_NEWLINK reply); with `port_state`, a bridge
    port's STP state too (decoding the ~40 bridge port attributes costs ~0.2 ms)."""
    nla = _attrs(msg, _FIELDS)
    kind = state = None
    info = nla.get("IFLA_LINKINFO")
    if info is not None:
        # A port's IFLA_INFO_SLAVE_DATA is read only when asked for: reading it decodes it.
        data = _attrs(info, _PORT_INFO if port_state else _KIND_INFO)
        kind = data.get("IFLA_INFO_KIND")
        slave = data.get("IFLA_INFO_SLAVE_DATA")
        if slave is not None and data.get("IFLA_INFO_SLAVE_KIND") == "bridge":
            state = slave.get_attr("IFLA_BRPORT_STATE")
    flags = msg["flags"]
    return Link(
        name=nla.get("IFLA_IFNAME") or "",
        index=msg["index"],
        mac=nla.get("IFLA_ADDRESS") or "",
        mtu=nla.get("IFLA_MTU") or 0,
        kind=kind or "",
        master=nla.get("IFLA_MASTER") or 0,
        up=bool(flags & IFF_UP),
        promisc=bool(flags & IFF_PROMISC),
        operstate=nla.get("IFLA_OPERSTATE") or "",
        peer_index=nla.get("IFLA_LINK") or 0,
        port_state=state,
        txqlen=nla.get("IFLA_TXQLEN") or 0,
        allmulti=bool(flags & IFF_ALLMULTI),
    )


def message(msg_type: int, index: int = 0, ifname: str | None = None, flags: int = 0,
             change: int = 0, attrs: tuple[tuple[str, Any], ...] = ()) -> Any:
    """pyroute2's ifinfmsg of a link request as link(...) builds it, an ACK asked for: the
    link by index, or by name (IFLA_IFNAME), with the IFF_* `flags` of mask `change` and the
    NLAs `attrs`. Built here, not by link(...): its request filters cost ~25 us a request."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    msg = ifinfmsg()
    msg["index"] = index
    msg["flags"] = flags
    msg["change"] = change
    nlas = [["IFLA_IFNAME", ifname]] if ifname is not None else []
    nlas.extend([name, value] for name, value in attrs)
    msg["attrs"] = nlas
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    return msg


def _set(ipr: IPRoute, index: int = 0, ifname: str | None = None, flags: int = 0,
         change: int = 0, attrs: tuple[tuple[str, Any], ...] = ()) -> None:
    """link('set', ...): an RTM_NEWLINK of the link, with an ACK."""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    dumps.request(ipr, message(RTM_NEWLINK, index, ifname, flags, change, attrs))


def _reply(ipr: IPRoute, index: int = 0, ifname: str | None = None) -> Any:
    """link('get', ...)'s RTM_NEWLINK, or None: ENODEV, or no reply."""
    from pyroute2 import NetlinkError

    try:
        replies = dumps.request(ipr, get_request(index, ifname))
    except NetlinkError as e:
        if e.code == errno.ENODEV:
            return None
        raise
    return replies[0] if replies else None


def _one(ipr: IPRoute, port_state: bool = False, index: int = 0,
         ifname: str | None = None) -> Link | None:
    reply = _reply(ipr, index, ifname)
    return from_message(reply, port_state) if reply is not None else None


def get_request(index: int = 0, ifname: str | None = None) -> Any:
    """The RTM_GETLINK that link('get', index=...) or link('get', ifname=...) sends, for
    dumps.together: its replies go to get or by_index as `replies`."""
    from pyroute2.netlink.rtnl import RTM_GETLINK

    return message(RTM_GETLINK, index, ifname)


def get(ipr: IPRoute, name: str, port_state: bool = False,
        replies: list[Any] | None = None) -> Link | None:
    """The link called `name` in ipr's namespace (a netns.iproute() socket), or None: one
    RTM_GETLINK by name, never a dump. `port_state`: see from_message. `replies`: those of a
    get_request(ifname=name) from dumps.together (none: asked again alone, which finds none or
    raises the error the batch dropped)."""
    if not name or len(name) > IFNAMSIZ - 1:
        return None  # no link can have this name (a name dump would match nothing)
    link = from_message(replies[0], port_state) if replies else _one(ipr, port_state,
                                                                      ifname=name)
    # The kernel also resolves alternative names; callers asked for IFLA_IFNAME.
    return link if link is not None and link.name == name else None


def names() -> set[str]:
    """The interface names of the current namespace (one netlink dump by libc)."""
    import socket

    return {name for _, name in socket.if_nameindex()}


def index_of(name: str) -> int | None:
    """The index of the link called `name` in the calling thread's namespace, or None, from
    the interface table (if_nametoindex, then if_indextoname, so that an altname does not count,
    as get() takes IFLA_IFNAME only): one ioctl each, nothing decoded. A hint for batching
    requests, not a lookup: a link can go and come between this and the next request."""
    import socket

    try:
        index = socket.if_nametoindex(name)
        return index if socket.if_indextoname(index) == name else None
    except OSError:
        return None


def by_index(ipr: IPRoute, index: int, replies: list[Any] | None = None) -> Link | None:
    """The link of that index, or None; `replies`: a get_request(index)'s, as get's."""
    return from_message(replies[0]) if replies else _one(ipr, index=index)


def set_up(ipr: IPRoute, index: int) -> None:
    _set(ipr, index, flags=IFF_UP, change=IFF_UP)


def set_promisc(ipr: IPRoute, index: int) -> None:
    _set(ipr, index, flags=IFF_PROMISC, change=IFF_PROMISC)


def set_flag(ipr: IPRoute, index: int, flag: int, on: bool) -> None:
    """Set or clear one IFF_* flag the user may change (IFF_PROMISC, IFF_ALLMULTI)."""
    _set(ipr, index, flags=flag if on else 0, change=flag)


def set_mac(ipr: IPRoute, index: int, mac: str) -> None:
    _set(ipr, index, attrs=(("IFLA_ADDRESS", mac),))


def set_mtu(ipr: IPRoute, index: int, mtu: int) -> None:
    _set(ipr, index, attrs=(("IFLA_MTU", mtu),))


def set_txqlen(ipr: IPRoute, index: int, txqlen: int) -> None:
    _set(ipr, index, attrs=(("IFLA_TXQLEN", txqlen),))


def set_master(ipr: IPRoute, index: int, master: int) -> None:
    _set(ipr, index, attrs=(("IFLA_MASTER", master),))


def remove(ipr: IPRoute, index: int) -> None:
    from pyroute2.netlink.rtnl import RTM_DELLINK

    dumps.request(ipr, message(RTM_DELLINK, index))


def delete(ipr: IPRoute, name: str) -> bool:
    """Delete the link if it exists; whether it did."""
    link = get(ipr, name)
    if link is None:
        return False
    remove(ipr, link.index)
    return True
