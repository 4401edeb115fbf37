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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cni.host import lean_pyroute2
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


@dataclass(frozen=True)
class Tbf:
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


def _tbf_msg_class() -> type:
    """A tcmsg whose tbf options know TCA_TBF_RATE64 (rates of 2^32 bytes/s and more)."""
    global _TBF_MSG
    if _TBF_MSG is not None:
        return _TBF_MSG
    from pyroute2.netlink import nla
    from pyroute2.netlink.rtnl.tcmsg import sched_tbf, tcmsg

    class tbf_options(nla):
        nla_map = (
            ("TCA_TBF_UNSPEC", "none"),
            ("TCA_TBF_PARMS", "tbf_parms"),
            ("TCA_TBF_RTAB", "hex"),
            ("TCA_TBF_PTAB", "hex"),
            ("TCA_TBF_RATE64", "uint64"),
            ("TCA_TBF_PRATE64", "uint64"),
            ("TCA_TBF_BURST", "uint32"),
            ("TCA_TBF_PBURST", "uint32"),
            ("TCA_TBF_PAD", "hex"),
        )
        tbf_parms = sched_tbf.options.tbf_parms

    class tbfmsg(tcmsg):
        @staticmethod
        def get_options(self, *argv, **kwarg):
            if self.get_attr("TCA_KIND") == "tbf":
                return tbf_options
            return tcmsg.get_options(self, *argv, **kwarg)

    _TBF_MSG = tbfmsg
    return tbfmsg


_TBF_MSG: type | None = None


def _send(ipr: IPRoute, msg: Any, msg_type: int, flags: int) -> None:
    """One request with an ack; a kernel error raises NetlinkError."""
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    # nlm_request_batch consumes the ack and raises on error (the sync nlm_request of
    # pyroute2 0.9.7 trips over a missing status key).
    ipr.nlm_request_batch([msg])


def add_tbf(ipr: IPRoute, index: int, tbf: Tbf) -> None:
    """tbf as the root qdisc (handle 1:) of the link; fails if a root qdisc of ours exists."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    msg = _tbf_msg_class()()
    msg["family"] = 0
    msg["index"] = index
    msg["handle"] = TBF_HANDLE
    msg["parent"] = TC_H_ROOT
    parms = {"rate": tbf.rate & U32_MAX, "peak": 0, "limit": tbf.limit, "buffer": tbf.buffer,
             "mtu": 0}
    options: list[list[Any]] = [["TCA_TBF_PARMS", parms]]
    if tbf.rate > U32_MAX:
        options.append(["TCA_TBF_RATE64", tbf.rate])
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": options}]]
    _send(ipr, msg, RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)


def read_tbf(ipr: IPRoute, index: int) -> Tbf | None:
    """The root tbf of the link as the kernel reports it, or None if the root is not tbf."""
    if hasattr(ipr, "raw"):  # SyncIPRoute: read without pyroute2's decoder (see rtnl.py)
        return _raw_tbf(ipr.raw, index)
    for q in ipr.get_qdiscs(index):
        if q["parent"] != TC_H_ROOT or q.get_attr("TCA_KIND") != "tbf":
            continue
        # Decode again with our class: pyroute2's own drops TCA_TBF_RATE64.
        raw = q.data[q.offset:q.offset + q["header"]["length"]]
        msg = _tbf_msg_class()(raw)
        msg.decode()
        opts = msg.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_TBF_PARMS")
        rate = opts.get_attr("TCA_TBF_RATE64") or parms["rate"]
        return Tbf(rate=rate, limit=parms["limit"], buffer=parms["buffer"])
    return None


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
    if hasattr(ipr, "raw"):
        return next((kind for parent, kind, _ in ipr.raw.qdiscs(index) if parent == TC_H_ROOT),
                    None)
    for q in ipr.get_qdiscs(index):
        if q["parent"] == TC_H_ROOT:
            return q.get_attr("TCA_KIND")
    return None


def has_ingress(ipr: IPRoute, index: int) -> bool:
    if hasattr(ipr, "raw"):
        return any(parent == TC_H_INGRESS for parent, _, _ in ipr.raw.qdiscs(index))
    return any(q["parent"] == TC_H_INGRESS for q in ipr.get_qdiscs(index))


def add_ingress(ipr: IPRoute, index: int) -> None:
    """The ingress qdisc (ffff:) on the link."""
    ipr.tc("add", "ingress", index, INGRESS_HANDLE)


def add_redirect(ipr: IPRoute, index: int, target: int) -> None:
    """Match-all u32 filter on the link's ingress: redirect every packet to `target`'s egress."""
    ipr.tc("add-filter", "u32", index, parent=INGRESS_HANDLE, prio=1, protocol=ETH_P_ALL,
           target=REDIRECT_CLASSID, keys=["0x0/0x0+0"],
           action={"kind": "mirred", "direction": "egress", "action": "redirect",
                   "ifindex": target})


def redirect_targets(ipr: IPRoute, index: int) -> list[int]:
    """Ifindexes the link's ingress filters redirect to (mirred actions)."""
    if hasattr(ipr, "raw"):
        return [t for f in ipr.raw.filter_redirects(index, INGRESS_HANDLE) for t in f]
    return _mirred_targets(ipr.get_filters(index=index, parent=INGRESS_HANDLE))


def ingress_is_for(ipr: IPRoute, index: int, target: int) -> bool:
    """Whether the link's ingress qdisc belongs to a redirect to `target`: it redirects there,
    or it has no filter at all (an ADD killed between the qdisc and its redirect leaves that)."""
    if hasattr(ipr, "raw"):
        found = ipr.raw.filter_redirects(index, INGRESS_HANDLE)
        return any(target in f for f in found) if found else has_ingress(ipr, index)
    filters = list(ipr.get_filters(index=index, parent=INGRESS_HANDLE))
    return target in _mirred_targets(filters) if filters else has_ingress(ipr, index)


def _mirred_targets(filters) -> list[int]:
    targets = []
    for f in filters:
        opts = f.get_attr("TCA_OPTIONS")
        acts = opts.get_attr("TCA_U32_ACT") if opts is not None else None
        for act in (acts.get("attrs", []) if acts is not None else []):
            mirred = act[1].get_attr("TCA_ACT_OPTIONS")
            parms = mirred.get_attr("TCA_MIRRED_PARMS") if mirred is not None else None
            if parms is not None:
                targets.append(parms["ifindex"])
    return targets


def delete_root(ipr: IPRoute, index: int) -> None:
    """Remove the root qdisc (the kernel puts the default back); none is fine."""
    _ignore_missing(lambda: ipr.tc("del", index=index, handle=TBF_HANDLE, parent=TC_H_ROOT))


def delete_ingress(ipr: IPRoute, index: int) -> None:
    """Remove the ingress qdisc and its filters; none is fine."""
    _ignore_missing(lambda: ipr.tc("del", "ingress", index, INGRESS_HANDLE,
                                   parent=TC_H_INGRESS))


def _ignore_missing(call) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        call()
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
            raise
