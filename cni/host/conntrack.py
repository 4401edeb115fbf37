"""Connection tracking: drop UDP entries by original destination port, over netlink.

A UDP "connection" to a hostPort stays in conntrack while the client keeps sending; packets
that match it skip the nat table, so a new DNAT rule never applies to them and a moved hostPort
blackholes (containernetworking/plugins #123, #1190). Deleting the entries makes the next packet
go through the current rules. Works in the caller's current network namespace.

pyroute2's Conntrack: the kernel has no index by port, so a dump walks every bucket of the
conntrack hash table (262144 on a 24 GB machine: ~10 ms); it keeps only UDP entries (the dump's
CTA_FILTER on the protocol, Linux 5.8+), the ports are matched here. A namespace that tracks
nothing is not dumped at all.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Mapping
from typing import Any

IPPROTO_UDP = 17
_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
COUNT = "/proc/sys/net/netfilter/nf_conntrack_count"  # per namespace: the reader's
# Closing a ctnetlink socket that has sent (NETLINK_URELEASE) makes nf_tables flush its pending
# transaction cleanup, which waits for an RCU grace period after any nft commit: 10-30 ms right
# after portmap's own rules went in. A process that answers its request before it is done (the
# daemon's child) keeps its sockets open instead (linger_after_reply): its exit, or
# close_lingering when it serves again, closes them after the reply. Anyone else closes at once.
_lingering: list[Any] | None = None  # pyroute2 Conntrack sockets


def linger_after_reply() -> None:
    """This process replies before it is done: leave the sockets' close until after the reply
    (its exit, or close_lingering)."""
    global _lingering
    if _lingering is None:
        _lingering = []


def forget_inherited() -> None:
    """In a forked child (netns.forget_inherited): its sockets closed at once, the parent's
    lingering ones left to the parent."""
    global _lingering
    from cni.host import netns

    netns.keep_referenced(_lingering)
    _lingering = None


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
    from pyroute2 import Conntrack, NetlinkError

    deleted = 0
    for af, each in wanted.items():
        ct = Conntrack(nfgen_family=af)
        try:
            for entry in _udp_entries(ct, af, each):
                try:
                    ct.entry("del", tuple_orig=entry.tuple_orig, zone=entry.zone)
                    deleted += 1
                except NetlinkError as e:
                    if e.code != errno.ENOENT:
                        raise
        finally:
            if _lingering is None:
                ct.close()
            else:
                _lingering.append(ct)
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


def _udp_entries(ct: Any, af: int, ports: set[int]) -> list[Any]:
    """The UDP entries (pyroute2 ConntrackEntry) of family `af` to `ports`: the kernel keeps
    only UDP in the dump (older kernels ignore the filter; pyroute2 checks the protocol again)."""
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    udp = NFCTAttrTuple(family=af, proto=IPPROTO_UDP)
    return [entry for entry in ct.dump_entries(tuple_orig=udp)
            if entry.tuple_orig.proto == IPPROTO_UDP and entry.tuple_orig.dport in ports]
