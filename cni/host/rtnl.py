"""A minimal rtnetlink client over a plain socket, stdlib only, for the hottest reads and writes.

loopback runs in every pod and makes three requests (look lo up, set it up, list its addresses).
Through pyroute2 that costs its import (~200 ms without the daemon) and ~4 ms of CPU per request
in the daemon; here it is a few struct packs and three round trips. Reading a link (links.get,
nine times in a bridge ADD) costs ~1 ms of CPU in pyroute2's decoder, ~0.07 ms here: SyncIPRoute
does it with this client on its own socket. The same for bandwidth's tc reads (qdiscs, redirect
filters): pyroute2 decoded every qdisc of the host for each (~half of a bandwidth CHECK).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Any

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_GETADDR = 22
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
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
IFLA_INFO_SLAVE_KIND = 4
IFLA_INFO_SLAVE_DATA = 5
IFLA_BRPORT_STATE = 1
IFA_ADDRESS = 1
IFF_UP = 0x1
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTA_DST = 1
RTA_GATEWAY = 5
RTA_MULTIPATH = 9
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
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
# IF_OPER_* by value, as pyroute2 names them
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")

_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, port id
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, protocol,
#                                        scope, type, flags
_RTNH = struct.Struct("=HBBi")  # rtnexthop: length, flags, hops, ifindex
TCMSG = struct.Struct("=BxHiIII")  # tcmsg: family, pads, ifindex, handle, parent, info
_RTA = struct.Struct("=HH")  # rtattr: length, type
_ERRNO = struct.Struct("=i")
_U32 = struct.Struct("=I")


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


class Rtnl:
    """A NETLINK_ROUTE socket: its own (made in the namespace this thread is in), or one it
    borrows (SyncIPRoute's, with sequence numbers apart from pyroute2's)."""

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
            data = self.sock.recv(1 << 16)
            offset = 0
            while offset + _HDR.size <= len(data):
                size, mtype, _, seq, _ = _HDR.unpack_from(data, offset)
                if size < _HDR.size:
                    break
                payload = data[offset + _HDR.size:offset + size]
                offset += _align(size)
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

    def set_up(self, index: int, up: bool) -> None:
        self.request(RTM_NEWLINK, 0, IFINFO.pack(0, 0, index, IFF_UP if up else 0, IFF_UP))

    def addresses(self, index: int) -> list[str]:
        """The link's addresses as 'ip/prefix', v4 first, each family in the kernel's order."""
        found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
        for _, payload in self.request(RTM_GETADDR, NLM_F_DUMP, _IFADDR.pack(0, 0, 0, 0, 0)):
            family, prefixlen, _, _, ifindex = _IFADDR.unpack_from(payload)
            address = attrs(payload, _IFADDR.size).get(IFA_ADDRESS)
            if ifindex == index and family in found and address is not None:
                found[family].append(f"{socket.inet_ntop(family, address)}/{prefixlen}")
        return found[socket.AF_INET] + found[socket.AF_INET6]

    def routes(self, family: int) -> list[tuple[int, str | None, list[str]]]:
        """Every route of `family` in every table, as (dst_len, dst, gateways): the gateways of
        RTA_GATEWAY and of each RTA_MULTIPATH hop, as pyroute2 reads them."""
        found = []
        for mtype, payload in self.request(RTM_GETROUTE, NLM_F_DUMP,
                                           _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
            if mtype != RTM_NEWROUTE:
                continue
            rt_family, dst_len = _RTMSG.unpack_from(payload)[:2]
            if rt_family != family:
                continue
            nla = attrs(payload, _RTMSG.size)
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
