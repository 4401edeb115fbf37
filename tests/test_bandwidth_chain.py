"""bridge + bandwidth chained through the real plugins, as a runtime runs them."""

from __future__ import annotations

import pytest
from bandwidth_util import ifbs, kinds, redirect_targets, tbf_of
from bridge_util import conf as bridge_conf
from bridge_util import ipam_path

from cni.host import tc
from cni.plugins.bandwidth import ifb_name

pytestmark = pytest.mark.root

MBIT = 1_000_000


def test_bridge_then_bandwidth_shapes_the_bridge_veth(plugins, host, pod, tmp_path) -> None:
    bridge = bridge_conf(tmp_path, version="1.1.0")
    prev = plugins.ok("bridge", "ADD", bridge, netns=pod.path, path=ipam_path())
    veth = next(i["name"] for i in prev["interfaces"]
                if not i.get("sandbox") and i["name"] != "cni0")
    bw = {"cniVersion": "1.1.0", "name": "testnet", "type": "bandwidth",
          "capabilities": {"bandwidth": True},
          "runtimeConfig": {"bandwidth": {"ingressRate": 10 * MBIT, "ingressBurst": 80_000,
                                          "egressRate": 20 * MBIT, "egressBurst": 160_000}}}
    out = plugins.ok("bandwidth", "ADD", bw | {"prevResult": prev}, netns=pod.path)
    name = ifb_name("testnet", "ctr1")
    assert out["interfaces"][:len(prev["interfaces"])] == prev["interfaces"]
    assert out["interfaces"][-1]["name"] == name
    assert tbf_of(host, veth) == tc.tbf_for(10 * MBIT, 80_000)
    assert tbf_of(host, name) == tc.tbf_for(20 * MBIT, 160_000)
    assert redirect_targets(host, veth) == [name]
    gateway = next(ip["gateway"] for ip in prev["ips"] if "gateway" in ip)
    pod.run("ping", "-c2", "-W2", gateway)  # traffic still flows through the shaping
    plugins.ok("bridge", "CHECK", bridge | {"prevResult": out}, netns=pod.path,
               path=ipam_path())
    plugins.ok("bandwidth", "CHECK", bw | {"prevResult": out}, netns=pod.path)
    # DEL in reverse order, as libcni does
    plugins.ok("bandwidth", "DEL", bw | {"prevResult": out}, netns=pod.path)
    assert name not in ifbs(host) and kinds(host, veth) == ["noqueue"]
    plugins.ok("bridge", "DEL", bridge | {"prevResult": out}, netns=pod.path, path=ipam_path())
