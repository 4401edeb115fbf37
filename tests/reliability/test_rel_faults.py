"""Fault injection: SIGKILL a plugin (or the runtime, or the daemon) at a random moment of ADD.

After every kill the runtime's answer is DEL (or, when the attachment is lost with its pod, GC):
it must leave no reservation, veth, ifb, qdisc, nft rule or cache file, and the next ADD of the
same pod must succeed. Short runs try ~20 kills per target, PYCNI_LONG=1 runs hundreds.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import figures
import leakcheck
import pytest
from cnitest import Netns, destroy_netns
from relharness import (
    VERB,
    Net,
    Runtime,
    count,
    descendants,
    exec_phase,
    exec_plugin,
    kill_after,
    need_plugins,
    need_runtime,
    pod_caps,
    random_delay,
    spawn_add,
    tally_phases,
    timed,
)

pytestmark = pytest.mark.root


@dataclass
class Target:
    """One plugin set up to be ADDed again and again into the same pod."""

    plugin: str
    netns: str
    ifname: str
    conf: Callable[[str], dict[str, Any]]
    check_add: Callable[[Any], None] = lambda out: None
    ignore_links: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def _prev(pod: Netns, ip: str, host_veth: str = "") -> dict[str, Any]:
    ifaces: list[dict[str, Any]] = [{"name": "eth0", "sandbox": pod.path}]
    if host_veth:
        ifaces.insert(0, {"name": host_veth})
    return {"cniVersion": "1.1.0", "interfaces": ifaces,
            "ips": [{"address": f"{ip}/24", "interface": len(ifaces) - 1,
                     "gateway": "10.77.0.1"}]}


def _has_ip(out: Any) -> None:
    assert isinstance(out, dict) and out.get("ips"), out


def make_target(plugin: str, host: Netns, pod: Netns, net: Net) -> Target:
    if plugin == "loopback":
        return Target(plugin, pod.path, "lo",
                      lambda cid: {"cniVersion": "1.1.0", "name": net.name, "type": "loopback"},
                      _has_ip)
    if plugin == "host-local":
        return Target(plugin, pod.path, "eth0", lambda cid: net.host_local(), _has_ip)
    if plugin == "bridge":
        return Target(plugin, pod.path, "eth0", lambda cid: net.bridge_conf(), _has_ip)
    if plugin == "portmap":
        # a veth toward the pod, as bridge would leave it: portmap looks up the route to the pod
        veth = "vethrlpm0"
        host.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", pod.name)
        host.run("ip", "addr", "add", "10.77.0.1/24", "dev", veth)
        host.run("ip", "link", "set", veth, "up")
        pod.run("ip", "addr", "add", "10.77.0.9/24", "dev", "eth0")
        pod.run("ip", "link", "set", "eth0", "up")
        return Target(plugin, pod.path, "eth0", lambda cid: net.portmap_conf(
            _prev(pod, "10.77.0.9"),
            [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
             {"hostPort": 18053, "containerPort": 53, "protocol": "udp"}]),
            ignore_links=(veth,))
    if plugin == "bandwidth":
        # bandwidth shapes a veth someone else made: make the pair the way bridge would.
        veth = "vethrlbw0"
        host.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", pod.name)
        host.run("ip", "link", "set", veth, "up")
        pod.run("ip", "link", "set", "eth0", "up")
        return Target(plugin, pod.path, "eth0",
                      lambda cid: net.bandwidth_conf(_prev(pod, "10.77.0.9", veth)),
                      ignore_links=(veth,))
    raise ValueError(plugin)


def _run_plugin(host: Netns, t: Target, command: str, cid: str) -> tuple[int, Any, str]:
    return exec_plugin(host, t.plugin, command, t.conf(cid), cid, t.netns, t.ifname, t.extra_env)


def _ok(host: Netns, t: Target, command: str, cid: str) -> Any:
    code, out, err = _run_plugin(host, t, command, cid)
    assert code == 0, f"{t.plugin} {command} {cid}: {code} {out} {err[-1500:]}"
    return out


def _clean_after_del(host: Netns, t: Target, net: Net, what: str) -> None:
    leakcheck.assert_none(host, net.data_dir, net.cache_dir, ignore_links=t.ignore_links,
                          context=what)
    if t.plugin == "bandwidth":
        # its qdiscs sit on a veth it does not own: DEL must still take the ifb and the redirect
        qd = [q for q in leakcheck.qdiscs(host) if q.get("dev") in t.ignore_links]
        assert not [q for q in qd if q.get("kind") == "ingress"], f"{what}: {qd}"


def kill_plugin_during_add(host: Netns, t: Target, net: Net, rng: random.Random,
                           n: int, name: str) -> None:
    cid0 = "rlcal-0"
    typical = timed(lambda: t.check_add(_ok(host, t, "ADD", cid0)))
    _ok(host, t, "DEL", cid0)
    _clean_after_del(host, t, net, "calibration")
    outcomes = []
    for i in range(n):
        cid = f"rlk{i}-{rng.randrange(1 << 20):05x}"
        proc = spawn_add(host, t.plugin, cid, t.netns, t.ifname, t.extra_env)
        # the last kill waits for the verb: at least one lands inside it, however fast the box
        last = i == n - 1
        delay = 0.0 if last else random_delay(rng, typical)
        outcome = kill_after(proc, delay, stdin=json.dumps(t.conf(cid)).encode(),
                             until_verb=last)
        outcomes.append(outcome)
        what = (f"{t.plugin} kill #{i} after {delay:.3f}s (landed={outcome.landed} "
                f"in {outcome.phase or '-'})")
        _ok(host, t, "DEL", cid)
        _clean_after_del(host, t, net, what)
        t.check_add(_ok(host, t, "ADD", cid))
        _ok(host, t, "DEL", cid)
        _clean_after_del(host, t, net, what + ", then ADD+DEL")
    phases = tally_phases(outcomes)
    figures.record(name, plugin=t.plugin, kills=n, landed_mid_add=sum(phases.values()),
                   landed_by_phase=phases, failures=0, leaks=0, typical_add_s=round(typical, 3))
    assert phases[VERB] >= 1, f"no kill landed after the verb started: {phases}"


PLUGINS = ["loopback", "host-local", "bridge", "portmap", "bandwidth"]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_kill_plugin_during_add(plugin: str, host: Netns, pod: Netns, net: Net,
                                rng: random.Random) -> None:
    need_plugins(plugin)
    t = make_target(plugin, host, pod, net)
    kill_plugin_during_add(host, t, net, rng, count(8, 8), f"kill-{plugin}")


@pytest.mark.slow
@pytest.mark.parametrize("plugin", PLUGINS)
def test_kill_plugin_during_add_long(plugin: str, host: Netns, pod: Netns, net: Net,
                                     rng: random.Random) -> None:
    need_plugins(plugin)
    t = make_target(plugin, host, pod, net)
    kill_plugin_during_add(host, t, net, rng, count(8, 300), f"kill-{plugin}-long")


# ---- the whole chain through the runtime -----------------------------------------------------

def _plugin_children(proc: subprocess.Popen, rng: random.Random) -> list[int]:
    """One plugin process the runtime is running right now (none if it is between plugins)."""
    kids = descendants(proc.pid)
    return [rng.choice(kids)] if kids else []


def kill_chain_during_add(host: Netns, runtime: Runtime, netns_factory: Callable[[str], Netns],
                          rng: random.Random, n: int, mode: str, name: str) -> None:
    """mode: 'all' kills runtime and plugin; 'plugin' only the running plugin; 'lost' kills all,
    deletes the pod too and recovers with GC alone (the runtime forgot the attachment)."""
    net = runtime.net
    pod = netns_factory("rlpod")
    typical = timed(lambda: runtime.ok("add", pod.path, "rlcal-0", pod_caps(19000)))
    runtime.ok("del", pod.path, "rlcal-0", pod_caps(19000))
    leakcheck.assert_none(host, net.data_dir, net.cache_dir, context="calibration")
    outcomes = []
    for i in range(n):
        cid = f"rlc{i}-{rng.randrange(1 << 20):05x}"
        caps = pod_caps(19001 + i % 500)
        proc = runtime.popen("add", pod.path, cid, caps)
        targets = (lambda p: _plugin_children(p, rng)) if mode == "plugin" else None
        last = i == n - 1
        delay = 0.0 if last else random_delay(rng, typical)
        outcome = kill_after(proc, delay, targets, phase=_chain_phase, until_verb=last)
        outcomes.append(outcome)
        what = (f"chain/{mode} kill #{i} after {delay:.3f}s (landed={outcome.landed} "
                f"in {outcome.phase or '-'})")
        if mode == "lost":
            destroy_netns(pod, host)
            code, out, err = runtime.run_gc(valid=[])
            assert code == 0, f"{what}: gc failed: {out} {err[-1500:]}"
            leakcheck.assert_none(host, net.data_dir, net.cache_dir, context=what + " + gc")
            pod = netns_factory("rlpod")
        else:
            runtime.ok("del", pod.path, cid, caps)
            leakcheck.assert_none(host, net.data_dir, net.cache_dir, context=what + " + del")
        out = runtime.ok("add", pod.path, cid, caps)
        assert out and out.get("ips"), f"{what}: {out}"
        runtime.ok("del", pod.path, cid, caps)
        leakcheck.assert_none(host, net.data_dir, net.cache_dir, context=what + ", ADD+DEL")
    phases = tally_phases(outcomes)
    figures.record(name, target=f"chain/{mode}", kills=n, landed_mid_add=sum(phases.values()),
                   landed_by_phase=phases, failures=0, leaks=0, typical_add_s=round(typical, 3))
    assert phases[VERB] >= 1, f"no kill landed after a plugin's verb started: {phases}"


def _chain_phase(proc: subprocess.Popen, targets) -> str:
    """VERB once a plugin the runtime runs has started its verb (the runtime's own process
    loads config models too: it does not count)."""
    return exec_phase(proc, list(targets) or _children(proc.pid) or [-1])


def _children(pid: int) -> list[int]:
    """The runtime's plugin processes (its children: quicker than a walk of /proc, which a
    plugin's verb can finish within)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(kid) for kid in f.read().split()]
    except OSError:
        return []


CHAIN_MODES = ["all", "plugin", "lost"]


def _need_chain() -> None:
    need_runtime()
    need_plugins(*PLUGINS)


@pytest.mark.parametrize("mode", CHAIN_MODES)
def test_kill_chain_during_add(mode: str, host: Netns, runtime: Runtime, netns_factory,
                               rng: random.Random) -> None:
    _need_chain()
    kill_chain_during_add(host, runtime, netns_factory, rng, count(2, 2), mode,
                          f"kill-chain-{mode}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", CHAIN_MODES)
def test_kill_chain_during_add_long(mode: str, host: Netns, runtime: Runtime, netns_factory,
                                    rng: random.Random) -> None:
    _need_chain()
    kill_chain_during_add(host, runtime, netns_factory, rng, count(2, 150), mode,
                          f"kill-chain-{mode}-long")
