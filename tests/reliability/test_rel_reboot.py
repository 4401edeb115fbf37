"""Reboots and lost pods: the namespaces are gone, the store and the result cache are not.

The reference's top complaint is leaked IPs and "duplicate allocation" after a reboot. Here the
range holds exactly as many addresses as there are pods, so one leaked reservation makes a
restarted pod fail: `pycni gc <net>` with an empty valid list must free everything at once.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import figures
import leakcheck
import pytest
from cnitest import Netns, destroy_netns
from relharness import PLUGIN_MODULES, Net, Runtime, count, need, need_runtime, pod_caps

pytestmark = pytest.mark.root

SCENARIOS = {
    "reboot": "host and pod namespaces gone (a new host namespace), store and cache on disk",
    "pods-gone": "pod namespaces gone, host keeps its nft rules, ifbs and bridge",
    "cache-lost": "pods gone and the result cache wiped: only the plugins' own GC can help",
}


def _ns_del(ns: Netns) -> None:
    subprocess.run(["ip", "netns", "del", ns.name], check=True)


def reboot_cycle(scenario: str, netns_factory: Callable[[str], Netns], net: Net,
                 conf_dir, pods: int, name: str) -> None:
    need_runtime()
    need(*PLUGIN_MODULES.values())
    net.range_start, net.range_end = "10.77.0.10", f"10.77.0.{9 + pods}"
    host = netns_factory("rlhost")
    rt = Runtime(host, net, conf_dir)
    rt.write_conflist()
    cids = [f"rlboot{i}" for i in range(pods)]
    first: dict[str, str] = {}
    live = []
    for i, cid in enumerate(cids):
        pod = netns_factory("rlpod")
        first[cid] = rt.ok("add", pod.path, cid, pod_caps(20000 + i))["ips"][0]["address"]
        live.append(pod)
    # the range is full now: one more pod must be refused (so a single leak is visible below)
    extra = netns_factory("rlpod")
    code, _, err = rt.run("add", extra.path, "rlboot-extra", pod_caps(20999))
    assert code != 0, "the range should have been exhausted"
    assert len(leakcheck.reservations(net.data_dir)) == pods
    assert len(leakcheck.cache_files(net.cache_dir)) == pods

    for pod in live:
        destroy_netns(pod, host)
    if scenario == "reboot":
        _ns_del(host)
        host = netns_factory("rlhost")
        rt = Runtime(host, net, conf_dir)
    if scenario == "cache-lost":
        shutil.rmtree(net.cache_dir)

    code, out, err = rt.run_gc(valid=[])
    assert code == 0, f"gc failed: {out} {err[-2000:]}"
    leakcheck.assert_none(host, net.data_dir, net.cache_dir, context=f"{scenario}: after gc")

    # restarted pods, same IDs: each gets an address at the first try
    again = []
    for i, cid in enumerate(cids):
        pod = netns_factory("rlpod")
        out = rt.ok("add", pod.path, cid, pod_caps(20000 + i))
        assert out["ips"][0]["address"].startswith("10.77.0."), out
        again.append((pod, cid, i))
    for pod, cid, i in again:
        rt.ok("del", pod.path, cid, pod_caps(20000 + i))
    leakcheck.assert_none(host, net.data_dir, net.cache_dir, context=f"{scenario}: at the end")
    figures.record(name, scenario=scenario, pods=pods, failures=0, leaks=0)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_reboot_then_gc_frees_everything(scenario: str, netns_factory, net: Net,
                                         tmp_path) -> None:
    reboot_cycle(scenario, netns_factory, net, tmp_path / "net.d", count(2, 2),
                 f"reboot-{scenario}")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_reboot_then_gc_frees_everything_long(scenario: str, netns_factory, net: Net,
                                              tmp_path) -> None:
    for round_ in range(count(1, 5)):
        reboot_cycle(scenario, netns_factory, net, tmp_path / f"net.d{round_}", count(2, 30),
                     f"reboot-{scenario}-long")
