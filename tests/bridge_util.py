"""Helpers for the bridge tests: configs, reading bridge/veth kernel state, host-local stores."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cnitest import REFERENCE_BIN, Netns

MASQ_TABLE = "cni_plugins_masquerade"


def ipam_path() -> str:
    """CNI_PATH for IPAM: our bin (if our host-local exists there) then the reference's."""
    ours = Path(__file__).resolve().parent.parent / "cni" / "plugins" / "host_local.py"
    bins = [str(Path(__file__).resolve().parent.parent / "bin")] if ours.exists() else []
    return ":".join([*bins, str(REFERENCE_BIN)])


def conf(tmp_path: Path, version: str = "1.0.0", subnet: str = "10.22.0.0/24",
         ranges: list | None = None, **keys: Any) -> dict:
    ipam: dict = {"type": "host-local", "dataDir": str(tmp_path / "ipam")}
    if ranges is not None:
        ipam["ranges"] = ranges
    else:
        ipam["subnet"] = subnet
    return {"cniVersion": version, "name": "testnet", "type": "bridge", "bridge": "cni0",
            "isGateway": True, "ipam": ipam, **keys}


def reservations(tmp_path: Path, network: str = "testnet") -> list[str]:
    """IPs reserved in the host-local store (files other than lock / last_reserved_ip.*)."""
    d = tmp_path / "ipam" / network
    if not d.exists():
        return []
    return sorted(f for f in os.listdir(d)
                  if f != "lock" and not f.startswith("last_reserved_ip"))


def link(ns: Netns, name: str) -> dict | None:
    return ns.links().get(name)


def host_veths(host: Netns) -> list[str]:
    return sorted(n for n, link in host.links().items()
                  if link.get("linkinfo", {}).get("info_kind") == "veth")


def slave_data(host: Netns, name: str) -> dict:
    return host.links()[name]["linkinfo"].get("info_slave_data", {})


def masq_rules(host: Netns) -> list[dict]:
    return [o["rule"] for o in host.nft_ruleset().get("nftables", [])
            if "rule" in o and o["rule"]["table"] == MASQ_TABLE
            and o["rule"]["chain"] == "masq_checks"]


def spoof_chains(host: Netns) -> list[str]:
    return [o["chain"]["name"] for o in host.nft_ruleset().get("nftables", [])
            if "chain" in o and o["chain"]["family"] == "bridge"
            and o["chain"]["name"].startswith("cni-br-iface-")]


def sysctl(ns: Netns, key: str) -> str:
    return ns.run("cat", f"/proc/sys/{key}").stdout.strip()


def routes(ns: Netns, family: str) -> list[dict]:
    return ns.ip(family, "route", "show")


def vlan_filtering_supported(ns: Netns) -> bool:
    """Some kernels are built without CONFIG_BRIDGE_VLAN_FILTERING."""
    probe = ns.run("ip", "link", "add", "vlanprobe0", "type", "bridge", "vlan_filtering", "1",
                   check=False)
    ns.run("ip", "link", "del", "vlanprobe0", check=False)
    return probe.returncode == 0


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


DUAL = [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd00:22::/64"}]]
