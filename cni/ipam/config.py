"""host-local configuration: the reference's keys, defaults and validation rules.

The JSON shape is checked by config models (cni.spec.config: wrong types -> error 7 naming the
key); the meaning (subnets, ranges, overlaps, requested IPs) is checked here with the
reference's rules, in the reference's order, and every error names the key path and the value.
Addresses are parsed and printed with the stdlib's ipaddress, as strict as Go's parser and
writing Go's text; the ranges themselves are netaddr's (IPNetwork, IPRange, IPSet): membership,
the walk over a pool, overlaps between ranges and range sets.
"""

from __future__ import annotations

import ipaddress
import json
from functools import cached_property
from typing import Any, NamedTuple

from netaddr import IPAddress, IPNetwork, IPRange, IPSet

from cni.spec import keys, names
from cni.spec.config import DNS, Field, Model, parse, parse_lenient
from cni.spec.errors import CNIError, Code
from cni.spec.version import at_least

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# --- the JSON shape ---------------------------------------------------------------------------

class RangeModel(Model):
    subnet: str | None = None
    rangeStart: str | None = None
    rangeEnd: str | None = None
    gateway: str | None = None


class RouteModel(Model):
    dst: str
    gw: str | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None


class IPAMModel(RangeModel):
    type: str = ""
    routes: list[RouteModel] | None = None
    dataDir: str = ""
    resolvConf: str = ""
    ranges: list[list[RangeModel]] = Field(default_factory=list)


class RuntimeModel(Model):
    ips: list[str] = Field(default_factory=list)
    ipRanges: list[list[RangeModel]] = Field(default_factory=list)


class CNIArgsModel(Model):
    ips: list[str] = Field(default_factory=list)


class ArgsModel(Model):
    cni: CNIArgsModel | None = None


class NetModel(Model):
    cniVersion: str = ""
    name: str = ""
    ipam: IPAMModel | None = None
    runtimeConfig: RuntimeModel = Field(default_factory=RuntimeModel)
    args: ArgsModel | None = None


# --- the validated meaning --------------------------------------------------------------------

def bad(key: str, value: Any, why: str, prefix: str = "") -> CNIError:
    """Error 7 naming the key path and the value (the shape every config error takes)."""
    return CNIError(Code.INVALID_CONFIG, f"{prefix}invalid {key} {json.dumps(value)}: {why}")


class Range(NamedTuple):
    """One range of a set (the reference's Range): its subnet, the pool it allocates from
    (rangeStart..rangeEnd, inclusive, inside the subnet) and the gateway it never hands out."""

    network: IPNetwork
    pool: IPRange
    gateway: IPAddress

    @property
    def version(self) -> int:
        return self.network.version

    def ip(self, addr: IPAddress) -> str:
        return text(addr)

    def overlaps(self, other: Range) -> bool:
        """The pools share an address (the reference's Range.Overlaps: an end of one inside
        the other)."""
        return (self.version == other.version and self.pool.first <= other.pool.last
                and other.pool.first <= self.pool.last)

    def __str__(self) -> str:
        return f"{text(self.pool.first, self.version)}-{text(self.pool.last, self.version)}"


def text(addr: IPAddress | int, version: int | None = None) -> str:
    """An address as the reference writes it (the store's file names, results, errors): the
    stdlib's RFC 5952 text, which is Go's; netaddr prints ::/96 addresses as ::a.b.c.d."""
    if isinstance(addr, IPAddress):
        addr, version = int(addr), addr.version
    return str(ipaddress.IPv4Address(addr) if version == 4 else ipaddress.IPv6Address(addr))


class RangeSet(list[Range]):
    """The ranges one IP is taken from (the outer list of `ranges` is a list of these)."""

    @property
    def version(self) -> int:
        return self[0].version

    @cached_property
    def addresses(self) -> IPSet:
        """Every address the set may hand out (gateways included, as the reference's overlap
        check counts them)."""
        return IPSet(r.pool for r in self)

    def range_for(self, addr: Address | IPAddress) -> Range | None:
        ip = addr if isinstance(addr, IPAddress) else IPAddress(int(addr), addr.version)
        return next((r for r in self if ip in r.pool), None)

    def overlaps(self, other: RangeSet) -> bool:
        return self.version == other.version and not self.addresses.isdisjoint(other.addresses)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self)


class IPAMConfig(NamedTuple):
    name: str
    version: str
    ranges: list[RangeSet]
    data_dir: str
    routes: list[dict[str, Any]]
    resolv_conf: str
    requested: list[Address]


def load(config: dict[str, Any], version: str, args: list[tuple[str, str]]) -> IPAMConfig:
    """The reference's LoadIPAMConfig: the plugin config and CNI_ARGS pairs -> IPAMConfig."""
    net = parse(NetModel, config)
    if net.ipam is None:
        raise CNIError(Code.INVALID_CONFIG, "IPAM config missing 'ipam' key")
    name = net.name
    if not names.valid_id(name):
        raise bad("name", name, "invalid characters found in network name")
    ipam = net.ipam
    requested = _requested(net, args)
    ranges = _range_sets(net)
    _check_counts(ranges, version)
    _check_overlaps(ranges)
    return IPAMConfig(
        name=name, version=version, ranges=[s for s, _ in ranges],
        data_dir=ipam.dataDir or DEFAULT_DATA_DIR, routes=_routes(ipam.routes),
        resolv_conf=ipam.resolvConf, requested=requested,
    )


def store_for_del(config: dict[str, Any]) -> tuple[str, str] | None:
    """(dataDir, network name) of a config `load` refuses, from what validates of it; None when
    no store of it can exist (no valid name: ADD never made one)."""
    name = config.get("name")
    if not isinstance(name, str) or not names.valid_id(name):
        return None
    raw = keys.get(config, "ipam")
    ipam, _ = parse_lenient(IPAMModel, raw if isinstance(raw, dict) else {})
    return ipam.dataDir or DEFAULT_DATA_DIR, name


def _requested(net: NetModel, args: list[tuple[str, str]]) -> list[Address]:
    """Requested IPs: CNI_ARGS IP=, then args.cni.ips, then runtimeConfig.ips; no duplicates."""
    found: list[Address] = []
    for value in env_ips(args):
        found.append(_parse_requested("CNI_ARGS IP", value, Code.INVALID_ENV))
    if net.args is not None and net.args.cni is not None:
        for i, value in enumerate(net.args.cni.ips):
            found.append(_parse_requested(f"args.cni.ips.{i}", value, Code.INVALID_CONFIG))
    for i, value in enumerate(net.runtimeConfig.ips):
        found.append(_parse_requested(f"runtimeConfig.ips.{i}", value, Code.INVALID_CONFIG))
    return list(dict.fromkeys(found))


def env_ips(args: list[tuple[str, str]]) -> list[str]:
    """CNI_ARGS as the reference's IPAMEnvArgs reads them: IP (comma-separated), IgnoreUnknown."""
    value = names.known_args(args, ("IP",)).get("IP", "")
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_requested(key: str, value: str, code: int) -> Address:
    """An IP, or an IP with a prefix (the reference's ip.IP accepts both); v4-mapped -> v4."""
    try:
        addr = ipaddress.ip_interface(value).ip if "/" in value else ipaddress.ip_address(value)
    except ValueError:
        raise CNIError(code, f"invalid {key} {json.dumps(value)}: not an IP address") from None
    return _unmap(addr)


def _unmap(addr: Address) -> Address:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _range_sets(net: NetModel) -> list[tuple[RangeSet, str]]:
    """runtimeConfig.ipRanges, then the legacy single range, then ipam.ranges (each validated),
    with the key path each came from."""
    ipam = net.ipam
    assert ipam is not None
    raw: list[tuple[list[RangeModel], str, bool]] = [
        (s, f"runtimeConfig.ipRanges.{i}", False) for i, s in enumerate(net.runtimeConfig.ipRanges)
    ]
    if ipam.subnet is not None:
        raw.append(([ipam], "ipam", True))
    raw += [(s, f"ipam.ranges.{i}", False) for i, s in enumerate(ipam.ranges)]
    if not raw:
        raise CNIError(Code.INVALID_CONFIG, "invalid ipam.ranges []: no IP ranges specified")
    return [(_range_set(models, path, idx, legacy), path)
            for idx, (models, path, legacy) in enumerate(raw)]


def _range_set(models: list[RangeModel], path: str, idx: int, legacy: bool) -> RangeSet:
    prefix = f"invalid range set {idx}: "
    if not models:
        raise CNIError(Code.INVALID_CONFIG, f"{prefix}invalid {path} []: empty range set")
    out = RangeSet()
    for j, model in enumerate(models):
        key = path if legacy else f"{path}.{j}"
        r = _range(model, key, prefix)
        if out and r.version != out.version:
            raise bad(f"{key}.subnet", model.subnet, "mixed address families in a range set",
                      prefix)
        out.append(r)
    for i, r1 in enumerate(out):
        for r2 in out[i + 1:]:
            if r1.overlaps(r2):
                raise CNIError(Code.INVALID_CONFIG,
                               f"{prefix}invalid {path}: subnets {r1} and {r2} overlap")
    return out


def _range(m: RangeModel, key: str, prefix: str) -> Range:
    """The reference's Range.Canonicalize: network address, size, defaults, bounds."""
    if m.subnet is None:
        raise bad(f"{key}.subnet", None, "a subnet is required", prefix)
    if "/" not in m.subnet:
        raise bad(f"{key}.subnet", m.subnet, "not a CIDR (address/prefix)", prefix)
    try:
        iface = ipaddress.ip_interface(m.subnet)
    except ValueError:
        raise bad(f"{key}.subnet", m.subnet, "not a CIDR (address/prefix)", prefix) from None
    network = iface.network
    bits = network.max_prefixlen
    if network.prefixlen > bits - 2:
        raise bad(f"{key}.subnet", m.subnet, f"network {network} too small to allocate from "
                  f"(IPv{iface.version} prefix must be at most {bits - 2})", prefix)
    if iface.ip != network.network_address:
        raise bad(f"{key}.subnet", m.subnet,
                  f"network has host bits set; for a subnet mask of length {network.prefixlen} "
                  f"the network address is {network.network_address}", prefix)
    net = IPNetwork((int(network.network_address), network.prefixlen), network.version)
    # The pool's defaults: the network address and (IPv4) the broadcast address are not handed
    # out; the gateway defaults to the first host.
    first_host = IPAddress(net.first + 1, net.version)
    last_host = IPAddress(net.last - (1 if net.version == 4 else 0), net.version)
    gateway = _member(m.gateway, f"{key}.gateway", iface.version, None, prefix)
    start = _member(m.rangeStart, f"{key}.rangeStart", iface.version, network, prefix)
    end = _member(m.rangeEnd, f"{key}.rangeEnd", iface.version, network, prefix)
    start = first_host if start is None else start
    if end is not None and end < start:
        raise bad(f"{key}.rangeEnd", m.rangeEnd, f"before rangeStart {text(start)}", prefix)
    return Range(network=net, pool=IPRange(start, last_host if end is None else end),
                 gateway=first_host if gateway is None else gateway)


def _member(value: str | None, key: str, version: int,
            network: ipaddress.IPv4Network | ipaddress.IPv6Network | None,
            prefix: str) -> IPAddress | None:
    """An address of the range's family (and, for start/end, inside its network)."""
    if value is None:
        return None
    try:
        addr = _unmap(ipaddress.ip_address(value))
    except ValueError:
        raise bad(key, value, "not an IP address", prefix) from None
    if addr.version != version:
        raise bad(key, value, f"not an IPv{version} address", prefix)
    if network is not None and addr not in network:
        raise bad(key, value, f"not in network {network}", prefix)
    return IPAddress(int(addr), version)


def _check_counts(ranges: list[tuple[RangeSet, str]], version: str) -> None:
    """Spec 0.2.0 and below carry one address per family."""
    v4 = sum(1 for s, _ in ranges if s.version == 4)
    v6 = len(ranges) - v4
    if (v4 > 1 or v6 > 1) and not _at_least(version, "0.3.0"):
        raise CNIError(Code.INVALID_CONFIG,
                       f'invalid cniVersion "{version}": CNI version {version} does not support '
                       f"more than 1 address per family ({v4} IPv4 and {v6} IPv6 range sets)")


def _at_least(version: str, minimum: str) -> bool:
    try:
        return at_least(version, minimum)
    except CNIError:
        return False


def _check_overlaps(ranges: list[tuple[RangeSet, str]]) -> None:
    for i, (s1, p1) in enumerate(ranges):
        for j in range(i + 1, len(ranges)):
            s2, p2 = ranges[j]
            if s1.overlaps(s2):
                raise CNIError(Code.INVALID_CONFIG,
                               f"invalid {p2}: range set {i} overlaps with {j} "
                               f"({p1} {s1} and {p2} {s2})")


def _routes(routes: list[RouteModel] | None) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(routes or []):
        try:
            dst = str(ipaddress.ip_interface(r.dst)) if "/" in r.dst else ""
        except ValueError:
            dst = ""
        if not dst:
            raise bad(f"ipam.routes.{i}.dst", r.dst, "not a CIDR (address/prefix)")
        route: dict[str, Any] = {"dst": dst}
        if r.gw is not None:
            try:
                route["gw"] = str(ipaddress.ip_address(r.gw))
            except ValueError:
                raise bad(f"ipam.routes.{i}.gw", r.gw, "not an IP address") from None
        for key in ("mtu", "advmss", "priority", "table", "scope"):
            if getattr(r, key) is not None:
                route[key] = getattr(r, key)
        out.append(route)
    return out


def parse_resolv_conf(path: str) -> dict[str, Any]:
    """resolv.conf -> result dns, exactly as the reference reads it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise bad("ipam.resolvConf", path, f"cannot read: {e.strerror}") from None
    dns = DNS()
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        fields = line.split()
        if len(fields) < 2:
            continue
        if fields[0] == "nameserver":
            dns.nameservers.append(fields[1])
        elif fields[0] == "domain":
            dns.domain = fields[1]
        elif fields[0] == "search":
            dns.search += fields[1:]
        elif fields[0] == "options":
            dns.options += fields[1:]
    return {k: v for k, v in dns.model_dump().items()
            if v and k in ("nameservers", "domain", "search", "options")}
