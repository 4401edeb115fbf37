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


def set_loopback(target: int | str, up: bool) -> list[str]:
    """Set lo up or down in the namespace; returns lo's addresses (after the change)."""
    with netns.entered(target), netns.iproute() as ipr:
        lo = get(ipr, "lo")
        if lo is None:
            raise OSError(errno.ENODEV, "netlink: no link 'lo'")
        ipr.link("set", index=lo.index, state="up" if up else "down")
        return dumps.addresses(ipr, lo.index) if up else []


def loopback_is_up(target: int | str) -> bool:
    with netns.entered(target), netns.iproute() as ipr:
        lo = get(ipr, "lo")
        if lo is None:
            raise OSError(errno.ENODEV, "netlink: no link 'lo'")
        return lo.up


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
    port_state: int | None = None  # IFLA_BRPORT_STATE when it is a bridge port (STP state)


def from_message(msg: Any) -> Link:
    """A Link from pyroute2's ifinfmsg (an RTM_NEWLINK reply)."""
    info = msg.get_attr("IFLA_LINKINFO")
    kind = port_state = None
    if info is not None:
        kind = info.get_attr("IFLA_INFO_KIND")
        slave = info.get_attr("IFLA_INFO_SLAVE_DATA")
        if slave is not None and info.get_attr("IFLA_INFO_SLAVE_KIND") == "bridge":
            port_state = slave.get_attr("IFLA_BRPORT_STATE")
    flags = msg["flags"]
    return Link(
        name=msg.get_attr("IFLA_IFNAME") or "",
        index=msg["index"],
        mac=msg.get_attr("IFLA_ADDRESS") or "",
        mtu=msg.get_attr("IFLA_MTU") or 0,
        kind=kind or "",
        master=msg.get_attr("IFLA_MASTER") or 0,
        up=bool(flags & IFF_UP),
        promisc=bool(flags & IFF_PROMISC),
        operstate=msg.get_attr("IFLA_OPERSTATE") or "",
        peer_index=msg.get_attr("IFLA_LINK") or 0,
        port_state=port_state,
    )


def _one(ipr: IPRoute, **query: Any) -> Link | None:
    from pyroute2 import NetlinkError

    try:
        replies = ipr.link("get", **query)
    except NetlinkError as e:
        if e.code == errno.ENODEV:
            return None
        raise
    return from_message(replies[0]) if replies else None


def get(ipr: IPRoute, name: str) -> Link | None:
    """The link called `name` in ipr's namespace (a netns.iproute() socket), or None: one
    RTM_GETLINK by name, never a dump."""
    if not name or len(name) > IFNAMSIZ - 1:
        return None  # no link can have this name (a name dump would match nothing)
    link = _one(ipr, ifname=name)
    # The kernel also resolves alternative names; callers asked for IFLA_IFNAME.
    return link if link is not None and link.name == name else None


def names() -> set[str]:
    """The interface names of the current namespace (one netlink dump by libc)."""
    import socket

    return {name for _, name in socket.if_nameindex()}


def by_index(ipr: IPRoute, index: int) -> Link | None:
    return _one(ipr, index=index)


def set_up(ipr: IPRoute, index: int) -> None:
    ipr.link("set", index=index, state="up")


def set_promisc(ipr: IPRoute, index: int) -> None:
    ipr.link("set", index=index, flags=IFF_PROMISC, change=IFF_PROMISC)


def set_mac(ipr: IPRoute, index: int, mac: str) -> None:
    ipr.link("set", index=index, address=mac)


def set_master(ipr: IPRoute, index: int, master: int) -> None:
    ipr.link("set", index=index, master=master)


def remove(ipr: IPRoute, index: int) -> None:
    ipr.link("del", index=index)


def delete(ipr: IPRoute, name: str) -> bool:
    """Delete the link if it exists; whether it did."""
    link = get(ipr, name)
    if link is None:
        return False
    remove(ipr, link.index)
    return True
