"""CNI results: one canonical form (the 1.x shape) and exact JSON for every spec version.

Plugins build and receive results in the canonical form; skel converts at the edges. Key order
and omissions follow the reference's Go structs, so our output reads like theirs byte for byte.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from cni.spec.errors import CNIError, Code
from cni.spec.version import parse

Result = dict[str, Any]

_IFACE_KEYS_1X = ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")
_IFACE_KEYS_04 = ("name", "mac", "sandbox")
_ROUTE_KEYS = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
_DNS_KEYS = ("nameservers", "domain", "search", "options")


def _era(version: str) -> str:
    v = parse(version)
    if v >= (1, 0, 0):
        return "1x"
    if v >= (0, 3, 0):
        return "03"
    return "02"


def _bad(why: str) -> CNIError:
    return CNIError(Code.DECODING_FAILURE, f"invalid result: {why}")


def _family(address: str) -> str:
    """'4' or '6' for an 'ip/prefix' or plain ip string."""
    family = _family_of(address) if type(address) is str else _family_of.__wrapped__(address)
    if family is None:
        raise _bad(f'"{address}" is not an IP address')
    return family


@functools.lru_cache(maxsize=256)
def _family_of(address: str) -> str | None:
    """_family's answer (None: not an address), kept: a pod's addresses and routes come again
    in each of its plugins' prevResults, and ip_interface parses them whole (~10-20 us)."""
    try:
        return str(ipaddress.ip_interface(address).version)
    except ValueError:
        return None


def _pick(obj: dict, keys: tuple[str, ...]) -> dict:
    """The keys in reference order, dropping what Go's omitempty drops (except index 0)."""
    out = {}
    for key in keys:
        value = obj.get(key)
        if value is None or value == "" or value == [] or value == {}:
            continue
        if value == 0 and key not in ("table", "scope", "interface"):
            continue
        out[key] = value
    return out


def _dns(obj: Any) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise _bad("dns must be an object")
    return _pick(obj, _DNS_KEYS)


def _routes(items: Any) -> list[dict]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise _bad("routes must be a list")
    out = []
    for r in items:
        if not isinstance(r, dict) or not isinstance(r.get("dst"), str):
            raise _bad(f"route without dst: {r!r}")
        _family(r["dst"])
        out.append({"dst": r["dst"], **_pick(r, _ROUTE_KEYS[1:])})
    return out


def declared_in_era(obj: Any, version: str) -> bool:
    """Whether a result declares (or leaves out) a cniVersion of `version`'s shape. The
    reference refuses to parse a 0.1.0/0.2.0 prevResult that declares another."""
    declared = obj.get("cniVersion") if isinstance(obj, dict) else None
    if declared is None or declared == "":
        return True
    try:
        return isinstance(declared, str) and _era(declared) == _era(version)
    except CNIError:
        return False


def to_current(obj: Any, version: str) -> Result:
    """A result of `version`'s shape (a prevResult, an IPAM plugin's output) -> canonical."""
    if not isinstance(obj, dict):
        raise _bad("not a JSON object")
    era = _era(version)
    if era == "02":
        ips, routes = [], []
        for fam in ("ip4", "ip6"):
            block = obj.get(fam)
            if block is None:
                continue
            if not isinstance(block, dict) or not isinstance(block.get("ip"), str):
                raise _bad(f"{fam} without ip")
            _family(block["ip"])
            ips.append(_pick({"address": block["ip"], "gateway": block.get("gateway")},
                             ("address", "gateway")))
            routes += _routes(block.get("routes"))
        return {"cniVersion": version, "interfaces": [], "ips": ips, "routes": routes,
                "dns": _dns(obj.get("dns"))}

    interfaces = obj.get("interfaces") or []
    if not isinstance(interfaces, list) or not all(
        isinstance(i, dict) and isinstance(i.get("name"), str) for i in interfaces
    ):
        raise _bad("interfaces must be a list of objects with a name")
    given = obj.get("ips")
    if given is not None and not isinstance(given, list):
        raise _bad("ips must be a list")
    ips = []
    for ip in given or []:
        if not isinstance(ip, dict) or not isinstance(ip.get("address"), str):
            raise _bad(f"ip without address: {ip!r}")
        _family(ip["address"])
        index = ip.get("interface")
        if index is not None and (not isinstance(index, int) or not
                                  0 <= index < len(interfaces)):
            raise _bad(f"ip interface index {index!r} out of range")
        ips.append(_pick(ip, ("interface", "address", "gateway")))
    return {
        "cniVersion": version,
        "interfaces": [_pick(i, _IFACE_KEYS_1X) | {"name": i["name"]} for i in interfaces],
        "ips": ips,
        "routes": _routes(obj.get("routes")),
        "dns": _dns(obj.get("dns")),
    }


def from_current(result: Result, version: str, passthrough: bool = False) -> Result:
    """Canonical -> the exact JSON object a plugin of `version` prints. `passthrough`: the result
    is a prevResult of `version` handed on unchanged (portmap, loopback): printed as it came,
    without IP addresses too; the reference fails only when it converts a later result down."""
    era = _era(version)
    if era == "02":
        out: Result = {"cniVersion": version}
        for fam, key in (("4", "ip4"), ("6", "ip6")):
            first = next((ip for ip in result.get("ips", [])
                          if _family(ip["address"]) == fam), None)
            if first is None:
                continue
            block: dict = {"ip": first["address"]}
            if first.get("gateway"):
                block["gateway"] = first["gateway"]
            routes = [{"dst": r["dst"], **({"gw": r["gw"]} if r.get("gw") else {})}
                      for r in result.get("routes", []) if _family(r["dst"]) == fam]
            if routes:
                block["routes"] = routes
            out[key] = block
        if len(out) == 1 and not passthrough:
            raise CNIError(Code.INTERNAL, "cannot convert: no valid IP addresses")
        out["dns"] = _dns(result.get("dns"))
        return out

    iface_keys = _IFACE_KEYS_1X if era == "1x" else _IFACE_KEYS_04
    out = {"cniVersion": version}
    interfaces = [{"name": i["name"], **_pick(i, iface_keys[1:])}
                  for i in result.get("interfaces", [])]
    if interfaces:
        out["interfaces"] = interfaces
    ips = []
    for ip in result.get("ips", []):
        entry = {"version": _family(ip["address"])} if era == "03" else {}
        ips.append(entry | _pick(ip, ("interface", "address", "gateway")))
    if ips:
        out["ips"] = ips
    routes = _routes(result.get("routes"))
    if routes:
        out["routes"] = routes
    # "dns": before 1.0.0 the reference's result holds a struct and prints it even empty; from
    # 1.0.0 on (v1.9.1; 1.1.1 printed it too) it is omitted when empty, as every other key.
    dns = _dns(result.get("dns"))
    if dns or era != "1x":
        out["dns"] = dns
    return out


def convert(obj: Any, from_version: str, to_version: str) -> Result:
    return from_current(to_current(obj, from_version), to_version)
