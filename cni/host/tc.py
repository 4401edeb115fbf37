"""Traffic control over netlink: tbf root qdiscs, the ingress qdisc, a u32 redirect to an ifb.

The tbf numbers follow the reference bandwidth plugin (vishvananda/netlink) exactly, so the
kernel holds the same rate, limit and buffer for the same input:
    rate_B = rate_bits // 8, burst_B = burst_bits // 8
    buffer = trunc(trunc(burst_B * 1e6 / rate_B) us * tick_in_usec)   (psched ticks)
    limit  = trunc(rate_B * 25 ms / 1e6) + burst_B                      (bytes)
tick_in_usec comes from /proc/net/psched as netlink's initClock reads it. We build the tbf
message ourselves (pyroute2's tbf helper recomputes the buffer and has no TCA_TBF_RATE64), and send
no rate table, as the reference does not.
"""

from __future__ import annotations

import errno
import struct
import sys
from typing import TYPE_CHECKING, NamedTuple

from cni.host import lean_pyroute2, rtnl
from cni.host.rtnl import Rtnl

if TYPE_CHECKING:
    from pyroute2 import IPRoute

lean_pyroute2.install()  # pyroute2 is imported below by submodule only (see lean_pyroute2)

TIME_UNITS_PER_SEC = 1_000_000
LATENCY_USEC = 25_000.0  # the reference's fixed 25 ms
U32_MAX = 2**32 - 1
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
TBF_HANDLE = 0x10000  # 1:
INGRESS_HANDLE = 0xFFFF0000  # ffff:
ETH_P_ALL = 0x0003
REDIRECT_CLASSID = 0x10001  # 1:1, as the reference's u32 filter


class Tbf(NamedTuple):
    """What CHECK compares: rate in bytes/s, limit in bytes, buffer in psched ticks."""

    rate: int
    limit: int
    buffer: int


def tick_in_usec(psched: str | None = None) -> float:
    """Ticks per microsecond, as vishvananda/netlink computes it (1.0 if psched is unreadable)."""
    if psched is None:
        try:
            with open("/proc/net/psched") as f:
                psched = f.read()
        except OSError:
            return 1.0
    try:
        t2us, us2t, clock_res = (int(v, 16) for v in psched.split()[:3])
    except ValueError:
        return 1.0
    if clock_res == 1_000_000_000:  # netlink's compatibility branch
        t2us = us2t
    return t2us / us2t * (clock_res / TIME_UNITS_PER_SEC)


def tbf_for(rate_bits: int, burst_bits: int, ticks: float | None = None) -> Tbf:
    """The reference's tbf numbers for a rate (bits/s) and a burst (bits)."""
    ticks = tick_in_usec() if ticks is None else ticks
    rate, burst = rate_bits // 8, burst_bits // 8
    if rate <= 0 or burst <= 0:
        raise ValueError(f"tbf needs a rate and a burst of at least 8 bits ({rate_bits}, "
                         f"{burst_bits})")
    usec = int(burst * TIME_UNITS_PER_SEC / rate)
    buffer = int(usec * ticks)
    limit = int(rate * LATENCY_USEC / TIME_UNITS_PER_SEC) + burst
    if buffer > U32_MAX or limit > U32_MAX:
        raise ValueError(f"burst {burst_bits} bits at rate {rate_bits} bits/s gives a tbf "
                         f"buffer of {usec} us, beyond what tbf can hold")
    return Tbf(rate=rate, limit=limit, buffer=buffer)




# The writes are built with rtnl.py, byte for byte what pyroute2 sent for them
# (tests/test_tc_encoding.py compares): its encoder cost ~0.5-1 ms of CPU a message.
_CREATE = rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL
_TBF_QOPT = struct.Struct("=BBHhHI12xIII")  # tc_tbf_qopt: rate (tc_ratespec), peakrate, limit,
#                                              buffer, mtu
_MIRRED = struct.Struct("=IIiiiiI")  # tc_mirred: index, capab, action, refcnt, bindcnt, eaction,
#                                      ifindex
_U32_SEL = struct.Struct("=BBBBHHhhIIIii")  # tc_u32_sel (flags, offshift, nkeys, pad, offmask,
#                                              off, offoff, hoff, hmask) and its one tc_u32_key
TC_ACT_STOLEN = 4
TCA_EGRESS_REDIR = 1
TC_U32_TERMINAL = 1
_U32_CLASSID, _U32_SEL_ATTR, _U32_ACT = 1, 5, 7  # TCA_U32_*


def _qdisc(ipr: IPRoute, index: int, handle: int, parent: int, kind: bytes,
           options: bytes = b"") -> None:
    body = rtnl.TCMSG.pack(0, 0, index, handle, parent, 0) + rtnl.attr(rtnl.TCA_KIND, kind)
    if options:
        body += rtnl.attr(rtnl.TCA_OPTIONS, options)
    ipr.request_raw(rtnl.RTM_NEWQDISC, _CREATE, body)


def add_tbf(ipr: IPRoute, index: int, tbf: Tbf) -> None:
    """tbf as the root qdisc (handle 1:) of the link; fails if a root qdisc of ours exists."""
    rate = tbf.rate & U32_MAX
    # cell_log 3 and cell_align -1: what tc (and pyroute2) compute for a rate table at MTU 1600;
    # no table is sent, the kernel keeps them as given.
    cell_log, cell_align = (3, -1) if rate else (0, 0)
    options = rtnl.attr(_TBF_PARMS, _TBF_QOPT.pack(cell_log, 0, 0, cell_align, 0, rate,
                                                   tbf.limit, tbf.buffer, 0))
    if tbf.rate > U32_MAX:
        options += rtnl.attr(_TBF_RATE64, _U64.pack(tbf.rate))
    _qdisc(ipr, index, TBF_HANDLE, TC_H_ROOT, b"tbf\0", options)


def read_tbf(ipr: IPRoute, index: int) -> Tbf | None:
    """The root tbf of the link as the kernel reports it, or None if the root is not tbf."""
    return _raw_tbf(ipr.raw, index)  # the socket's rtnl.py reader, not pyroute2's decoder


_TBF_PARMS, _TBF_RATE64 = 1, 4  # TCA_TBF_*
_U32, _U64 = struct.Struct("=I"), struct.Struct("=Q")


def _raw_tbf(raw: Rtnl, index: int) -> Tbf | None:
    """read_tbf over rtnl.py: struct tc_tbf_qopt is rate (a tc_ratespec, its u32 rate at
    8), peakrate, limit (at 24), buffer (at 28), mtu; a rate64 attribute overrides the rate."""
    for parent, kind, options in raw.qdiscs(index):
        parms = options.get(_TBF_PARMS)
        if parent != TC_H_ROOT or kind != "tbf" or parms is None or len(parms) < 32:
            continue
        rate64 = options.get(_TBF_RATE64)
        rate = _U64.unpack_from(rate64)[0] if rate64 and len(rate64) >= 8 else 0
        return Tbf(rate=rate or _U32.unpack_from(parms, 8)[0],
                   limit=_U32.unpack_from(parms, 24)[0], buffer=_U32.unpack_from(parms, 28)[0])
    return None


def root_kind(ipr: IPRoute, index: int) -> str | None:
    return next((kind for parent, kind, _ in ipr.raw.qdiscs(index) if parent == TC_H_ROOT),
                None)


def has_ingress(ipr: IPRoute, index: int) -> bool:
    return any(parent == TC_H_INGRESS for parent, _, _ in ipr.raw.qdiscs(index))


def add_ingress(ipr: IPRoute, index: int) -> None:
    """The ingress qdisc (ffff:) on the link."""
    _qdisc(ipr, index, INGRESS_HANDLE, TC_H_INGRESS, b"ingress\0")


def add_redirect(ipr: IPRoute, index: int, target: int) -> None:
    """Match-all u32 filter on the link's ingress: redirect every packet to `target`'s egress
    (prio 1, protocol all, classid 1:1, one key 0x0/0x0 at 0, terminal; mirred egress redirect,
    stolen)."""
    mirred = rtnl.attr(rtnl.TCA_ACT_KIND, b"mirred\0") + rtnl.attr(
        rtnl.TCA_ACT_OPTIONS | rtnl.NLA_F_NESTED,
        rtnl.attr(rtnl.TCA_MIRRED_PARMS,
                  _MIRRED.pack(0, 0, TC_ACT_STOLEN, 0, 0, TCA_EGRESS_REDIR, target)))
    options = (rtnl.attr(_U32_ACT, rtnl.attr(1, mirred))
               + rtnl.attr(_U32_CLASSID, _U32.pack(REDIRECT_CLASSID))
               + rtnl.attr(_U32_SEL_ATTR, _U32_SEL.pack(TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0, 0,
                                                        0, 0, 0, 0)))
    # tcm_info: prio << 16 | the protocol in network byte order (htons)
    info = 1 << 16 | int.from_bytes(ETH_P_ALL.to_bytes(2, "big"), sys.byteorder)
    body = (rtnl.TCMSG.pack(0, 0, index, 0, INGRESS_HANDLE, info)
            + rtnl.attr(rtnl.TCA_KIND, b"u32\0") + rtnl.attr(rtnl.TCA_OPTIONS, options))
    ipr.request_raw(rtnl.RTM_NEWTFILTER, _CREATE, body)


def redirect_targets(ipr: IPRoute, index: int) -> list[int]:
    """Ifindexes the link's ingress filters redirect to (mirred actions)."""
    return [t for f in ipr.raw.filter_redirects(index, INGRESS_HANDLE) for t in f]


def ingress_is_for(ipr: IPRoute, index: int, target: int) -> bool:
    """Whether the link's ingress qdisc belongs to a redirect to `target`: it redirects there,
    or it has no filter at all (an ADD killed between the qdisc and its redirect leaves that)."""
    found = ipr.raw.filter_redirects(index, INGRESS_HANDLE)
    return any(target in f for f in found) if found else has_ingress(ipr, index)



def delete_root(ipr: IPRoute, index: int) -> None:
    """Remove the root qdisc (the kernel puts the default back); none is fine."""
    _ignore_missing(lambda: ipr.request_raw(
        rtnl.RTM_DELQDISC, 0, rtnl.TCMSG.pack(0, 0, index, TBF_HANDLE, TC_H_ROOT, 0)))


def delete_ingress(ipr: IPRoute, index: int) -> None:
    """Remove the ingress qdisc and its filters; none is fine."""
    _ignore_missing(lambda: ipr.request_raw(
        rtnl.RTM_DELQDISC, 0, rtnl.TCMSG.pack(0, 0, index, INGRESS_HANDLE, TC_H_INGRESS, 0)
        + rtnl.attr(rtnl.TCA_KIND, b"ingress\0")))


def _ignore_missing(call) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        call()
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
            raise
