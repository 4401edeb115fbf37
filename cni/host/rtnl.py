"""A minimal rtnetlink client over a plain socket, stdlib only, for the hottest reads and writes.

loopback runs in every pod and makes three requests (look lo up, set it up, list its addresses).
Through pyroute2 that costs its import (~200 ms without the daemon) and ~4 ms of CPU per request
in the daemon; here it is a few struct packs and three round trips. Reading a link (links.get,
nine times in a bridge ADD) costs ~1 ms of CPU in pyroute2's decoder, ~0.07 ms here. The same
for bandwidth's tc reads (qdiscs, redirect filters): pyroute2 decoded every qdisc of the host
for each (~half of a bandwidth CHECK). And the writes of the plugins' common verbs: building a
request through pyroute2 was ~0.5 ms each (9-12 in a bridge ADD), and its import ~50 ms without
the daemon. netns.iproute()'s sockets (nlsocket.py) are this client on their own socket.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the requests take parsed addresses; loopback's path never imports these
    import ipaddress
    from collections.abc import Iterator, Mapping

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_SETLINK = 19
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_OPERSTATE = 16
IFLA_TXQLEN = 13
IFLA_LINKINFO = 18
IFLA_IFALIAS = 20
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_NET_NS_FD = 28
VETH_INFO_PEER = 1
IFLA_BR_VLAN_FILTERING = 7
IFLA_BRPORT_MODE = 4  # hairpin
IFLA_BRPORT_ISOLATED = 33
IFLA_INFO_SLAVE_KIND = 4
IFLA_INFO_SLAVE_DATA = 5
IFLA_BRPORT_STATE = 1
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_BROADCAST = 4
IFA_FLAGS = 8
IFF_UP = 0x1
IFF_PROMISC = 0x100
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_PRIORITY = 6
RTA_METRICS = 8
RTA_MULTIPATH = 9
RTA_TABLE = 15
RTAX_MTU = 2
RTAX_ADVMSS = 8
RT_TABLE_MAIN = 254
RTN_UNICAST = 1
NLA_F_NESTED = 0x8000
RTM_NEWQDISC = 36
RTM_DELQDISC = 37
RTM_GETQDISC = 38
RTM_NEWTFILTER = 44
RTM_GETTFILTER = 46
TCA_KIND = 1
TCA_OPTIONS = 2
TCA_U32_ACT = 7
TCA_ACT_KIND = 1
TCA_ACT_OPTIONS = 2
TCA_MIRRED_PARMS = 2
_MIRRED_IFINDEX = 24  # struct tc_mirred: tc_gen (5 x 32 bits), eaction, then ifindex
AF_BRIDGE = 7
IFLA_AF_SPEC = 26
IFLA_EXT_MASK = 29
IFLA_BRIDGE_VLAN_INFO = 2
RTEXT_FILTER_BRVLAN = 2
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
# IF_OPER_* by value, as pyroute2 names them
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")

_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, port id
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, protocol,
#                                        scope, type, flags
_RTNH = struct.Struct("=HBBi")  # rtnexthop: length, flags, hops, ifindex
TCMSG = struct.Struct("=BxHiIII")  # tcmsg: family, pads, ifindex, handle, parent, info
_RTA = struct.Struct("=HH")  # rtattr: length, type
_ERRNO = struct.Struct("=i")
_U32 = struct.Struct("=I")
_VLAN_INFO = struct.Struct("=HH")  # struct bridge_vlan_info: flags, vid


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, value: bytes) -> bytes:
    """One rtattr, padded (nest: attr(type, attr(...) + attr(...)))."""
    size = _RTA.size + len(value)
    return _RTA.pack(size, kind) + value + b"\0" * (_align(size) - size)


def attrs(data: bytes, offset: int) -> dict[int, bytes]:
    """The rtattrs from `offset` on: type -> payload (the first of a type)."""
    out: dict[int, bytes] = {}
    while offset + _RTA.size <= len(data):
        size, kind = _RTA.unpack_from(data, offset)
        if size < _RTA.size:
            break
        out.setdefault(kind, data[offset + _RTA.size:offset + size])
        offset += _align(size)
    return out


def attr_list(data: bytes, offset: int = 0) -> list[tuple[int, bytes]]:
    """Every rtattr from `offset` on, in order, types without the nested/byte-order flags."""
    out: list[tuple[int, bytes]] = []
    while offset + _RTA.size <= len(data):
        size, kind = _RTA.unpack_from(data, offset)
        if size < _RTA.size:
            break
        out.append((kind & NLA_TYPE_MASK, data[offset + _RTA.size:offset + size]))
        offset += _align(size)
    return out


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The netlink messages in one datagram, as (type, sequence number, payload)."""
    offset = 0
    while offset + _HDR.size <= len(data):
        size, mtype, _, seq, _ = _HDR.unpack_from(data, offset)
        if size < _HDR.size:
            return
        yield mtype, seq, data[offset + _HDR.size:offset + size]
        offset += _align(size)


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(payload: bytes) -> dict[str, Any]:
    """An RTM_NEWLINK payload as the fields of links.Link, read as pyroute2 reads them."""
    _, _, index, flags, _ = IFINFO.unpack_from(payload)
    nla = attrs(payload, IFINFO.size)
    info = attrs(nla.get(IFLA_LINKINFO, b""), 0)
    port_state = None
    slave = info.get(IFLA_INFO_SLAVE_DATA)
    slave_kind = _text(info.get(IFLA_INFO_SLAVE_KIND) or info.get(IFLA_INFO_KIND, b""))
    if slave is not None and slave_kind in ("bridge", "bridge_slave"):
        state = attrs(slave, 0).get(IFLA_BRPORT_STATE)
        port_state = state[0] if state else None
    mac = nla.get(IFLA_ADDRESS)
    oper = nla.get(IFLA_OPERSTATE)
    return {
        "name": _text(nla[IFLA_IFNAME]) if IFLA_IFNAME in nla else None,
        "index": index,
        "mac": ":".join(f"{b:02x}" for b in mac[:6].ljust(6, b"\0")) if mac else "",
        "mtu": _U32.unpack_from(nla[IFLA_MTU])[0] if IFLA_MTU in nla else 0,
        "kind": _text(info.get(IFLA_INFO_KIND, b"")),
        "master": _U32.unpack_from(nla[IFLA_MASTER])[0] if IFLA_MASTER in nla else 0,
        "up": bool(flags & IFF_UP),
        "promisc": bool(flags & 0x100),
        "operstate": OPERSTATES[oper[0]] if oper and oper[0] < len(OPERSTATES) else "",
        "peer_index": _U32.unpack_from(nla[IFLA_LINK])[0] if IFLA_LINK in nla else 0,
        "port_state": port_state,
    }


# --- requests: (type, flags, body), byte for byte what pyroute2 sent for the same call ----------
# (tests/test_rtnl_encoding.py keeps pyroute2 as the oracle). Each validates its input: a name,
# MAC or address that cannot be encoded is a ValueError, never a malformed message.

Request = tuple[int, int, bytes]
_CREATE = NLM_F_CREATE | NLM_F_EXCL
_IFNAMSIZ = 16


def _ifname(name: str) -> bytes:
    raw = name.encode()
    if not 0 < len(raw) < _IFNAMSIZ or b"\0" in raw:
        raise ValueError(f"not an interface name: {name!r}")
    return attr(IFLA_IFNAME, raw + b"\0")


def _mac(mac: str) -> bytes:
    octets = mac.replace("-", ":").split(":")
    if len(octets) != 6 or not all(len(o) == 2 for o in octets):
        raise ValueError(f"not a MAC address: {mac!r}")
    return bytes(int(o, 16) for o in octets)


def _u32(kind: int, value: int) -> bytes:
    return attr(kind, _U32.pack(value))


def _kind(kind: str, data: bytes = b"") -> bytes:
    """IFLA_LINKINFO: the kind, and its IFLA_INFO_DATA if any."""
    info = attr(IFLA_INFO_KIND, kind.encode() + b"\0")
    return attr(IFLA_LINKINFO, info + (attr(IFLA_INFO_DATA, data) if data else b""))


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0, family: int = 0) -> bytes:
    return IFINFO.pack(family, 0, index, flags, change)


def link_add_bridge(name: str, mtu: int = 0, vlan_filtering: bool = False) -> Request:
    """ip link add NAME [mtu MTU] type bridge [vlan_filtering 1]."""
    data = attr(IFLA_BR_VLAN_FILTERING, b"\1") if vlan_filtering else b""
    body = _ifinfo() + _ifname(name) + (_u32(IFLA_MTU, mtu) if mtu else b"") + \
        _kind("bridge", data)
    return RTM_NEWLINK, _CREATE, body


def link_add_veth(name: str, peer: str, peer_ns_fd: int, mtu: int = 0,
                  peer_mac: str = "") -> Request:
    """A veth pair, txqueuelen 0 on both ends, the peer made directly in the namespace of
    `peer_ns_fd`; MTU on both ends when given, the peer's MAC when given."""
    mtu_attr = _u32(IFLA_MTU, mtu) if mtu else b""
    peer_body = _ifinfo() + _ifname(peer) + _u32(IFLA_NET_NS_FD, peer_ns_fd) + \
        _u32(IFLA_TXQLEN, 0) + (attr(IFLA_ADDRESS, _mac(peer_mac)) if peer_mac else b"") + \
        mtu_attr
    body = _ifinfo() + _ifname(name) + _u32(IFLA_TXQLEN, 0) + mtu_attr + \
        _kind("veth", attr(VETH_INFO_PEER, peer_body))
    return RTM_NEWLINK, _CREATE, body


def link_add_ifb(name: str, mtu: int) -> Request:
    """ip link add NAME mtu MTU txqueuelen 0 type ifb (the MTU always sent, 0 included)."""
    body = _ifinfo() + _ifname(name) + _u32(IFLA_MTU, mtu) + _u32(IFLA_TXQLEN, 0) + \
        _kind("ifb")
    return RTM_NEWLINK, _CREATE, body


def link_set_up_alias(index: int, alias: str) -> Request:
    """ip link set INDEX up alias ALIAS, in one request."""
    return RTM_NEWLINK, 0, _ifinfo(index, IFF_UP, IFF_UP) + attr(IFLA_IFALIAS,
                                                                 alias.encode() + b"\0")


def link_set_flags(index: int, flags: int, change: int) -> Request:
    """Set the `change` bits of the link's flags to those of `flags` (IFF_UP, IFF_PROMISC)."""
    return RTM_NEWLINK, 0, _ifinfo(index, flags, change)


def link_set_master(index: int, master: int) -> Request:
    return RTM_NEWLINK, 0, _ifinfo(index) + _u32(IFLA_MASTER, master)


def link_set_mac(index: int, mac: str) -> Request:
    return RTM_NEWLINK, 0, _ifinfo(index) + attr(IFLA_ADDRESS, _mac(mac))


def link_del(index: int) -> Request:
    return RTM_DELLINK, 0, _ifinfo(index)


def brport_set(index: int, option: int, value: int) -> Request:
    """One u8 bridge port option (IFLA_BRPORT_MODE: hairpin, IFLA_BRPORT_ISOLATED). pyroute2
    names the kind "bridge_slave" in IFLA_INFO_KIND, and the kernel takes it so."""
    info = attr(IFLA_INFO_KIND, b"bridge_slave\0") + \
        attr(IFLA_INFO_SLAVE_DATA, attr(option, bytes([value])))
    return RTM_NEWLINK, 0, _ifinfo(index) + attr(IFLA_LINKINFO, info)


def bridge_vlan_add(index: int, vid: int, flags: int) -> Request:
    """One VLAN on bridge port `index` (flags: BRIDGE_VLAN_INFO_PVID, _UNTAGGED), as pyroute2's
    vlan_filter("add") sent it: RTM_SETLINK of family AF_BRIDGE."""
    return RTM_SETLINK, 0, _bridge_vlan(index, vid, flags)


def bridge_vlan_del(index: int, vid: int) -> Request:
    return RTM_DELLINK, 0, _bridge_vlan(index, vid, 0)


def _bridge_vlan(index: int, vid: int, flags: int) -> bytes:
    if not (0 <= vid <= 0xFFFF and 0 <= flags <= 0xFFFF):
        raise ValueError(f"vlan {vid} (flags {flags}) does not fit bridge_vlan_info")
    spec = attr(IFLA_BRIDGE_VLAN_INFO, _VLAN_INFO.pack(flags, vid))
    return _ifinfo(index, family=AF_BRIDGE) + attr(IFLA_AF_SPEC, spec)


def bridge_vlans_dump() -> Request:
    """Every bridge port with its VLANs (pyroute2's get_vlans)."""
    body = _ifinfo(family=AF_BRIDGE) + _u32(IFLA_EXT_MASK, RTEXT_FILTER_BRVLAN)
    return RTM_GETLINK, NLM_F_DUMP, body


def bridge_vlans_of(replies: list[tuple[int, bytes]], index: int) -> list[tuple[int, int]]:
    """(flags, vid) of each VLAN of port `index` in a bridge_vlans_dump's replies."""
    out = []
    for mtype, payload in replies:
        if mtype != RTM_NEWLINK or IFINFO.unpack_from(payload)[2] != index:
            continue
        spec = dict(attr_list(payload, IFINFO.size)).get(IFLA_AF_SPEC, b"")
        out += [_VLAN_INFO.unpack_from(value) for kind, value in attr_list(spec)
                if kind == IFLA_BRIDGE_VLAN_INFO and len(value) >= _VLAN_INFO.size]
    return out


def _ifaddr(index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> bytes:
    family = socket.AF_INET if iface.version == 4 else socket.AF_INET6
    return IFADDR.pack(family, iface.network.prefixlen, 0, 0, index) + \
        attr(IFA_ADDRESS, iface.ip.packed)


def addr_add(index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
             broadcast: ipaddress.IPv4Address | None = None, flags: int = 0) -> Request:
    """ip addr add; IPv4 gets IFA_LOCAL too (the kernel's `ip addr add` shape)."""
    body = _ifaddr(index, iface)
    if broadcast is not None:
        body += attr(IFA_BROADCAST, broadcast.packed)
    if iface.version == 4:
        body += attr(IFA_LOCAL, iface.ip.packed)
    if flags:
        body += _u32(IFA_FLAGS, flags)
    return RTM_NEWADDR, _CREATE, body


def addr_del(index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> Request:
    body = _ifaddr(index, iface)
    if iface.version == 4:
        body += attr(IFA_LOCAL, iface.ip.packed)
    return RTM_DELADDR, 0, body


def route_append(dst: ipaddress.IPv4Network | ipaddress.IPv6Network, oif: int,
                 gateway: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None, *,
                 proto: int, metrics: Mapping[int, int] | None = None, priority: int = 0,
                 table: int | None = None, scope: int = 0) -> Request:
    """A unicast route, appended (NLM_F_APPEND: ECMP with an existing one). A default route
    carries no RTA_DST; a table in RTA_TABLE, and in the header only from 1 to 254 (main
    otherwise, as pyroute2 sent it)."""
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    if gateway is not None and gateway.version != dst.version:
        raise ValueError(f"gateway {gateway} is not of the family of {dst}")
    header_table = table if table is not None and 0 < table < 255 else RT_TABLE_MAIN
    body = RTMSG.pack(family, dst.prefixlen, 0, 0, header_table, proto, scope, RTN_UNICAST, 0)
    if dst.prefixlen:
        body += attr(RTA_DST, dst.network_address.packed)
    body += _u32(RTA_OIF, oif)
    if gateway is not None:
        body += attr(RTA_GATEWAY, gateway.packed)
    if metrics:
        body += attr(RTA_METRICS, b"".join(_u32(k, v) for k, v in metrics.items()))
    if priority:
        body += _u32(RTA_PRIORITY, priority)
    if table is not None:
        body += _u32(RTA_TABLE, table)
    return RTM_NEWROUTE, NLM_F_CREATE | NLM_F_APPEND, body


def route_get(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Request:
    """ip route get ADDRESS."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    body = RTMSG.pack(family, address.max_prefixlen, 0, 0, RT_TABLE_MAIN, 0, 0, 0, 0) + \
        attr(RTA_DST, address.packed)
    return RTM_GETROUTE, 0, body


def route_oif(replies: list[tuple[int, bytes]]) -> int | None:
    """RTA_OIF of the first route among a route_get's replies."""
    for mtype, payload in replies:
        if mtype == RTM_NEWROUTE:
            oif = attrs(payload, RTMSG.size).get(RTA_OIF)
            return _U32.unpack_from(oif)[0] if oif else None
    return None


class Rtnl:
    """A NETLINK_ROUTE socket: its own (made in the namespace this thread is in), or one it
    borrows (nlsocket.py's, with sequence numbers apart from pyroute2's)."""

    def __init__(self, sock: socket.socket | None = None, seq: int = 0) -> None:
        self.own = sock is None
        self.sock = sock or socket.socket(socket.AF_NETLINK,
                                          socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                          socket.NETLINK_ROUTE)
        self.seq = seq

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.own:
            self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one request; its reply messages as (type, payload). A dump reads to DONE,
        anything else asks for an ACK; a netlink error is OSError(errno)."""
        self.seq += 1
        # A dump has both of its bits (NLM_F_EXCL of a NEW request is NLM_F_MATCH's bit).
        flags |= NLM_F_REQUEST | (0 if flags & NLM_F_DUMP == NLM_F_DUMP else NLM_F_ACK)
        self.sock.send(_HDR.pack(_HDR.size + len(body), kind, flags, self.seq, 0) + body)
        out: list[tuple[int, bytes]] = []
        while True:
            for mtype, seq, payload in messages(self.sock.recv(1 << 16)):
                if seq != self.seq:
                    continue  # a late answer to something else: not ours
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    err = -_ERRNO.unpack_from(payload)[0]
                    if err:
                        raise OSError(err, f"netlink: {os.strerror(err)}")
                    return out  # the ACK
                out.append((mtype, payload))

    def link(self, name: str) -> tuple[int, int]:
        """(index, flags) of the link called `name`."""
        body = IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, name.encode() + b"\0")
        for mtype, payload in self.request(RTM_GETLINK, 0, body):
            if mtype == RTM_NEWLINK:
                _, _, index, flags, _ = IFINFO.unpack_from(payload)
                return index, flags
        raise OSError(19, f"netlink: no link {name!r}")  # ENODEV

    def link_fields(self, name: str | None = None, index: int = 0) -> dict[str, Any] | None:
        """The link called `name` (or with `index`) as parse_link reads it; None if missing."""
        body = IFINFO.pack(0, 0, index, 0, 0)
        if name is not None:
            body += attr(IFLA_IFNAME, name.encode() + b"\0")
        try:
            replies = self.request(RTM_GETLINK, 0, body)
        except OSError as e:
            if e.errno == errno.ENODEV:
                return None
            raise
        return next((parse_link(p) for t, p in replies if t == RTM_NEWLINK), None)

    def link_dump(self) -> list[tuple[dict[str, Any], str]]:
        """Every link of the namespace as parse_link reads it, with its IFLA_IFALIAS ("" if
        none)."""
        found = []
        for mtype, payload in self.request(RTM_GETLINK, NLM_F_DUMP, IFINFO.pack(0, 0, 0, 0, 0)):
            if mtype == RTM_NEWLINK:
                alias = attrs(payload, IFINFO.size).get(IFLA_IFALIAS, b"")
                found.append((parse_link(payload), _text(alias)))
        return found

    def set_up(self, index: int, up: bool) -> None:
        self.request(*link_set_flags(index, IFF_UP if up else 0, IFF_UP))

    def addresses(self, index: int) -> list[str]:
        """The link's addresses as 'ip/prefix', v4 first, each family in the kernel's order."""
        found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
        for _, payload in self.request(RTM_GETADDR, NLM_F_DUMP, IFADDR.pack(0, 0, 0, 0, 0)):
            family, prefixlen, _, _, ifindex = IFADDR.unpack_from(payload)
            address = attrs(payload, IFADDR.size).get(IFA_ADDRESS)
            if ifindex == index and family in found and address is not None:
                found[family].append(f"{socket.inet_ntop(family, address)}/{prefixlen}")
        return found[socket.AF_INET] + found[socket.AF_INET6]

    def address_entries(self, index: int, family: int) -> list[tuple[str, int, int]]:
        """The link's addresses of `family` as (IFA_ADDRESS, prefixlen, flags): IFA_FLAGS if
        the kernel sent it, else ifaddrmsg's 8 bits (as pyroute2's readers took them)."""
        found = []
        for _, payload in self.request(RTM_GETADDR, NLM_F_DUMP,
                                       IFADDR.pack(family, 0, 0, 0, 0)):
            rt_family, prefixlen, flags, _, ifindex = IFADDR.unpack_from(payload)
            nla = attrs(payload, IFADDR.size)
            address = nla.get(IFA_ADDRESS)
            if ifindex != index or rt_family != family or address is None:
                continue
            if nla.get(IFA_FLAGS):
                flags = _U32.unpack_from(nla[IFA_FLAGS])[0]
            found.append((socket.inet_ntop(family, address), prefixlen, flags))
        return found

    def routes(self, family: int) -> list[tuple[int, str | None, list[str]]]:
        """Every route of `family` in every table, as (dst_len, dst, gateways): the gateways of
        RTA_GATEWAY and of each RTA_MULTIPATH hop, as pyroute2 reads them."""
        found = []
        for mtype, payload in self.request(RTM_GETROUTE, NLM_F_DUMP,
                                           RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
            if mtype != RTM_NEWROUTE:
                continue
            rt_family, dst_len = RTMSG.unpack_from(payload)[:2]
            if rt_family != family:
                continue
            nla = attrs(payload, RTMSG.size)
            dst = nla.get(RTA_DST)
            gateways = [nla[RTA_GATEWAY]] if nla.get(RTA_GATEWAY) else []
            hops, at = nla.get(RTA_MULTIPATH, b""), 0
            while at + _RTNH.size <= len(hops):
                size = _RTNH.unpack_from(hops, at)[0]
                if size < _RTNH.size:
                    break
                gateway = attrs(hops[at:at + size], _RTNH.size).get(RTA_GATEWAY)
                if gateway:
                    gateways.append(gateway)
                at += _align(size)
            found.append((dst_len, socket.inet_ntop(family, dst) if dst else None,
                          [socket.inet_ntop(family, g) for g in gateways]))
        return found

    def qdiscs(self, index: int) -> list[tuple[int, str, dict[int, bytes]]]:
        """The link's qdiscs as (parent, kind, options by type). The kernel dumps every link's:
        kept only those of `index`, unparsed beyond their kind for the others."""
        found = []
        body = TCMSG.pack(0, 0, index, 0, 0, 0)
        for mtype, payload in self.request(RTM_GETQDISC, NLM_F_DUMP, body):
            _, _, ifindex, _, parent, _ = TCMSG.unpack_from(payload)
            if mtype != RTM_NEWQDISC or ifindex != index:
                continue
            nla = dict(attr_list(payload, TCMSG.size))
            found.append((parent, _text(nla.get(TCA_KIND, b"")),
                          dict(attr_list(nla.get(TCA_OPTIONS, b"")))))
        return found

    def filter_redirects(self, index: int, parent: int) -> list[list[int]]:
        """The link's filters under `parent` (one per message the kernel dumps), each as the
        ifindexes its mirred actions send to."""
        found = []
        body = TCMSG.pack(0, 0, index, 0, parent, 0)
        for mtype, payload in self.request(RTM_GETTFILTER, NLM_F_DUMP, body):
            if mtype != RTM_NEWTFILTER:
                continue
            targets: list[int] = []
            found.append(targets)
            options = dict(attr_list(payload, TCMSG.size)).get(TCA_OPTIONS, b"")
            for _, action in attr_list(dict(attr_list(options)).get(TCA_U32_ACT, b"")):
                act = dict(attr_list(action))
                if _text(act.get(TCA_ACT_KIND, b"")) != "mirred":
                    continue
                parms = dict(attr_list(act.get(TCA_ACT_OPTIONS, b""))).get(TCA_MIRRED_PARMS)
                if parms is not None and len(parms) >= _MIRRED_IFINDEX + 4:
                    targets.append(_U32.unpack_from(parms, _MIRRED_IFINDEX)[0])
        return found
