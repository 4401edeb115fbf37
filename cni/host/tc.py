"""Traffic control over netlink: tbf root qdiscs, the ingress qdisc, a u32 redirect to an ifb.

The tbf numbers follow the reference bandwidth plugin (vishvananda/netlink) exactly, so the
kernel holds the same rate, limit and buffer for the same input:
    rate_B = rate_bits // 8, burst_B = burst_bits // 8
    buffer = trunc(trunc(burst_B * 1e6 / rate_B) us * tick_in_usec)   (psched ticks)
    limit  = trunc(rate_B * 25 ms / 1e6) + burst_B                      (bytes)
tick_in_usec comes from /proc/net/psched as netlink's initClock reads it. We build the tbf
message with pyroute2's message classes ourselves (its tc("add", "tbf") helper recomputes the
buffer, adds a rate table and has no TCA_TBF_RATE64): tbf_message() is pyroute2's tcmsg whose tbf
options also know TCA_TBF_RATE64, registered on the socket as the RTM_NEWQDISC parser too, so
CHECK reads back a rate above 2^32 bytes/s. No rate table is sent, as the reference sends none
(nor computed: its parms are pyroute2's struct without the table's encoder).
"""

from __future__ import annotations

import errno
import functools
import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

from cni.host import dumps

if TYPE_CHECKING:
    from pyroute2 import IPRoute

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


_TICKS: float | None = None  # the kernel's, once read: its psched constants never change


def tick_in_usec(psched: str | None = None) -> float:
    """Ticks per microsecond, as vishvananda/netlink computes it (1.0 if psched is unreadable).
    /proc/net/psched holds constants of the running kernel (its tick and clock resolution):
    read once per process (a spare's requests after its first one skip the open and read)."""
    global _TICKS
    if psched is None:
        if _TICKS is not None:
            return _TICKS
        try:
            with open("/proc/net/psched") as f:
                text = f.read()
        except OSError:
            return 1.0
        ticks = _ticks(text)
        if ticks is not None:
            _TICKS = ticks
        return 1.0 if ticks is None else ticks
    ticks = _ticks(psched)
    return 1.0 if ticks is None else ticks


def _ticks(psched: str) -> float | None:
    try:
        t2us, us2t, clock_res = (int(v, 16) for v in psched.split()[:3])
    except ValueError:
        return None
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


def max_burst_bits(rate_bits: int, ticks: float | None = None) -> int:
    """The largest burst tbf holds at a rate (_max_burst_bits), remembered for the last few
    rates asked (a node's pods share a few: CHECK and every ADD ask it again)."""
    return _max_burst_bits(rate_bits, tick_in_usec() if ticks is None else ticks)


@functools.lru_cache(maxsize=16)
def _max_burst_bits(rate_bits: int, ticks: float) -> int:
    """The largest burst (bits, a whole number of bytes) whose tbf_for(rate_bits, burst) fits
    tbf's u32 buffer and limit; 0 when even the smallest does not (a rate above ~1.4 Tbit/s
    fills the limit alone).

    Computed, not searched: tbf_for's buffer is trunc(fl(usec * ticks)) with usec =
    trunc(fl(burst * 1e6 / rate)), fl a correctly rounded double operation, both monotone in the
    burst. So the largest usec whose buffer fits is the inverse of the first rounding and the
    largest burst whose usec fits the inverse of the second (_largest), worked in exact
    fractions; the limit is burst + a constant."""
    rate = rate_bits // 8
    if rate <= 0 or ticks <= 0:
        return 0
    usec = _largest(Fraction(ticks), U32_MAX)  # buffer = trunc(fl(usec * ticks)) <= U32_MAX
    by_buffer = _largest(Fraction(TIME_UNITS_PER_SEC, rate), usec)
    by_limit = U32_MAX - int(rate * LATENCY_USEC / TIME_UNITS_PER_SEC)
    return max(min(by_buffer, by_limit), 0) * 8


def _largest(step: Fraction, most: int) -> int:
    """The largest integer n >= 0 with trunc(fl(n * step)) <= most, where fl rounds the exact
    n * step to the nearest double, ties to even (what Python's int / int and a float product
    of exact operands do, and Go's float64 arithmetic in the reference).

    trunc(fl(x)) <= most  <=>  fl(x) < most + 1  <=>  x below the midpoint between most + 1
    and the double under it (or at that midpoint, if the tie goes down to that double)."""
    top = most + 1  # an integer below 2^53: a double exactly
    under = math.nextafter(float(top), 0.0)
    edge = (Fraction(under) + top) / 2
    bound = edge / step
    if float(edge) == under:  # the tie rounds down: x == edge is in
        return math.floor(bound)
    return math.ceil(bound) - 1


_TBF_MSG: type | None = None


def tbf_message() -> type:
    """pyroute2's tcmsg, with tbf options that also know TCA_TBF_RATE64 (and the rest of
    linux/pkt_sched.h's TCA_TBF_*); other kinds' options as pyroute2 knows them."""
    global _TBF_MSG
    if _TBF_MSG is None:
        from pyroute2.netlink import nla
        from pyroute2.netlink.rtnl.tcmsg import sched_tbf, tcmsg

        class tbf_options(nla):  # noqa: N801 - pyroute2's naming of message classes
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

            class tbf_parms(nla):  # noqa: N801
                # pyroute2's struct, encoded as set: its own class computes a 256-entry rate
                # table at each encode, for a TCA_TBF_RTAB we never send (~half of the
                # message's encoding); the bytes are the same (tests/test_bandwidth.py)
                fields = sched_tbf.options.tbf_parms.fields

        class tbfmsg(tcmsg):  # noqa: N801
            # get_plugin, not get_options: pyroute2 compiles a class's NLA table once and a
            # subclass compiled after tcmsg shares tcmsg's (its get_options). get_plugin is
            # looked up on the message at each encode and decode.
            def get_plugin(self, plug: str, *argv: Any, **kwarg: Any) -> Any:
                if plug == "options" and self.get_attr("TCA_KIND") == "tbf":
                    return tbf_options
                return tcmsg.get_plugin(self, plug, *argv, **kwarg)

        _TBF_MSG = tbfmsg
    return _TBF_MSG


def _qdisc(ipr: IPRoute, index: int, parent: int, replies: list[Any] | None = None) -> Any:
    """The link's qdisc at `parent`, tbf options read with tbf_message(); None if none. With
    `replies` (a root_request's, from dumps.together), the qdisc among them, else asked alone."""
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    msg = dumps.qdisc_in(replies, index) if replies else None
    if msg is not None:
        return msg
    ipr.register_policy(RTM_NEWQDISC, tbf_message())
    return dumps.qdisc(ipr, index, parent, tbf_message())


def root_request(ipr: IPRoute, index: int) -> Any:
    """The read of the link's root qdisc, for dumps.together: its replies go to read_tbf or
    root_kind as `replies` (the socket reads tbf options as they do)."""
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    ipr.register_policy(RTM_NEWQDISC, tbf_message())
    return dumps.qdisc_request(index, TC_H_ROOT, tbf_message())


def filters_request(index: int) -> Any:
    """The dump of the link's ingress filters, for dumps.together: its replies go to
    redirect_targets or ingress_is_for as `replies`."""
    return dumps.filters_request(index, INGRESS_HANDLE)


def tbf_add_message(index: int, tbf: Tbf) -> Any:
    """tbf as the root qdisc (handle 1:) of the link, for dumps.request or dumps.writes: the
    kernel refuses it (EEXIST) if the link has a root qdisc already."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    rate = tbf.rate & U32_MAX
    # cell_log 3 and cell_align -1: what tc (and pyroute2) compute for a rate table at MTU 1600;
    # no table is sent, the kernel keeps them as given.
    cell_log, cell_align = (3, -1) if rate else (0, 0)
    parms = {"rate_cell_log": cell_log, "rate_cell_align": cell_align, "rate": rate,
             "peak": 0, "limit": tbf.limit, "buffer": tbf.buffer, "mtu": 0}
    options: list[list[Any]] = [["TCA_TBF_PARMS", parms]]
    if tbf.rate > U32_MAX:
        options.append(["TCA_TBF_RATE64", tbf.rate])
    msg = tbf_message()()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, TBF_HANDLE, TC_H_ROOT
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": options}]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return msg


def read_tbf(ipr: IPRoute, index: int, replies: list[Any] | None = None) -> Tbf | None:
    """The root tbf of the link as the kernel reports it, or None if the root is not tbf; a
    rate64 attribute overrides the u32 rate. `replies`: a root_request's (see _qdisc)."""
    msg = _qdisc(ipr, index, TC_H_ROOT, replies)
    options = msg.get_attr("TCA_OPTIONS") if msg is not None else None
    if options is None or msg.get_attr("TCA_KIND") != "tbf":
        return None
    parms = options.get_attr("TCA_TBF_PARMS")
    if parms is None:
        return None
    rate = options.get_attr("TCA_TBF_RATE64") or parms["rate"]
    return Tbf(rate=rate, limit=parms["limit"], buffer=parms["buffer"])


def root_kind(ipr: IPRoute, index: int, replies: list[Any] | None = None) -> str | None:
    msg = _qdisc(ipr, index, TC_H_ROOT, replies)
    return msg.get_attr("TCA_KIND") if msg is not None else None


def has_ingress(ipr: IPRoute, index: int) -> bool:
    return _qdisc(ipr, index, TC_H_INGRESS) is not None


# The requests below are the messages pyroute2's tc() builds for the same calls (the tests
# compare their bytes: tests/test_bandwidth.py), built here as pyroute2's tcmsg with its own
# encoders (cls_u32) and sent with dumps.request or dumps.writes: tc()'s argument processing and
# request filters cost ~0.1 ms a call, and its u32 path computes a policer's rate tables it never
# sends.

def _tcmsg(msg_type: int, flags: int, index: int, handle: int, parent: int,
           attrs: list[list[Any]]) -> Any:
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = tcmsg()
    msg["index"], msg["handle"], msg["parent"] = index, handle, parent
    msg["attrs"] = attrs
    msg["header"]["type"], msg["header"]["flags"] = msg_type, flags
    return msg


def ingress_message(index: int, delete: bool) -> Any:
    """tc("add", "ingress", index, ffff:) or tc("del", "ingress", index, ffff:,
    parent=TC_H_INGRESS)'s request."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_DELQDISC, RTM_NEWQDISC

    if delete:
        msg_type, flags = RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK
    else:
        msg_type, flags = RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _tcmsg(msg_type, flags, index, INGRESS_HANDLE, TC_H_INGRESS,
                  [["TCA_KIND", "ingress"]])


def root_delete_message(index: int) -> Any:
    """tc("del", index=index, handle=1:, parent=TC_H_ROOT)'s request."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_DELQDISC

    return _tcmsg(RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK, index, TBF_HANDLE, TC_H_ROOT, [])


def redirect_message(index: int, target: int) -> Any:
    """The match-all u32 filter on the link's ingress that redirects every packet to
    `target`'s egress (prio 1, protocol all, classid 1:1, one key 0x0/0x0 at 0, terminal;
    mirred egress redirect, stolen): tc("add-filter", "u32", index, parent=ffff:, prio=1,
    protocol=ETH_P_ALL, target=1:1, keys=["0x0/0x0+0"], action=mirred egress redirect to
    `target`)'s request, its options and info field made by pyroute2's cls_u32."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWTFILTER
    from pyroute2.netlink.rtnl.tcmsg import cls_u32

    request = {"prio": 1, "protocol": ETH_P_ALL, "target": REDIRECT_CLASSID,
               "keys": ["0x0/0x0+0"],
               "action": {"kind": "mirred", "direction": "egress", "action": "redirect",
                          "ifindex": target}}
    cls_u32.fix_request(request)  # the info field: prio and protocol
    msg = _tcmsg(RTM_NEWTFILTER, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                 index, 0, INGRESS_HANDLE,
                 [["TCA_KIND", "u32"], ["TCA_OPTIONS", cls_u32.get_parameters(request)]])
    msg["info"] = request["info"]
    return msg


def _filter_redirects(ipr: IPRoute, index: int,
                      replies: list[Any] | None = None) -> list[list[int]]:
    """The link's ingress filters (one per message the kernel dumps), each as the ifindexes its
    mirred actions send to. `replies`: a filters_request's, from dumps.together (none: the
    dump is asked again alone, which finds none or raises the error the batch dropped)."""
    found = []
    for msg in replies or ipr.get_filters(index=index, parent=INGRESS_HANDLE):
        targets: list[int] = []
        found.append(targets)
        options = msg.get_attr("TCA_OPTIONS")
        actions = options.get_attr("TCA_U32_ACT") if options is not None else None
        for name, act in actions["attrs"] if actions is not None else ():
            if name.startswith("TCA_ACT_PRIO_"):  # each action, by its order
                _mirred_targets(act, targets)
    return found


def _mirred_targets(act: Any, targets: list[int]) -> None:
    if act.get_attr("TCA_ACT_KIND") != "mirred":
        return
    options = act.get_attr("TCA_ACT_OPTIONS")
    parms = options.get_attr("TCA_MIRRED_PARMS") if options is not None else None
    if parms is not None:
        targets.append(parms["ifindex"])


def redirect_targets(ipr: IPRoute, index: int, replies: list[Any] | None = None) -> list[int]:
    """Ifindexes the link's ingress filters redirect to (mirred actions). `replies`: see
    _filter_redirects."""
    return [t for f in _filter_redirects(ipr, index, replies) for t in f]


def ingress_is_for(ipr: IPRoute, index: int, target: int,
                   replies: list[Any] | None = None) -> bool:
    """Whether the link's ingress qdisc belongs to a redirect to `target`: it redirects there,
    or it has no filter at all (an ADD killed between the qdisc and its redirect leaves that).
    `replies`: see _filter_redirects."""
    found = _filter_redirects(ipr, index, replies)
    return any(target in f for f in found) if found else has_ingress(ipr, index)


def delete_root(ipr: IPRoute, index: int) -> None:
    """Remove the root qdisc (the kernel puts the default back); none is fine."""
    _ignore_missing(lambda: dumps.request(ipr, root_delete_message(index)))


def delete_ingress(ipr: IPRoute, index: int) -> None:
    """Remove the ingress qdisc and its filters; none is fine."""
    _ignore_missing(lambda: dumps.request(ipr, ingress_message(index, delete=True)))


def delete_qdiscs(ipr: IPRoute, ingress_of: int | None, root_of: int | None) -> None:
    """delete_ingress(ingress_of) and delete_root(root_of), each unless None, in one send
    (dumps.writes): a delete the kernel refused is sent again alone, as those send it, for
    its error (none there is fine, as there)."""
    msgs = [] if ingress_of is None else [ingress_message(ingress_of, delete=True)]
    if root_of is not None:
        msgs.append(root_delete_message(root_of))
    if not msgs:
        return
    for msg, done in zip(msgs, dumps.writes(ipr, msgs), strict=True):
        if done is None:
            _ignore_missing(functools.partial(dumps.request, ipr, msg))


def _ignore_missing(call) -> None:
    from pyroute2 import NetlinkError

    try:
        call()
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
            raise
