"""Connection tracking: drop UDP entries by original destination port, over netlink.

A UDP "connection" to a hostPort stays in conntrack while the client keeps sending; packets
that match it skip the nat table, so a new DNAT rule never applies to them and a moved hostPort
blackholes (containernetworking/plugins #123, #1190). Deleting the entries makes the next packet
go through the current rules. Works in the caller's current network namespace.

Plain ctnetlink over a stdlib socket (rtnl.py's request loop, on a NETLINK_NETFILTER socket):
the kernel has no index by port, so a dump walks every bucket of the conntrack hash table
(262144 on a 24 GB machine: ~10 ms), and pyroute2's Conntrack added ~25 ms of import and ~7 ms
per socket close on top. A namespace that tracks nothing is not dumped at all.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Mapping

from cni.host.rtnl import Rtnl, attr, attr_list

IPPROTO_UDP = 17
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_CTNETLINK = 1
_CT_GET = _NFNL_SUBSYS_CTNETLINK << 8 | 1  # IPCTNL_MSG_CT_GET
_CT_DELETE = _NFNL_SUBSYS_CTNETLINK << 8 | 2  # IPCTNL_MSG_CT_DELETE
_NLM_F_DUMP = 0x300
_NFNETLINK_V0 = 0
_NLA_F_NESTED = 0x8000
# ctattr_type, ctattr_tuple, ctattr_l4proto, ctattr_filter (linux/netfilter/nfnetlink_conntrack.h)
_CTA_TUPLE_ORIG = 1
_CTA_ZONE = 18
_CTA_FILTER = 25
_CTA_TUPLE_PROTO = 2
_CTA_PROTO_NUM = 1
_CTA_PROTO_DST_PORT = 3
_CTA_FILTER_ORIG_FLAGS = 1
_CTA_FILTER_REPLY_FLAGS = 2
_FILTER_PROTO_NUM = 1 << 3  # CTA_FILTER_FLAG(CTA_PROTO_NUM): bit CTA_FILTER_F_CTA_PROTO_NUM
_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
COUNT = "/proc/sys/net/netfilter/nf_conntrack_count"  # per namespace: the reader's
# Closing a ctnetlink socket that has sent (NETLINK_URELEASE) makes nf_tables flush its pending
# transaction cleanup, which waits for an RCU grace period after any nft commit: 10-30 ms right
# after portmap's own rules went in. A process that answers its request before it is done (the
# daemon's child) keeps its sockets open instead (linger_after_reply): its exit, or
# close_lingering when it serves again, closes them after the reply. Anyone else closes at once.
_lingering: list[socket.socket] | None = None


def linger_after_reply() -> None:
    """This process replies before it is done: leave the sockets' close until after the reply
    (its exit, or close_lingering)."""
    global _lingering
    if _lingering is None:
        _lingering = []


def close_lingering() -> None:
    """Close what linger_after_reply kept open (a daemon's child that serves again does so after
    its reply, where its exit would have)."""
    while _lingering:
        _lingering.pop().close()


def delete_udp_dport(ports: Mapping[int, Iterable[int]]) -> int:
    """Delete every UDP entry whose original destination port is in `ports[family]` (family
    4 or 6): a dump per family (the kernel filters on the protocol only within one family).

    Returns how many were deleted; entries that vanish meanwhile are not an error.
    """
    wanted = {_AF[family]: {int(p) for p in each} for family, each in ports.items()}
    wanted = {af: each for af, each in wanted.items() if each}
    if not wanted or not _tracks_anything():
        return 0
    deleted = 0
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                         _NETLINK_NETFILTER)
    try:
        nl = Rtnl(sock)
        for af, each in wanted.items():
            for orig, zone in _udp_entries(nl, af, each):
                try:
                    nl.request(_CT_DELETE, 0, _nfgen(af) + orig + zone)
                    deleted += 1
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise
    finally:
        if _lingering is None:
            sock.close()
        else:
            _lingering.append(sock)
    return deleted


def _tracks_anything() -> bool:
    """False only when this namespace has no conntrack entry (or no conntrack at all: then
    nothing can be stale); unreadable for another reason, dump anyway."""
    try:
        with open(COUNT, "rb") as f:
            return int(f.read()) > 0
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True


def _udp_entries(nl: Rtnl, af: int, ports: set[int]) -> list[tuple[bytes, bytes]]:
    """(CTA_TUPLE_ORIG attribute, CTA_ZONE attribute or b"") of each UDP entry of family `af`
    to `ports`, ready to be sent back in a delete. The kernel (5.8+) keeps only UDP in the
    dump; older kernels ignore the filter, so the protocol is checked here again."""
    proto = attr(_CTA_TUPLE_PROTO | _NLA_F_NESTED, attr(_CTA_PROTO_NUM, bytes([IPPROTO_UDP])))
    flags = (attr(_CTA_FILTER_ORIG_FLAGS, _FILTER_PROTO_NUM.to_bytes(4, "little"))
             + attr(_CTA_FILTER_REPLY_FLAGS, bytes(4)))
    body = (_nfgen(af) + attr(_CTA_TUPLE_ORIG | _NLA_F_NESTED, proto)
            + attr(_CTA_FILTER | _NLA_F_NESTED, flags))
    found = []
    for _mtype, payload in nl.request(_CT_GET, _NLM_F_DUMP, body):
        top = dict(attr_list(payload, 4))
        orig = top.get(_CTA_TUPLE_ORIG)
        if orig is None:
            continue
        l4 = dict(attr_list(dict(attr_list(orig)).get(_CTA_TUPLE_PROTO, b"")))
        dport = l4.get(_CTA_PROTO_DST_PORT, b"")
        if (l4.get(_CTA_PROTO_NUM) == bytes([IPPROTO_UDP]) and len(dport) == 2
                and int.from_bytes(dport, "big") in ports):
            zone = top.get(_CTA_ZONE)
            found.append((attr(_CTA_TUPLE_ORIG | _NLA_F_NESTED, orig),
                          b"" if zone is None else attr(_CTA_ZONE, zone)))
    return found


def _nfgen(af: int) -> bytes:
    """struct nfgenmsg: family, version, res_id (big endian, 0)."""
    return bytes([af, _NFNETLINK_V0, 0, 0])
