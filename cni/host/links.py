"""Links: bring up, look up, read addresses. Everything by name inside a namespace."""

from __future__ import annotations

from typing import NamedTuple

from cni.host import netns, rtnl
from cni.host.rtnl import IFF_PROMISC, IFF_UP


def set_loopback(target: int | str, up: bool) -> list[str]:
    """Set lo up or down in the namespace; returns lo's addresses (after the change)."""
    with netns.entered(target), rtnl.Rtnl() as nl:  # its own socket, loopback's only one
        index, _ = nl.link("lo")
        nl.set_up(index, up)
        return nl.addresses(index) if up else []


def loopback_is_up(target: int | str) -> bool:
    with netns.entered(target), rtnl.Rtnl() as nl:
        return bool(nl.link("lo")[1] & IFF_UP)


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


def get(ipr, name: str) -> Link | None:
    """The link called `name` in ipr's namespace (a netns.iproute() socket), or None."""
    if not name or len(name) > IFNAMSIZ - 1:
        return None  # no link can have this name (a name dump would match nothing)
    fields = ipr.link_fields(name=name)  # rtnl.py: RTM_GETLINK by name, not pyroute2's decoder
    # The kernel also resolves alternative names; callers asked for IFLA_IFNAME.
    return Link(**fields) if fields is not None and fields["name"] == name else None


def names() -> set[str]:
    """The interface names of the current namespace (one netlink dump by libc)."""
    import socket

    return {name for _, name in socket.if_nameindex()}


def by_index(ipr, index: int) -> Link | None:
    fields = ipr.link_fields(index=index)
    return Link(**fields) if fields is not None else None


# The writes are built with rtnl.py, byte for byte what pyroute2's link("set"/"del") sent.

def set_up(ipr, index: int) -> None:
    ipr.request_raw(*rtnl.link_set_flags(index, IFF_UP, IFF_UP))


def set_promisc(ipr, index: int) -> None:
    ipr.request_raw(*rtnl.link_set_flags(index, IFF_PROMISC, IFF_PROMISC))


def set_mac(ipr, index: int, mac: str) -> None:
    ipr.request_raw(*rtnl.link_set_mac(index, mac))


def set_master(ipr, index: int, master: int) -> None:
    ipr.request_raw(*rtnl.link_set_master(index, master))


def remove(ipr, index: int) -> None:
    ipr.request_raw(*rtnl.link_del(index))


def delete(ipr, name: str) -> bool:
    """Delete the link if it exists; whether it did."""
    link = get(ipr, name)
    if link is None:
        return False
    remove(ipr, link.index)
    return True
