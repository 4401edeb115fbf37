"""bandwidth: shape a pod's traffic with tbf, as the reference chained plugin does.

Ingress (toward the pod) is a tbf root qdisc on the host end of the pod's veth. Egress (from the
pod) is redirected from the host veth's ingress qdisc to an ifb `bwp<12 hex>` and shaped by a tbf
root qdisc there. Numbers (rate, limit, buffer) are the reference's: see cni.host.tc.

Where the limits come from (the first source present wins, as a whole):
1. top-level `ingressRate`, `ingressBurst`, `egressRate`, `egressBurst` (the admin's config);
2. `runtimeConfig.bandwidth` with the same keys (capability `bandwidth`);
3. the pod annotations `kubernetes.io/ingress-bandwidth` / `kubernetes.io/egress-bandwidth`
   (Kubernetes quantities in bit/s, kubelet's bounds 1k..1P), from runtimeConfig
   `io.kubernetes.cri.pod-annotations` (capability of the same name).
Rates are bit/s, bursts bits; 0 means unlimited. Sources 1 and 2 are one config model
(`BandwidthEntry`): a rate without a burst (or the reverse) and a burst of 4 GB or more are
config errors naming the key as written and the value, as in the reference.

Burst when only a rate is known: annotations carry no burst, and the runtimes fill
runtimeConfig.bandwidth's bursts with a "no burst given" sentinel built from the annotations:
containerd 4294967295 bits (math.MaxUint32), CRI-O 1.33 34359738359 (math.MaxUint32 * 8 - 1).
Taken literally, the first is a 512 MB bucket that lets a pod run at line rate for seconds and
then stall (reference issue #609) and the second is more than tbf can hold (the reference wraps
it to a ~3 KB queue). Both sentinels in runtimeConfig.bandwidth, and annotations, give a burst of
10 ms worth of the rate, at least 4 MTUs of the host veth.

Any other burst is the config's, validated as the reference does (under 4 GB), and applied
exactly: one that tbf cannot hold at its rate (its u32 buffer of psched ticks, or its u32 limit;
cni.host.tc.max_burst_bits) is refused, code 7 naming the key, the value and the largest burst
tbf holds (the reference wraps it to a different number silently). A derived burst is clamped
to that largest instead (only above ~1 Tbit/s), and the clamp logged.

Each ifb carries the alias `pycni-bandwidth <network> <containerID>` (cni.host.ifb), and each
ingress tbf a record naming its host veth (cni.plugins.shaped), so DEL removes both without
reading the config and GC exactly ours of containers the runtime no longer knows. CHECK without
limits succeeds (reference #1221 crashed there).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

from pydantic import ValidationError, field_validator, model_validator

from cni.host import netns
from cni.host.digest import sha512_hex
from cni.host.errors import HostError
from cni.plugins import shaped
from cni.plugins.undo import Undo
from cni.skel import Request, require_printable, valid_attachments
from cni.spec import keys
from cni.spec.config import Field, Model, StrictInt, parse
from cni.spec.errors import CNIError, Code, invalid_config
from cni.spec.result import Result

KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")
ANNOTATIONS = "io.kubernetes.cri.pod-annotations"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
MIN_ANNOTATED = 1_000  # kubelet: "1k"
MAX_ANNOTATED = 10**15  # kubelet: "1P"
CONTAINERD_NO_BURST = 2**32 - 1  # math.MaxUint32: containerd's burst for a bare rate
CRIO_NO_BURST = (2**32 - 1) * 8 - 1  # math.MaxUint32 * 8 - 1: CRI-O 1.33's
NO_BURST = frozenset({CONTAINERD_NO_BURST, CRIO_NO_BURST})
MAX_BURST_BYTES = 2**32 - 1
DERIVED_BURST_SECONDS = 0.010
DERIVED_BURST_MTUS = 4
IFB_PREFIX = "bwp"


class Direction(NamedTuple):
    """One direction's limit; burst None means 'derive from the rate' (see the docstring)."""

    rate: int
    burst: int | None
    rate_key: str
    burst_key: str

    def burst_bits(self, mtu: int) -> int:
        if self.burst is not None:
            return self.burst
        return derived_burst(self.rate, mtu)


class Limits(NamedTuple):
    ingress: Direction | None
    egress: Direction | None


def derived_burst(rate_bits: int, mtu: int) -> int:
    """10 ms of the rate, at least a few MTUs (bits); _tbf clamps it to what tbf holds."""
    floor = DERIVED_BURST_MTUS * max(mtu, 1500) * 8
    return max(int(rate_bits * DERIVED_BURST_SECONDS), floor)


def ifb_name(network: str, container_id: str) -> str:
    """`bwp` + 12 hex of sha512(network + containerID), the reference's name."""
    return IFB_PREFIX + sha512_hex(network + container_id, 12)


# ---- configuration ---------------------------------------------------------------------------

Bits = Annotated[StrictInt, Field(ge=0, lt=2**64)]  # Go's uint64: a JSON integer, no float


class BandwidthEntry(Model):
    """The four limit keys, as the reference's BandwidthEntry (uint64 each; null means 0), at
    the top level of the config or in runtimeConfig.bandwidth (containerd's CRI sends
    IngressRate etc.: Model finds them however cased)."""

    ingressRate: Bits = 0
    ingressBurst: Bits = 0
    egressRate: Bits = 0
    egressBurst: Bits = 0

    @field_validator(*KEYS, mode="before")
    @classmethod
    def null_is_zero(cls, value: Any) -> Any:
        return 0 if value is None else value

    @model_validator(mode="after")
    def rate_and_burst_together(self) -> BandwidthEntry:
        """The reference's validateRateAndBurst, per direction."""
        for side in ("ingress", "egress"):
            rate_key, burst_key = f"{side}Rate", f"{side}Burst"
            rate, burst = getattr(self, rate_key), getattr(self, burst_key)
            if rate and not burst:
                raise _at(rate_key, rate, f"if rate is set, {burst_key} must also be set")
            if burst and not rate:
                raise _at(burst_key, burst, f"if burst is set, {rate_key} must also be set")
            if burst // 8 >= MAX_BURST_BYTES:
                raise _at(burst_key, burst, "burst cannot be more than 4GB")
        return self


def _at(key: str, value: int, msg: str) -> ValidationError:
    """A ValueError located at `key`: pydantic keeps its location, so config.parse names the key
    as the user wrote it and its value (a plain ValueError would name the whole object)."""
    return ValidationError.from_exception_data(BandwidthEntry.__name__, [
        {"type": "value_error", "loc": (key,), "input": value, "ctx": {"error": msg}}])


def limits(req: Request) -> Limits | None:
    """The limits to apply, from the first source present; None when there are none. The
    config is validated as a BandwidthEntry only when it has one of the four keys (however
    cased): without them that model has nothing to check and no field set, so the runtime's
    come next (CRI-O's and containerd's requests: one validation, not two)."""
    if any(keys.is_one_of(k, KEYS) for k in req.config):
        top = parse(BandwidthEntry, req.config)
        if top.model_fields_set.intersection(KEYS):  # any of the four, even null (not extras)
            return _limits(top, req.config, "", sentinel=False)
    runtime = req.runtime_config
    entry = runtime.get("bandwidth")
    if entry is not None:
        prefix = f"runtimeConfig.{runtime.written('bandwidth')}"
        return _limits(parse(BandwidthEntry, entry, prefix), entry, prefix + ".", sentinel=True)
    return _from_annotations(runtime.get(ANNOTATIONS))


def _limits(conf: BandwidthEntry, data: dict[str, Any], prefix: str, sentinel: bool) -> Limits:
    def direction(side: str) -> Direction | None:
        rate, burst = getattr(conf, f"{side}Rate"), getattr(conf, f"{side}Burst")
        if not rate:
            return None
        rate_key, burst_key = (prefix + keys.written_path(data, [f"{side}{k}"])[0]
                               for k in ("Rate", "Burst"))  # as the user cased them
        chosen = None if sentinel and burst in NO_BURST else burst
        return Direction(rate, chosen, rate_key, burst_key)

    return Limits(direction("ingress"), direction("egress"))


def _from_annotations(annotations: Any) -> Limits | None:
    if annotations is None:
        return None
    if not isinstance(annotations, dict):
        raise invalid_config(f"runtimeConfig.{ANNOTATIONS}", annotations, "must be an object")
    if INGRESS_ANNOTATION not in annotations and EGRESS_ANNOTATION not in annotations:
        return None
    return Limits(_annotated(annotations, INGRESS_ANNOTATION),
                  _annotated(annotations, EGRESS_ANNOTATION))


def _annotated(annotations: dict[str, Any], name: str) -> Direction | None:
    from cni.plugins import quantity

    if name not in annotations:
        return None
    text = annotations[name]
    key = f"annotation {name}"
    try:
        bits = quantity.value(text)
    except quantity.QuantityError as e:
        raise invalid_config(key, text, f"not a Kubernetes quantity: {e}") from None
    if bits < MIN_ANNOTATED:
        raise invalid_config(key, text, "resource is unreasonably small (< 1kbit)")
    if bits > MAX_ANNOTATED:
        raise invalid_config(key, text, "resource is unreasonably large (> 1Pbit)")
    return Direction(bits, None, key, key)


def _tbf(direction: Direction, mtu: int, log: Callable[[str], None], ticks: float):
    """The tbf for a direction. An explicit burst tbf cannot hold at its rate is refused; a
    derived one (ours, from the rate) is clamped to the largest it holds. `ticks`: the
    request's tc.tick_in_usec() (/proc/net/psched, read once for both directions)."""
    from cni.host import tc

    most = tc.max_burst_bits(direction.rate, ticks)
    if most == 0:  # 25 ms of the rate alone overflows tbf's u32 limit (above ~1.37 Tbit/s)
        raise invalid_config(direction.rate_key, direction.rate,
                             "rate too high for tbf: its queue limit would pass 4 GB")
    if direction.burst is not None and direction.burst // 8 > most // 8:
        raise invalid_config(direction.burst_key, direction.burst,
                             f"more than tbf can hold at {direction.rate_key} "
                             f"{direction.rate} bits/s: at most {most} bits (its buffer of "
                             f"clock ticks and its queue limit are 32-bit)")
    burst = direction.burst_bits(mtu)
    if burst // 8 > most // 8:
        log(f"{direction.rate_key} {direction.rate}: derived burst {burst} bits clamped to "
            f"{most}, the largest tbf holds at that rate")
        burst = most
    return tc.tbf_for(direction.rate, burst, ticks)


# ---- the host veth ---------------------------------------------------------------------------

def _require_prev(req: Request) -> Result:
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG,
                       "bandwidth must be called as a chained plugin: prevResult is missing")
    return req.prev_result


def _host_veth(req: Request, prev: Result):
    """The host end of CNI_IFNAME's veth, which prevResult must list without a sandbox."""
    from cni.host import peer

    _require_interfaces(prev)
    veth = peer.host_veth(req.netns_target, req.ifname)  # PeerError: 999, as the reference
    _require_listed(req, prev, veth)
    return veth


# More reads about the host end, by its ifindex (links.get_request, tc.root_request, ...).
Reads = Callable[[Any, int], list[Any]]


def _host_veth_reading(req: Request, prev: Result, also: Reads):
    """_host_veth, with `also(ipr, index)`'s reads (of the host link at the container veth's
    peer index) in one send with the host end's lookup (dumps.together); -> the veth and
    their replies, which are the veth's (its index is that one)."""
    _require_interfaces(prev)
    veth, replies = _peer_reading(req, also)
    _require_listed(req, prev, veth)
    return veth, replies


def _peer_reading(req: Request, also: Reads):
    from cni.host import dumps, links, peer

    container = peer.container_veth(req.netns_target, req.ifname)
    index = container.peer_index
    with netns.iproute() as ipr:
        replies = dumps.together(ipr, [links.get_request(index=index), *also(ipr, index)])
        link = peer.points_back(container, links.by_index(ipr, index, replies[0]))
    return peer.host_veth_of(container, link, req.ifname), replies[1:]


def _require_interfaces(prev: Result) -> None:
    if not prev.get("interfaces"):
        raise CNIError(Code.INVALID_CONFIG, "prevResult has no interfaces: bandwidth needs the "
                       "host veth of the container interface")


def _require_listed(req: Request, prev: Result, veth) -> None:
    host_side = [i.get("name") for i in prev.get("interfaces") or [] if not i.get("sandbox")]
    if veth.name not in host_side:
        raise CNIError(Code.INTERNAL, f"veth peer {veth.name} of container interface "
                       f"{req.ifname} is not among prevResult's host interfaces {host_side}")


# ---- verbs -----------------------------------------------------------------------------------

@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def add(req: Request) -> Result:
    from cni.host import tc

    lim = limits(req)
    if lim is None or (lim.ingress is None and lim.egress is None):
        return req.prev_result or _empty(req)
    prev = _require_prev(req)
    require_printable(prev, req.version)
    veth = _host_veth(req, prev)
    ticks = tc.tick_in_usec()
    ingress = _tbf(lim.ingress, veth.mtu, req.log, ticks) if lim.ingress else None
    egress = _tbf(lim.egress, veth.mtu, req.log, ticks) if lim.egress else None
    result = copy.deepcopy(prev)
    result["interfaces"] = list(result.get("interfaces") or [])
    _apply(req, veth, ingress, egress, result)
    return result


def _empty(req: Request) -> Result:
    return {"cniVersion": req.version, "interfaces": [], "ips": [], "routes": [], "dns": {}}


class _Write(NamedTuple):
    """One of _apply's requests: the step it is (named in an error) and how to take back what
    it made (None: it goes with another step's undo)."""

    what: str
    msg: Any
    undo: Callable[[], Any] | None


class _Failed(Exception):
    """A step failed: its name and pyroute2's error (NetlinkError) or the socket's (OSError)."""


def _apply(req: Request, veth, ingress, egress, result: Result) -> None:
    """Create the qdiscs and the ifb; on any failure undo exactly what this call made.

    Two sends (_writes), each of requests that do not depend on each other: the ingress tbf,
    the ifb and the ingress qdisc; then, with the ifb's index, its mark (alias, up), the
    redirect and its tbf. The first step refused, in that order (the order they were sent one
    by one before), is the error."""
    from pyroute2 import NetlinkError

    from cni.host import ifb, tc

    name = ifb_name(req.network, req.container_id)
    with netns.iproute() as ipr, Undo(req) as undo:
        try:
            first: list[_Write] = []
            if ingress is not None:
                step = f"record of the tbf on {veth.name}"
                try:
                    shaped.remember(req.network, req.container_id, req.ifname, veth.name,
                                    veth.index)
                except OSError as e:
                    raise _Failed(step, e) from None
                undo.push(step, lambda: shaped.forget(req.network, req.container_id,
                                                      req.ifname))
                first.append(_Write(f"tbf on {veth.name}",
                                    tc.tbf_add_message(veth.index, ingress),
                                    lambda: tc.delete_root(ipr, veth.index)))
            added = len(first)  # the ifb add's place in the send
            if egress is not None:
                first += [_Write(f"ifb {name}", ifb.add_message(name, veth.mtu),
                                 lambda: ifb.delete(ipr, name)),
                          _Write(f"ingress qdisc on {veth.name}",
                                 tc.ingress_message(veth.index, delete=False),
                                 lambda: tc.delete_ingress(ipr, veth.index))]
            replies = _writes(ipr, undo, first)
            if egress is None:
                return
            try:
                dev = ifb.made(ipr, name, replies[added])
            except (NetlinkError, OSError) as e:
                raise _Failed(f"ifb {name}", e) from None
            alias = ifb.alias_for(req.network, req.container_id)
            _writes(ipr, undo, [  # nothing to push: each goes with the ifb or ingress qdisc
                _Write(f"ifb {name}", ifb.mark_message(dev.index, alias), None),
                _Write(f"redirect from {veth.name} to {name}",
                       tc.redirect_message(veth.index, dev.index), None),
                _Write(f"tbf on {name}", tc.tbf_add_message(dev.index, egress), None)])
            result["interfaces"].append({"name": name, "mac": dev.mac})
        except _Failed as failed:  # raised inside Undo's block: what was done is taken back
            step, e = failed.args
            if isinstance(e, NetlinkError):
                raise CNIError(Code.INTERNAL, f"bandwidth: {step}: {e.args[-1]}") from None
            raise CNIError(Code.IO_FAILURE, f"bandwidth: {step}: {e}") from None


def _writes(ipr, undo: Undo, writes: list[_Write]) -> list[list[Any]]:
    """`writes` in one send (dumps.writes); -> each one's replies. Each the kernel did pushes
    its undo; the first it refused is sent again alone for its error, raised as _Failed (or
    done after all, if the kernel's state changed meanwhile)."""
    from pyroute2 import NetlinkError

    from cni.host import dumps

    try:
        outcomes = dumps.writes(ipr, [w.msg for w in writes])
    except OSError as e:  # the socket's error: no request's outcome is known
        raise _Failed(writes[0].what, e) from None
    for w, got in zip(writes, outcomes, strict=True):
        if got is not None and w.undo is not None:
            undo.push(w.what, w.undo)
    done = []
    for w, got in zip(writes, outcomes, strict=True):
        if got is None:
            try:
                got = dumps.request(ipr, w.msg)  # raises what it raises sent alone
            except (NetlinkError, OSError) as e:
                raise _Failed(w.what, e) from None
            if w.undo is not None:
                undo.push(w.what, w.undo)
        done.append(got)
    return done


@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def delete(req: Request) -> None:
    """Remove the ifb (missing is fine), the ingress qdisc that redirects to it, and the tbf
    the ADD recorded (cni.plugins.shaped) if its host veth is still there: no config value is
    read, so a config DEL cannot parse removes them too."""
    from cni.host import ifb, links, tc

    name = ifb_name(req.network, req.container_id)
    record = shaped.recall(req.network, req.container_id, req.ifname)
    here = record is not None and record.here()
    # The ifb's index from the interface table, as CHECK takes it (no request, nothing
    # decoded); without it (no such link), it is looked up by name with the reads, as before.
    found = links.index_of(name)

    def reads(ipr, index: int) -> list[Any]:  # with the host end's lookup, in one send
        lookup = [links.get_request(ifname=name)] if found is None else []
        root = [tc.root_request(ipr, record.index)] if here else []
        return [*lookup, *root, tc.filters_request(index)]

    veth, replies = _host_veth_if_any(req, reads)
    with netns.iproute() as ipr:
        if found is not None:
            index: int | None = found
        else:
            index = ifb.lookup(ipr, name, replies.pop(0) if replies else None)
        if veth is not None and here and veth.index == record.index:
            # recorded_veth's link is the host end, just read: compare the name only
            recorded = record.index if veth.name == record.veth else None
        else:
            recorded = recorded_veth(ipr, record)
        host = veth.index if veth is not None else recorded
        # Our ifb exists, so the ingress qdisc is ours if it redirects to it or is still bare.
        ingress = host is not None and index is not None and \
            tc.ingress_is_for(ipr, host, index, replies[-1] if replies else None)
        root = replies[0] if replies and here else None  # the root qdisc of record.index
        tbf = recorded is not None and tc.root_kind(ipr, recorded, root) == "tbf"
        tc.delete_qdiscs(ipr, host if ingress else None, recorded if tbf else None)  # one send
        if index is not None:
            ifb.delete(ipr, name, index)  # looked up above: no second lookup
    shaped.forget(req.network, req.container_id, req.ifname)


def recorded_veth(ipr, record: shaped.Shaped | None) -> int | None:
    """The ifindex of the recorded host veth if that link is still there under its name."""
    from cni.host import links

    if record is None or not record.here():
        return None
    link = links.by_index(ipr, record.index)
    return record.index if link is not None and link.name == record.veth else None


def _host_veth_if_any(req: Request, also: Reads):
    """The host veth for DEL and `also`'s replies (_peer_reading); (None, []) if there is none:
    best effort, DEL works without netns or prevResult."""
    if not req.netns and req.netns_fd is None:
        return None, []
    try:
        return _peer_reading(req, also)
    except (HostError, OSError):  # no netns, no link, no peer: nothing of ours to find
        return None, []


@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def check(req: Request) -> None:
    """Compare the kernel's tbf rate, limit and buffer with the config, on both sides."""
    from cni.host import ifb, links, tc

    lim = limits(req)
    if lim is None or (lim.ingress is None and lim.egress is None):
        return  # nothing to shape, nothing to check (reference #1221 crashed here)
    ingress, egress = lim
    name = ifb_name(req.network, req.container_id)
    # The ifb's index from the host's interface table (if_nametoindex and back: two ioctls, no
    # netlink), so that its root qdisc is asked in the same send as the rest; without it (no
    # such link, or a name that is only an altname), the ifb is looked up in that send instead
    # and its qdisc asked after, as before.
    found = links.index_of(name) if egress is not None else None

    def reads(ipr, index: int) -> list[Any]:  # with the host end's lookup, in one send
        root = [tc.root_request(ipr, index)] if ingress is not None else []
        tail: list[Any] = []
        if egress is not None:  # the ifb's tbf, or else (as before) its lookup by name
            tail.append(tc.root_request(ipr, found) if found is not None
                        else links.get_request(ifname=name))
            tail.append(tc.filters_request(index))
        return root + tail  # the dump last

    veth, replies = _host_veth_reading(req, _require_prev(req), reads)
    ticks = tc.tick_in_usec()
    with netns.iproute() as ipr:
        if ingress is not None:
            _compare(veth.name, tc.read_tbf(ipr, veth.index, replies.pop(0)),
                     _tbf(ingress, veth.mtu, req.log, ticks))
        if egress is not None:
            ifb_read, filter_replies = replies
            ifb_root = ifb_read if found is not None else None
            index = found if found is not None else ifb.lookup(ipr, name, ifb_read)
            if index is None:
                raise CNIError(Code.INTERNAL, f"ifb {name} for egress shaping not found")
            if index not in tc.redirect_targets(ipr, veth.index, filter_replies):
                raise CNIError(Code.INTERNAL,
                               f"no ingress redirect from {veth.name} to ifb {name}")
            # (read_tbf takes the batch's qdisc if it is this index's, else asks alone)
            _compare(name, tc.read_tbf(ipr, index, ifb_root),
                     _tbf(egress, veth.mtu, req.log, ticks))


def _compare(dev: str, found, want) -> None:
    if found is None:
        raise CNIError(Code.INTERNAL, f"no tbf root qdisc on {dev}")
    for field in ("rate", "limit", "buffer"):
        got, expected = getattr(found, field), getattr(want, field)
        if got != expected:
            raise CNIError(Code.INTERNAL,
                           f"tbf {field} on {dev} is {got}, config wants {expected}")


def gc(req: Request) -> int:
    """Remove our ifbs (of this network) whose container has no valid attachment, and the tbf
    and record of each attachment of this network not in the valid list; and, whatever the
    list, the records of any network whose host veth is gone, and dead writers' temporary
    records (cni.plugins.shaped). -> how many qdiscs and links removed."""
    from cni.host import ifb

    valid = valid_attachments(req.config)
    removed = 0
    with netns.iproute() as ipr:
        if valid is None:  # libcni's GC without args: stale and live look alike
            req.log("GC without cni.dev/valid-attachments: no ifb or tbf removed")
        else:
            keep = {cid for cid, _ in valid}
            for dev in ifb.marked(ipr):
                if dev.network == req.network and dev.container_id not in keep:
                    req.log(f"gc: removing {dev.name} of container {dev.container_id}")
                    removed += ifb.delete(ipr, dev.name)
        for record in shaped.listed():
            if valid is not None and record.network == req.network and \
                    (record.container_id, record.ifname) not in valid:
                removed += _collect_tbf(ipr, req, record)
            elif not record.here() or recorded_veth(ipr, record) is not None:
                continue  # another netns's record, or a veth that is still there: kept
            else:
                req.log(f"gc: forgetting the tbf record of {record.network} "
                        f"{record.container_id} {record.ifname}: {record.veth} is gone")
            shaped.forget(record.network, record.container_id, record.ifname)
    swept = shaped.sweep_temporary()
    if swept:
        req.log(f"gc: removed {swept} temporary record file(s) of killed writers")
    return removed


def _collect_tbf(ipr, req: Request, record: shaped.Shaped) -> int:
    """GC of a stale record: its tbf, if the recorded host veth is still there; -> 0 or 1."""
    from cni.host import tc

    index = recorded_veth(ipr, record)
    if index is None or tc.root_kind(ipr, index) != "tbf":
        return 0
    req.log(f"gc: removing the tbf on {record.veth} of container {record.container_id}")
    tc.delete_root(ipr, index)
    return 1


def status(req: Request) -> None:
    return None
