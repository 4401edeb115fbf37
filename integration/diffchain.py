"""A minimal libcni for the differential test: run a conflist's chain with exec'd plugins, the same
way for the reference Go plugins and for ours, and read back what a pod and its node look like.

Deliberately independent of cni/runtime (the thing under test elsewhere): request = plugin conf +
name + cniVersion + runtimeConfig (capabilities that are true and given) + prevResult.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnitest import Netns, Plugins

MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def request(plugin: dict[str, Any], conflist: dict[str, Any], cap_args: dict[str, Any],
            prev: dict | None) -> dict[str, Any]:
    conf = {**copy.deepcopy(plugin), "name": conflist["name"],
            "cniVersion": conflist["cniVersion"]}
    rc = {k: v for k, v in cap_args.items() if plugin.get("capabilities", {}).get(k)}
    if rc:
        conf["runtimeConfig"] = rc
    if prev is not None:
        conf["prevResult"] = prev
    return conf


@dataclass
class Side:
    """One implementation (bin dir) with its own node netns, as a runtime would drive it."""

    label: str
    plugins: Plugins
    data_dir: Path
    pods: dict[str, Netns] = field(default_factory=dict)

    def conflist(self, conflist: dict[str, Any]) -> dict[str, Any]:
        """The conflist with host-local's store in this side's temp dir."""
        conf = copy.deepcopy(conflist)
        for p in conf["plugins"]:
            if "ipam" in p:
                p["ipam"]["dataDir"] = str(self.data_dir)
            if p.get("type") == "host-local":
                p["dataDir"] = str(self.data_dir)
            if p.get("type") == "tuning":
                p["dataDir"] = str(self.data_dir / "tuning")
        return conf

    def run(self, verb: str, conflist: dict[str, Any], pod: str, *, cid: str = "",
            cap_args: dict | None = None, prev: dict | None = None, ifname: str = "eth0",
            netns: str | None = None) -> tuple[int, Any]:
        """The whole chain for one verb; ADD returns the final result, others the last output.
        Stops at the first failure and returns its code and output."""
        conf = self.conflist(conflist)
        plugins = conf["plugins"] if verb != "DEL" else list(reversed(conf["plugins"]))
        path = self.pods[pod].path if netns is None else netns
        out: Any = None
        result = prev
        for plugin in plugins:
            req = request(plugin, conf, cap_args or {}, result if verb == "ADD" else prev)
            if verb == "ADD" and result is None:
                req.pop("prevResult", None)
            code, out, err = self.plugins.exec(plugin["type"], verb, req,
                                               container_id=cid or f"ctr-{pod}", netns=path,
                                               ifname=ifname)
            if code != 0:
                return code, {"error": out, "stderr": err}
            if verb == "ADD":
                result = out
        return 0, result if verb == "ADD" else out


# ---- normalising what differs by chance (random names, MACs, netns paths) -------------------


def normalize(result: Any, side: Side) -> Any:
    """Results with random veth names, MACs and this side's netns paths replaced by tokens."""
    paths = {ns.path: f"<netns:{name}>" for name, ns in side.pods.items()}

    def walk(x: Any, key: str = "") -> Any:
        if isinstance(x, dict):
            return {k: walk(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            if key == "mac" and MAC.match(x) and x != "00:00:00:00:00:00":
                return "<mac>"
            if key == "name" and re.fullmatch(r"veth[0-9a-f]{8}", x):
                return "<veth>"
            if key == "sandbox":
                return paths.get(x, x)
            if key == "dataDir":
                return "<dataDir>"
        return x

    return walk(result)


def pod_state(ns: Netns) -> dict[str, Any]:
    """Links (name, state, mtu, txqueuelen), global addresses (with brd) and main-table routes
    of a pod netns."""
    links = {link["ifname"]: {"up": "UP" in link.get("flags", []), "mtu": link.get("mtu"),
                              "kind": link.get("linkinfo", {}).get("info_kind"),
                              "txqlen": link.get("txqlen", 0)}
             for link in ns.ip("-d", "link", "show")}
    addrs = sorted(f"{link['ifname']} {a['local']}/{a['prefixlen']} brd {a.get('broadcast')}"
                   for link in ns.ip("addr", "show") for a in link.get("addr_info", [])
                   if a.get("scope") in ("global", "host"))
    routes = []
    for fam in ("-4", "-6"):
        for r in ns.ip(fam, "route", "show"):
            if r.get("dst", "").startswith("fe80::") or r.get("dst") == "multicast":
                continue
            routes.append(" ".join(f"{k}={r[k]}" for k in ("dst", "gateway", "dev", "scope")
                                   if k in r))
    return {"links": links, "addrs": addrs, "routes": sorted(routes)}


def link_settings(ns: Netns, ifname: str, sysctls: tuple[str, ...] = ()) -> dict[str, Any]:
    """What tuning sets on a pod's link: MAC, MTU, txqueuelen, the PROMISC and ALLMULTI flags,
    and the given sysctl files (paths under /proc/sys, read inside the pod)."""
    link = ns.links()[ifname]
    out = {"mac": link["address"], "mtu": link["mtu"], "txqlen": link.get("txqlen", 0),
           "promisc": "PROMISC" in link["flags"], "allmulti": "ALLMULTI" in link["flags"]}
    for path in sysctls:
        out[path] = ns.run("cat", path).stdout.split()
    return out


def store_files(data_dir: Path, network: str) -> dict[str, str]:
    d = data_dir / network
    return {p.name: p.read_text() for p in sorted(d.iterdir())
            if p.name != "lock"} if d.is_dir() else {}


def node_links(host: Netns, bridge: str) -> dict[str, Any]:
    """The bridge's operstate and the host veths' txqueuelen (names and MACs are random)."""
    links = host.ip("-d", "link", "show")
    return {"bridge": next(link["operstate"] for link in links if link["ifname"] == bridge),
            "veth txqlen": sorted(link.get("txqlen", 0) for link in links
                                  if link.get("linkinfo", {}).get("info_kind") == "veth")}


def host_veths(host: Netns) -> list[dict]:
    return [link for link in host.ip("-d", "link", "show")
            if link.get("linkinfo", {}).get("info_kind") == "veth"]


def tbf(host: Netns, dev: str) -> list[dict]:
    """The tbf qdiscs on dev, only the numbers the bandwidth plugin sets."""
    out = json.loads(host.run("tc", "-j", "qdisc", "show", "dev", dev).stdout or "[]")
    return [{k: q.get("options", {}).get(k) for k in ("rate", "burst", "lat", "limit")}
            | {"handle": q.get("handle")} for q in out if q.get("kind") == "tbf"]


def as_v19(result: Any) -> Any:
    """The 1.1.1 oracle's result as v1.9.1 prints it: from 1.0.0 on, no empty "dns"."""
    if not isinstance(result, dict) or result.get("dns") != {}:
        return result
    if result.get("cniVersion") not in ("1.0.0", "1.1.0"):
        return result
    return {k: v for k, v in result.items() if k != "dns"}
