"""Routes: add the routes of a CNI result, and find them again for CHECK."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

from cni.host import lean_pyroute2, rtnl
from cni.host.errors import HostError

lean_pyroute2.install()  # pyroute2 is imported below by submodule only (see lean_pyroute2)

RTPROT_BOOT = 3


def family_of(cidr: str) -> int:
    v4 = ipaddress.ip_network(cidr, strict=False).version == 4
    return socket.AF_INET if v4 else socket.AF_INET6


def add(ipr, dst: str, oif: int, gw: str | None = None, *, mtu: int = 0, advmss: int = 0,
        priority: int = 0, table: int | None = None, scope: int | None = None,
        ifname: str = "") -> None:
    """Add one route through `oif`, appended (NLM_F_APPEND, the reference's RouteAddEcmp): a
    second network's default route joins the first (IPv6: one multipath route; IPv4: a second
    route) instead of failing with EEXIST. An identical route already there is fine."""
    from pyroute2.netlink.exceptions import NetlinkError  # its module alone (nlsocket.py)

    # proto boot, as the reference's netlink library leaves it (pyroute2 would say static).
    # Built with rtnl.py, byte for byte what pyroute2's route("append") sent.
    metrics = {k: v for k, v in ((rtnl.RTAX_MTU, mtu), (rtnl.RTAX_ADVMSS, advmss)) if v}
    try:
        request = rtnl.route_append(ipaddress.ip_network(dst, strict=False), oif,
                                    ipaddress.ip_address(gw) if gw else None,
                                    proto=RTPROT_BOOT, metrics=metrics, priority=priority,
                                    table=table, scope=scope or 0)
    except (ValueError, TypeError, struct.error) as e:  # e.g. a gateway of the other family
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': {e}") from None
    try:
        ipr.request_raw(*request)
    except NetlinkError as e:
        if e.code == errno.EEXIST and find(ipr, dst, gw):
            return
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': "
                       f"{e.args[1] if len(e.args) > 1 else e}") from None


def find(ipr, dst: str, gw: str | None = None) -> list:
    """Routes (main table and others) to exactly `dst`, through `gw` if given."""
    want = ipaddress.ip_network(dst, strict=False)
    # the socket's rtnl.py reader (not pyroute2's decoder): (dst_len, dst, gateways)
    return [(dst_len, got, gws) for dst_len, got, gws in ipr.raw.routes(family_of(dst))
            if dst_len == want.prefixlen
            and not (want.prefixlen and (got is None or ipaddress.ip_address(got)
                                         != want.network_address))
            and not (gw and gws and gw not in gws)]
