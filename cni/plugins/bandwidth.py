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
Rates are bit/s, bursts bits; 0 means unlimited. A rate without a burst (or the reverse) and a
burst of 4 GB or more are config errors naming the key and the value, as in the reference.

Burst when only a rate is known: annotations carry no burst, and containerd / CRI-O fill
runtimeConfig.bandwidth's burst with 4294967295 bits (math.MaxUint32) for them; a 512 MB bucket
lets a pod run at line rate for seconds and then stall (reference issue #609). In both cases we
use 10 ms worth of the rate, at least 4 MTUs of the host veth, at most tbf's 4 GB.

Each ifb carries the alias `pycni-bandwidth <network> <containerID>` (cni.host.ifb), so GC removes
exactly our ifbs of containers the runtime no longer knows. CHECK without limits succeeds
(reference #1221 crashed there).
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

from cni.host import netns
from cni.host.digest import sha512_hex
from cni.host.errors import HostError
from cni.plugins.undo import Undo
from cni.skel import Request, require_printable, valid_attachments
from cni.spec import keys
from cni.spec.errors import CNIError, Code, invalid_config
from cni.spec.result import Result

KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")
ANNOTATIONS = "io.kubernetes.cri.pod-annotations"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
MIN_ANNOTATED = 1_000  # kubelet: "1k"
MAX_ANNOTATED = 10**15  # kubelet: "1P"
UNKNOWN_BURST = 2**32 - 1  # what containerd and CRI-O pass when they only know a rate
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
    """10 ms of the rate, at least a few MTUs, at most tbf's 4 GB bucket (bits)."""
    floor = DERIVED_BURST_MTUS * max(mtu, 1500) * 8
    return min(max(int(rate_bits * DERIVED_BURST_SECONDS), floor), MAX_BURST_BYTES * 8)


def ifb_name(network: str, container_id: str) -> str:
    """`bwp` + 12 hex of sha512(network + containerID), the reference's name."""
    return IFB_PREFIX + sha512_hex(network + container_id, 12)


# ---- configuration ---------------------------------------------------------------------------

def limits(req: Request) -> Limits | None:
    """The limits to apply, from the first source present; None when there are none."""
    config = keys.match(req.config, KEYS)
    if any(key in config for key in KEYS):
        return _from_entry(config, "", sentinel=False)
    runtime = req.runtime_config
    if "bandwidth" in runtime and runtime["bandwidth"] is not None:
        entry = runtime["bandwidth"]
        prefix = f"runtimeConfig.{runtime.written('bandwidth')}"
        if not isinstance(entry, dict):
            raise invalid_config(prefix, entry, "must be an object")
        # containerd's CRI sends IngressRate, IngressBurst, ...: Go structs without JSON tags.
        return _from_entry(keys.match(entry, KEYS), prefix + ".", sentinel=True)
    return _from_annotations(runtime.get(ANNOTATIONS))


def _from_entry(entry: keys.Keys, prefix: str, sentinel: bool) -> Limits:
    names = {key: prefix + entry.written(key) for key in KEYS}  # as the user cased them
    values = {key: _bits(entry.get(key, 0), names[key]) for key in KEYS}
    ingress = _direction(values, names, "ingress", sentinel)
    egress = _direction(values, names, "egress", sentinel)
    return Limits(ingress, egress)


def _bits(value: Any, key: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise invalid_config(key, value, "must be a non-negative integer")
    return value


def _direction(values: dict[str, int], names: dict[str, str], side: str,
               sentinel: bool) -> Direction | None:
    rate_key, burst_key = f"{side}Rate", f"{side}Burst"
    rate, burst = values[rate_key], values[burst_key]
    if rate and not burst:
        raise invalid_config(names[rate_key], rate, f"if rate is set, {burst_key} must also "
                             "be set")
    if burst and not rate:
        raise invalid_config(names[burst_key], burst, f"if burst is set, {rate_key} must "
                             "also be set")
    if burst // 8 >= MAX_BURST_BYTES:
        raise invalid_config(names[burst_key], burst, "burst cannot be more than 4GB")
    if not rate:
        return None
    chosen = None if sentinel and burst == UNKNOWN_BURST else burst
    return Direction(rate, chosen, names[rate_key], names[burst_key])


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


def _tbf(direction: Direction, mtu: int):
    from cni.host import tc

    burst = direction.burst_bits(mtu)
    try:
        return tc.tbf_for(direction.rate, burst)
    except ValueError as e:
        raise invalid_config(direction.burst_key, burst, str(e)) from None


# ---- the host veth ---------------------------------------------------------------------------

def _require_prev(req: Request) -> Result:
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG,
                       "bandwidth must be called as a chained plugin: prevResult is missing")
    return req.prev_result


def _host_veth(req: Request, prev: Result):
    """The host end of CNI_IFNAME's veth, which prevResult must list without a sandbox."""
    from cni.host import peer

    interfaces = prev.get("interfaces") or []
    if not interfaces:
        raise CNIError(Code.INVALID_CONFIG, "prevResult has no interfaces: bandwidth needs the "
                       "host veth of the container interface")
    veth = peer.host_veth(req.netns_target, req.ifname)  # PeerError: 999, as the reference
    host_side = [i.get("name") for i in interfaces if not i.get("sandbox")]
    if veth.name not in host_side:
        raise CNIError(Code.INTERNAL, f"veth peer {veth.name} of container interface "
                       f"{req.ifname} is not among prevResult's host interfaces {host_side}")
    return veth


# ---- verbs -----------------------------------------------------------------------------------

@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def add(req: Request) -> Result:
    lim = limits(req)
    if lim is None or (lim.ingress is None and lim.egress is None):
        return req.prev_result or _empty(req)
    prev = _require_prev(req)
    require_printable(prev, req.version)
    veth = _host_veth(req, prev)
    ingress = _tbf(lim.ingress, veth.mtu) if lim.ingress else None
    egress = _tbf(lim.egress, veth.mtu) if lim.egress else None
    result = copy.deepcopy(prev)
    result["interfaces"] = list(result.get("interfaces") or [])
    _apply(req, veth, ingress, egress, result)
    return result


def _empty(req: Request) -> Result:
    return {"cniVersion": req.version, "interfaces": [], "ips": [], "routes": [], "dns": {}}


def _apply(req: Request, veth, ingress, egress, result: Result) -> None:
    """Create the qdiscs and the ifb; on any failure undo exactly what this call made."""
    from pyroute2 import NetlinkError

    from cni.host import ifb, tc

    step = ""
    with netns.iproute() as ipr, Undo(req) as undo:
        try:
            if ingress is not None:
                step = f"tbf on {veth.name}"
                tc.add_tbf(ipr, veth.index, ingress)
                undo.push(step, lambda: tc.delete_root(ipr, veth.index))
            if egress is not None:
                name = ifb_name(req.network, req.container_id)
                step = f"ifb {name}"
                dev = ifb.create(ipr, name, veth.mtu, req.network, req.container_id)
                undo.push(step, lambda: ifb.delete(ipr, name))
                step = f"ingress qdisc on {veth.name}"
                tc.add_ingress(ipr, veth.index)
                undo.push(step, lambda: tc.delete_ingress(ipr, veth.index))
                step = f"redirect from {veth.name} to {name}"
                tc.add_redirect(ipr, veth.index, dev.index)
                step = f"tbf on {name}"
                tc.add_tbf(ipr, dev.index, egress)
                result["interfaces"].append({"name": name, "mac": dev.mac})
        except NetlinkError as e:  # raised inside Undo's block: what was done is taken back
            raise CNIError(Code.INTERNAL, f"bandwidth: {step}: {e.args[-1]}") from None


@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def delete(req: Request) -> None:
    """Remove the ifb (missing is fine), and our qdiscs on the host veth if it is still there."""
    from cni.host import ifb, tc

    name = ifb_name(req.network, req.container_id)
    veth = _host_veth_if_any(req)
    with netns.iproute() as ipr:
        index = ifb.lookup(ipr, name)
        # Our ifb exists, so the ingress qdisc is ours if it redirects to it or is still bare.
        if veth is not None and index is not None and tc.ingress_is_for(ipr, veth.index, index):
            tc.delete_ingress(ipr, veth.index)
        if veth is not None and limits_or_none(req) and tc.root_kind(ipr, veth.index) == "tbf":
            tc.delete_root(ipr, veth.index)
        if index is not None:
            ifb.delete(ipr, name, index)  # looked up above: no second lookup


def limits_or_none(req: Request) -> Limits | None:
    """DEL never fails on config: a bad bandwidth config just means no ingress tbf to remove."""
    try:
        lim = limits(req)
    except CNIError:
        return None
    return lim if lim is not None and lim.ingress is not None else None


def _host_veth_if_any(req: Request):
    """The host veth for DEL: best effort, DEL works without netns or prevResult."""
    from cni.host import peer

    if not req.netns and req.netns_fd is None:
        return None
    try:
        return peer.host_veth(req.netns_target, req.ifname)
    except (HostError, OSError):  # no netns, no link, no peer: nothing of ours to find
        return None


@netns.one_socket_per_namespace  # the peer lookup and the tc work share one host socket
def check(req: Request) -> None:
    """Compare the kernel's tbf rate, limit and buffer with the config, on both sides."""
    from cni.host import ifb, tc

    lim = limits(req)
    if lim is None or (lim.ingress is None and lim.egress is None):
        return  # nothing to shape, nothing to check (reference #1221 crashed here)
    veth = _host_veth(req, _require_prev(req))
    with netns.iproute() as ipr:
        if lim.ingress is not None:
            _compare(veth.name, tc.read_tbf(ipr, veth.index), _tbf(lim.ingress, veth.mtu))
        if lim.egress is not None:
            name = ifb_name(req.network, req.container_id)
            index = ifb.lookup(ipr, name)
            if index is None:
                raise CNIError(Code.INTERNAL, f"ifb {name} for egress shaping not found")
            if index not in tc.redirect_targets(ipr, veth.index):
                raise CNIError(Code.INTERNAL,
                               f"no ingress redirect from {veth.name} to ifb {name}")
            _compare(name, tc.read_tbf(ipr, index), _tbf(lim.egress, veth.mtu))


def _compare(dev: str, found, want) -> None:
    if found is None:
        raise CNIError(Code.INTERNAL, f"no tbf root qdisc on {dev}")
    for field in ("rate", "limit", "buffer"):
        got, expected = getattr(found, field), getattr(want, field)
        if got != expected:
            raise CNIError(Code.INTERNAL,
                           f"tbf {field} on {dev} is {got}, config wants {expected}")


def gc(req: Request) -> int:
    """Remove our ifbs (of this network) whose container is not among the valid attachments;
    -> how many."""
    from cni.host import ifb

    valid = valid_attachments(req.config)
    if valid is None:  # libcni's GC without args: stale and live look alike
        req.log("GC without cni.dev/valid-attachments: no ifb removed")
        return 0
    keep = {cid for cid, _ in valid}
    removed = 0
    with netns.iproute() as ipr:
        for dev in ifb.marked(ipr):
            if dev.network == req.network and dev.container_id not in keep:
                req.log(f"gc: removing {dev.name} of container {dev.container_id}")
                removed += ifb.delete(ipr, dev.name)
    return removed


def status(req: Request) -> None:
    return None
