"""Routes: add the routes of a CNI result, and find them again for CHECK."""

from __future__ import annotations

import errno
import ipaddress
import socket

from cni.host.errors import HostError

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
    from pyroute2 import NetlinkError

    try:
        net = ipaddress.ip_network(dst, strict=False)
        gateway = ipaddress.ip_address(gw) if gw else None
        if gateway is not None and gateway.version != net.version:
            raise ValueError(f"gateway {gateway} is not of the family of {net}")
    except ValueError as e:
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': {e}") from None
    # proto boot, as the reference's netlink library leaves it (pyroute2 would say static).
    spec: dict = {"family": socket.AF_INET if net.version == 4 else socket.AF_INET6,
                  "dst_len": net.prefixlen, "oif": oif, "proto": RTPROT_BOOT,
                  "table": 254 if table is None else table}
    if net.prefixlen:  # a default route carries no RTA_DST
        spec["dst"] = str(net.network_address)
    if gateway is not None:
        spec["gateway"] = str(gateway)
    metrics = {k: v for k, v in (("mtu", mtu), ("advmss", advmss)) if v}
    if metrics:
        spec["metrics"] = metrics
    if priority:
        spec["priority"] = priority
    if scope:
        spec["scope"] = scope
    try:
        ipr.route("append", **spec)
    except NetlinkError as e:
        if e.code == errno.EEXIST and find(ipr, dst, gw):
            return
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': "
                       f"{e.args[1] if len(e.args) > 1 else e}") from None


def _gateways(msg) -> list[str]:
    """RTA_GATEWAY and the gateway of each RTA_MULTIPATH hop."""
    found = [msg.get_attr("RTA_GATEWAY")] if msg.get_attr("RTA_GATEWAY") else []
    for hop in msg.get_attr("RTA_MULTIPATH") or ():
        if hop.get_attr("RTA_GATEWAY"):
            found.append(hop.get_attr("RTA_GATEWAY"))
    return found


def find(ipr, dst: str, gw: str | None = None) -> list:
    """Routes (main table and others) to exactly `dst`, through `gw` if given, as
    (dst_len, dst, gateways)."""
    want = ipaddress.ip_network(dst, strict=False)
    found = []
    for msg in ipr.route("dump", family=family_of(dst)):
        got, gws = msg.get_attr("RTA_DST"), _gateways(msg)
        if msg["dst_len"] != want.prefixlen:
            continue
        if want.prefixlen and (got is None or ipaddress.ip_address(got) != want.network_address):
            continue
        if gw and gws and gw not in gws:
            continue
        found.append((msg["dst_len"], got, gws))
    return found


def oif_toward(ipr, address: str) -> int | None:
    """RTA_OIF of the route the kernel picks for `address` (ip route get); None if no route."""
    from pyroute2 import NetlinkError

    try:
        replies = ipr.route("get", dst=address)
    except NetlinkError:
        return None
    return next((m.get_attr("RTA_OIF") for m in replies), None)
