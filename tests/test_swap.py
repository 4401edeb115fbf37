"""Swapping the plugin binaries under live pods: an attachment made by one side is CHECKed and
DELeted by the other, through our runner (`pycni add/check/del`), and nothing is left.

The reference here is Debian's v1.1.1 (/usr/lib/cni), whose masquerade and portmap use iptables,
so this exercises what both sides share: the host-local store, veth and ifb names, the bridge,
tc, and the macspoofchk nftables layout (pkg/link/spoofcheck.go). The masquerade and portmap
nftables naming of v1.9 is pinned by literal strings in test_parity.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cnitest import BIN, REFERENCE_BIN, REFERENCE_PLUGINS, Netns
from rootskips import skip_unless
from test_runtime_netns import Pycni

pytestmark = [pytest.mark.root,
              skip_unless((REFERENCE_BIN / "bridge").exists(), REFERENCE_PLUGINS)]

SIDES = {"ours": str(BIN), "ref": str(REFERENCE_BIN)}
CAPS = {"bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                      "egressRate": 4_000_000, "egressBurst": 400_000}}


def conflist(store: Path) -> dict:
    return {"cniVersion": "1.0.0", "plugins": [
        {"type": "bridge", "bridge": "cni-swap0", "isGateway": True, "macspoofchk": True,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": str(store),
                  "ranges": [[{"subnet": "10.84.0.0/24"}], [{"subnet": "fd84::/64"}]],
                  "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}


def leftovers(host: Netns, pod: Netns, store: Path, pycni: Pycni) -> dict:
    links = host.links()
    objs = host.nft_ruleset().get("nftables", [])
    return {
        "veths": sorted(n for n, link in links.items()
                        if link.get("linkinfo", {}).get("info_kind") == "veth"),
        "ifbs": sorted(n for n in links if n.startswith("bwp")),
        "spoof chains": sorted(o["chain"]["name"] for o in objs if "chain" in o
                               and o["chain"]["name"].startswith("cni-br-iface-")),
        "nft rules": sorted(o["rule"].get("comment", "") for o in objs if "rule" in o
                            and o["rule"].get("comment")),
        "reservations": sorted(p.name for p in (store / "swapnet").glob("*")
                               if p.name != "lock" and not p.name.startswith("last_")),
        "pod eth0": "eth0" in pod.links(),
        "cache": pycni.cached(),
    }


@pytest.mark.parametrize("adder,other", [("ours", "ref"), ("ref", "ours")])
def test_add_by_one_side_check_and_del_by_the_other(host: Netns, pod: Netns, tmp_path: Path,
                                                    adder: str, other: str) -> None:
    store = tmp_path / "store"
    runners = {side: Pycni(host, tmp_path, path) for side, path in SIDES.items()}
    runners["ours"].conflist("swapnet", conflist(store))
    env = {"CAP_ARGS": json.dumps(CAPS), "CNI_CONTAINERID": "swap-ctr1"}

    result = json.loads(runners[adder]("add", "swapnet", pod.path, **env).stdout)
    veth = result["interfaces"][1]["name"]
    ifb = next(i["name"] for i in result["interfaces"] if i["name"].startswith("bwp"))
    assert host.links()[veth]["master"] == "cni-swap0" and ifb in host.links()
    chains = leftovers(host, pod, store, runners[adder])["spoof chains"]
    assert chains == ["cni-br-iface-swap-ctr1-eth0", "cni-br-iface-swap-ctr1-eth0-mac"]

    runners[other]("check", "swapnet", pod.path, **env)
    runners[other]("del", "swapnet", pod.path, **env)
    assert leftovers(host, pod, store, runners[other]) == {
        "veths": [], "ifbs": [], "spoof chains": [], "nft rules": [], "reservations": [],
        "pod eth0": False, "cache": []}


def test_gc_without_args_as_cnitool_succeeds_and_leaves_nothing(host: Netns, pod: Netns,
                                                                 tmp_path: Path) -> None:
    """libcni's GCNetworkList without args DELs every cached attachment, then sends GC with no
    valid-attachments key to every plugin: each must succeed (host-local used to refuse, 7)."""
    store = tmp_path / "store"
    pycni = Pycni(host, tmp_path, str(BIN))
    body = conflist(store) | {"cniVersion": "1.1.0"}
    body["plugins"] = [{"type": "loopback"}, *body["plugins"],
                       {"type": "portmap", "capabilities": {"portMappings": True}}]
    pycni.conflist("swapnet", body)
    caps = CAPS | {"portMappings": [{"hostPort": 18084, "containerPort": 80, "protocol": "tcp"}]}
    pycni("add", "swapnet", pod.path, CAP_ARGS=json.dumps(caps))
    assert pycni.cached()
    proc = pycni("gc", "swapnet", CAP_ARGS=json.dumps(caps))
    assert proc.returncode == 0
    assert leftovers(host, pod, store, pycni) == {
        "veths": [], "ifbs": [], "spoof chains": [], "nft rules": [], "reservations": [],
        "pod eth0": False, "cache": []}
