"""Differential: the reference Go bridge (+ its host-local) and ours, same conflist, same
results and the same addresses and routes in the pod (ipMasq off: the reference's is iptables)."""

from __future__ import annotations

import re

import pytest
from bridge_util import DUAL, conf, ipam_path
from cnitest import REFERENCE_BIN, Plugins

pytestmark = pytest.mark.root

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def normalize(result: dict, pod_path: str) -> dict:
    """Random host veth names, MACs and the sandbox path replaced by placeholders."""
    out = dict(result)
    ifaces = []
    for i in result.get("interfaces", []):
        i = dict(i)
        assert _MAC.match(i.get("mac", "")), i
        i["mac"] = "MAC"
        if re.fullmatch(r"veth[0-9a-f]{8}", i["name"]):
            i["name"] = "VETH"
        if i.get("sandbox") == pod_path:
            i["sandbox"] = "SANDBOX"
        ifaces.append(i)
    if ifaces:
        out["interfaces"] = ifaces
    if out.get("dns") == {} and out["cniVersion"] >= "1.0.0":
        del out["dns"]  # the 1.1.1 oracle prints an empty dns at 1.0.0; v1.9.1 and ours do not
    return out


def pod_state(pod) -> dict:
    addrs = [f"{a['local']}/{a['prefixlen']}"
             for a in pod.ip("addr", "show", "dev", "eth0")[0]["addr_info"]
             if a and a.get("scope") == "global"]
    routes = [{k: r.get(k) for k in ("dst", "gateway", "dev", "protocol", "scope")}
              for fam in ("-4", "-6") for r in pod.ip(fam, "route", "show")
              if not r["dst"].startswith("fe80")]
    return {"addrs": addrs, "routes": routes, "mtu": pod.links()["eth0"]["mtu"],
            "up": "UP" in pod.links()["eth0"]["flags"]}


@pytest.mark.parametrize("version", ["1.0.0", "0.4.0", "0.3.1", "0.2.0"])
@pytest.mark.parametrize("keys", [
    {"isDefaultGateway": True, "ranges": DUAL},
    {"isGateway": True, "mtu": 1400, "hairpinMode": True},
    {"isGateway": False, "subnet": "10.30.0.0/16"},
    # The reference's result carries types.DNS: its four keys (found however cased), nothing else.
    {"dns": {"Nameservers": ["10.22.0.53"], "domain": "pods.test", "search": [],
             "sortlist": ["10.22.0.0/24"]}},
], ids=["dual-default-gw", "mtu-hairpin", "no-gateway", "dns"])
def test_same_result_and_pod_state_as_the_reference(netns_factory, tmp_path, version,
                                                    keys) -> None:
    results, states = [], []
    for who in ("reference", "ours"):
        host = netns_factory("pycni-host")
        pod = netns_factory("pycni-pod")
        runner = Plugins(host)
        c = conf(tmp_path / who, version=version, **keys)
        if who == "reference":
            out = runner.ok("bridge", "ADD", c, netns=pod.path, bin_dir=REFERENCE_BIN,
                            path=str(REFERENCE_BIN))
        else:
            out = runner.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path())
        results.append(normalize(out, pod.path))
        states.append(pod_state(pod))
        host_veth = next(n for n in host.links() if n.startswith("veth"))
        states[-1]["host_mtu"] = host.links()[host_veth]["mtu"]
        states[-1]["bridge_addrs"] = [a for a in host.addresses("cni0")
                                      if not a.startswith("fe80")]
    assert results[1] == results[0]
    assert states[1] == states[0]
