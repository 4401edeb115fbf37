"""Routes: add the routes of a CNI result, and find them again for CHECK."""

from __future__ import annotations

import errno
import ipaddress
import socket

from cni.host import lean_pyroute2
from cni.host.errors import HostError

lean_pyroute2.install()  # pyroute2 is imported below by submodule only (see lean_pyroute2)

RTPROT_BOOT = 3


def family_of(cidr: str) -> int:
    v4 = ipaddress.ip_network(cidr, strict=False).version == 4
    return socket.AF_INET if v4 else socket.AF_INET6


def _dst(cidr: str) -> dict:
    net = ipaddress.ip_network(cidr, strict=False)
    if net.prefixlen == 0:
        return {"dst_len": 0, "family": family_of(cidr)}  # default: no RTA_DST at all
    return {"dst": str(net.network_address), "dst_len": net.prefixlen,
            "family": family_of(cidr)}


def add(ipr, dst: str, oif: int, gw: str | None = None, *, mtu: int = 0, advmss: int = 0,
        priority: int = 0, table: int | None = None, scope: int | None = None,
        ifname: str = "") -> None:
    """Add one route through `oif`, appended (NLM_F_APPEND, the reference's RouteAddEcmp): a
    second network's default route joins the first (IPv6: one multipath route; IPv4: a second
    route) instead of failing with EEXIST. An identical route already there is fine."""
    from pyroute2.netlink.exceptions import NetlinkError

    # proto boot, as the reference's netlink library leaves it (pyroute2 would say static).
    spec: dict = {**_dst(dst), "oif": oif, "proto": RTPROT_BOOT}
    if gw:
        spec["gateway"] = gw
    metrics = {k: v for k, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v}
    if metrics:
        spec["metrics"] = metrics
    if priority:
        spec["priority"] = priority
    if table is not None:
        spec["table"] = table
    if scope is not None:
        spec["scope"] = scope
    try:
        ipr.route("append", **spec)
    except NetlinkError as e:
        if e.code == errno.EEXIST and find(ipr, dst, gw):
            return
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': "
                       f"{e.args[1] if len(e.args) > 1 else e}") from None


def find(ipr, dst: str, gw: str | None = None) -> list:
    """Routes (main table and others) to exactly `dst`, through `gw` if given."""
    want = ipaddress.ip_network(dst, strict=False)
    # SyncIPRoute's rtnl.py reader (not pyroute2's decoder): (dst_len, dst, gateways)
    return [(dst_len, got, gws) for dst_len, got, gws in ipr.raw.routes(family_of(dst))
            if dst_len == want.prefixlen
            and not (want.prefixlen and (got is None or ipaddress.ip_address(got)
                                         != want.network_address))
            and not (gw and gws and gw not in gws)]
