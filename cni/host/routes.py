"""Routes: add the routes of a CNI result, and find them again for CHECK."""

from __future__ import annotations

import errno
import ipaddress
import socket

from cni.host import dumps
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

    msg = add_request(dst, oif, gw, mtu=mtu, advmss=advmss, priority=priority, table=table,
                      scope=scope, ifname=ifname)
    try:
        dumps.request(ipr, msg)
    except NetlinkError as e:
        if e.code == errno.EEXIST and find(ipr, dst, gw):
            return
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': "
                       f"{e.args[1] if len(e.args) > 1 else e}") from None


def add_request(dst: str, oif: int, gw: str | None = None, *, mtu: int = 0, advmss: int = 0,
                priority: int = 0, table: int | None = None, scope: int | None = None,
                ifname: str = "") -> object:
    """The RTM_NEWROUTE add() sends (for a dumps.writes_redone batch, whose redo is add()
    itself); a dst or gw that does not parse is add()'s HostError."""
    try:
        net = ipaddress.ip_network(dst, strict=False)
        gateway = ipaddress.ip_address(gw) if gw else None
        if gateway is not None and gateway.version != net.version:
            raise ValueError(f"gateway {gateway} is not of the family of {net}")
    except ValueError as e:
        raise HostError(f"failed to add route '{dst} via {gw} dev {ifname}': {e}") from None
    # proto boot, as the reference's netlink library leaves it (pyroute2 would say static).
    return _message(net, oif, gateway, mtu, advmss, priority, 254 if table is None else table,
                    scope or 0)


def _message(net: ipaddress.IPv4Network | ipaddress.IPv6Network, oif: int,
             gateway: ipaddress.IPv4Address | ipaddress.IPv6Address | None, mtu: int,
             advmss: int, priority: int, table: int, scope: int) -> object:
    """pyroute2's rtmsg as route('append', family=, dst_len=, oif=, proto=, table=, dst=,
    gateway=, metrics=, priority=, scope=) builds it: an RTM_NEWROUTE, NLM_F_CREATE |
    NLM_F_APPEND, a unicast route, the table in RTA_TABLE (0 in the header), no RTA_DST for a
    default route, the metrics that are set. Built here, not by route(...): its request
    filters cost ~100 us a request."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWROUTE, rt_type
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    msg = rtmsg()
    msg["family"] = socket.AF_INET if net.version == 4 else socket.AF_INET6
    msg["dst_len"] = net.prefixlen
    msg["proto"] = RTPROT_BOOT
    msg["scope"] = scope
    msg["type"] = rt_type["unicast"]
    attrs: list[list] = [["RTA_OIF", oif], ["RTA_TABLE", table]]
    if net.prefixlen:
        attrs.append(["RTA_DST", str(net.network_address)])
    if gateway is not None:
        attrs.append(["RTA_GATEWAY", str(gateway)])
    metrics = [[name, v] for name, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v]
    if metrics:
        attrs.append(["RTA_METRICS", {"attrs": metrics}])
    if priority:
        attrs.append(["RTA_PRIORITY", priority])
    msg["attrs"] = attrs
    msg["header"]["type"] = RTM_NEWROUTE
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND
    return msg


def _gateways(msg) -> list[str]:
    """RTA_GATEWAY and the gateway of each RTA_MULTIPATH hop."""
    found = [msg.get_attr("RTA_GATEWAY")] if msg.get_attr("RTA_GATEWAY") else []
    for hop in msg.get_attr("RTA_MULTIPATH") or ():
        if hop.get_attr("RTA_GATEWAY"):
            found.append(hop.get_attr("RTA_GATEWAY"))
    return found


def find(ipr, dst: str, gw: str | None = None, dumped: dict[int, list] | None = None) -> list:
    """Routes (main table and others) to exactly `dst`, through `gw` if given, as
    (dst_len, dst, gateways). `dumped`: the family's dump, kept by family for the next call
    of the same caller (CHECK's routes: one dump per family, not one per route)."""
    return find_looked_up(ipr, dst, gw, dumped, None)


def find_looked_up(ipr, dst: str, gw: str | None, dumped: dict[int, list] | None,
                   looked_up: list | None) -> list:
    """find(), given `looked_up`: the replies to a lookup_request(dst) already sent (in a
    dumps.together batch): the route they name, when it is the one asked for; else (another
    route, none, an error) the dump is read as without them, so they never change the
    answer. (find's own signature is the plugin API's: cni.api.find_routes.)"""
    want = ipaddress.ip_network(dst, strict=False)
    if looked_up:
        found = _matching(looked_up, want, gw)
        if found:
            return found
    family = family_of(dst)
    replies = dumped.get(family) if dumped is not None else None
    if replies is None:
        replies = _request(ipr, family, dump=True)
        if dumped is not None:
            dumped[family] = replies
    return _matching(replies, want, gw)


def _matching(replies: list, want: ipaddress.IPv4Network | ipaddress.IPv6Network,
              gw: str | None) -> list:
    found = []
    for msg in replies:
        if msg["dst_len"] != want.prefixlen:
            continue  # (a header field: the other routes' attributes are never decoded)
        got, gws = msg.get_attr("RTA_DST"), _gateways(msg)
        if want.prefixlen and (got is None or ipaddress.ip_address(got) != want.network_address):
            continue
        if gw and gws and gw not in gws:
            continue
        found.append((msg["dst_len"], got, gws))
    return found


RTM_F_FIB_MATCH = 0x2000  # include/uapi/linux/rtnetlink.h: answer with the FIB entry matched


def lookup_request(dst: str) -> object | None:
    """`ip route get fibmatch <address>` for dumps.together: the kernel answers with the one
    route (any table its rules consult) that a lookup of dst's first address matches, which is
    the route to exactly `dst` unless a more specific route covers that address. The IPv4 zero
    network asks 0.0.0.1: a lookup of 0.0.0.0 is answered with lo, never from the FIB. None
    for a dst that does not parse (find says so)."""
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except (TypeError, ValueError):
        return None
    address = net.network_address
    if net.version == 4 and not int(address):
        address += 1
    msg = _message_get(family_of(str(net)), ip=address)
    msg["flags"] = RTM_F_FIB_MATCH
    return msg


def oif_toward(ipr, address: str) -> int | None:
    """RTA_OIF of the route the kernel picks for `address` (ip route get); None if no route."""
    from pyroute2 import NetlinkError

    ip = ipaddress.ip_address(address)
    try:
        replies = _request(ipr, socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                           ip=ip)
    except NetlinkError:
        return None
    return next((m.get_attr("RTA_OIF") for m in replies), None)


def _request(ipr, family: int, dump: bool = False,
             ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None) -> list:
    """The RTM_NEWROUTE replies to route('dump', family=) (every table's routes of the
    family) or route('get', dst=ip) (the route the kernel picks), asked with the rtmsg those
    build, through dumps.request."""
    from pyroute2.netlink.rtnl import RTM_NEWROUTE

    return [m for m in dumps.request(ipr, _message_get(family, dump, ip))
            if m["header"]["type"] == RTM_NEWROUTE]


def _message_get(family: int, dump: bool = False,
                 ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None) -> object:
    """The rtmsg of route('dump', family=) or route('get', dst=ip)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETROUTE
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    msg = rtmsg()
    msg["family"] = family
    if ip is not None and not ip.is_unspecified:  # pyroute2 asks 0.0.0.0 and :: as /0
        msg["dst_len"] = ip.max_prefixlen
        msg["attrs"] = [["RTA_DST", str(ip)]]
    msg["header"]["type"] = RTM_GETROUTE
    msg["header"]["flags"] = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
    return msg
