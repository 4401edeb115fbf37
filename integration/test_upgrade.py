"""Upgrading pycni on a node with live pods (#33 item 4): version N installed from its wheel into a
venv outside the tree, plugins installed from it, its daemon serving containerd's CRI (the shims'
fallback off: every plugin call goes through a daemon); pods made under N, and a churn of pods
through CRI; then the wheel of N+1 (this tree with its version bumped) pip-installed into the same
venv and `pycni install --force` run while the churn goes on, and while a loop execs the plugins
(VERSION, and a real verb through the daemon).

Asserted: no CRI call and no exec fails; no two live pods share an address, and the host-local
store holds exactly one address per live pod; the daemon answering afterwards is another process
reporting N+1 (status query), and it serves: the CHECK of the pods made under N (as libcni runs
it, with their cached args) and their deletion through CRI; nothing is left at the end (veths,
reservations, cache entries, qdiscs, nft rules naming a pod)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import wheels
from clients import ENV, cri_conflist, need, wait_for
from crinode import (
    CRINode,
    cri_node,
    firewall,
    rules_naming,
    run_web_pod,
    shared_leftovers,
    wait_host_port,
)

import cni
from cni.fast import status

pytestmark = pytest.mark.root

CHURN_MAX = 120  # pod cycles at most; the churn stops earlier once the upgrade is well behind it
AFTER_UPGRADE = 3  # cycles the churn must complete after `pycni install` returned
CHAIN = 3  # bridge, portmap, bandwidth (CRI adds loopback itself)


def bumped(version: str) -> str:
    """N+1: the last numeric part of N plus one."""
    parts = version.split(".")
    return ".".join([*parts[:-1], str(int(parts[-1]) + 1)])


@pytest.fixture(scope="module")
def wheel_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel of this tree (N) and of a copy of it whose version is bumped (N+1)."""
    base = tmp_path_factory.mktemp("upgrade-wheels")
    _, old = wheels.build(base / "dist-n")
    tree = base / "tree-n1"
    shutil.copytree(wheels.ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "__pycache__", "*.egg-info", ".*_cache"))
    init = tree / "cni" / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{cni.__version__}"' in text
    init.write_text(text.replace(f'"{cni.__version__}"', f'"{bumped(cni.__version__)}"'))
    _, new = wheels.build(base / "dist-n1", src=tree)
    assert f"\nVersion: {bumped(cni.__version__)}\n" in wheels.wheel_metadata(new)
    return old, new


def user_env(**extra: str) -> dict[str, str]:
    return {"PATH": ENV["PATH"], "HOME": "/root", "PYCNI_SYSTEMD": "0", **extra}


@dataclass
class Churn:
    """Pods made and deleted through CRI, one after another, in a thread; every call's error
    and every pod's life (its addresses, when it was up) kept for the assertions."""

    n: CRINode
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    lives: list[tuple[str, list[str], float, float]] = field(default_factory=list)
    cycles: int = 0

    def run(self) -> None:
        while not self.stop.is_set() and self.cycles < CHURN_MAX:
            try:
                pod = self.n.cri.run_pod(f"churn-{self.cycles}", cgroup_parent=self.n.cgroup)
                born = time.monotonic()
                ip, more = self.n.cri.pod_ip(pod.id)
                self.n.cri.stop_remove(pod.id)
                self.lives.append((pod.id, [ip, *more], born, time.monotonic()))
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                self.errors.append(f"cycle {self.cycles}: {e!r}")
            self.cycles += 1


@dataclass
class ExecLoop:
    """A runtime exec'ing the installed plugins over and over: VERSION by each name, and a
    loopback ADD in a netns of the node's own (through the daemon, fallback off)."""

    n: CRINode
    bin_dir: Path
    env: dict[str, str]
    netns: str
    stop: threading.Event = field(default_factory=threading.Event)
    failures: list[str] = field(default_factory=list)
    runs: int = 0

    def call(self, plugin: str, command: str, stdin: str) -> None:
        env = {"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir), **self.env}
        if command != "VERSION":
            env |= {"CNI_CONTAINERID": "upgrade-exec-loop", "CNI_NETNS": self.netns,
                    "CNI_IFNAME": "lo"}
        proc = self.n.node.run(str(self.bin_dir / plugin), input=stdin, env=env, check=False)
        self.runs += 1
        want = '"supportedVersions"' if command == "VERSION" else '"name": "lo"'
        if proc.returncode != 0 or want not in proc.stdout:
            self.failures.append(f"{plugin} {command}: {proc.returncode} {proc.stdout!r} "
                                 f"{proc.stderr[-2000:]!r}")

    def run(self) -> None:
        lo = json.dumps({"cniVersion": "1.0.0", "name": "upgrade-lo", "type": "loopback"})
        while not self.stop.is_set():
            for plugin in ("bridge", "portmap", "bandwidth", "host-local", "loopback"):
                self.call(plugin, "VERSION", '{"cniVersion": "1.0.0"}')
            self.call("loopback", "ADD", lo)


def in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def pod_netns(n: CRINode, pod_id: str) -> str:
    """The pod's network namespace path, as containerd passed it to CNI (its runtime spec)."""
    info = json.loads(n.cri.pod_status(pod_id, verbose=True).info["info"])
    [path] = [ns["path"] for ns in info["runtimeSpec"]["linux"]["namespaces"]
              if ns["type"] == "network"]
    return path


def runner_check(n: CRINode, pycni: Path, network: str, pod_id: str, *, bin_dir: Path,
                 conf_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """CHECK of a pod's attachment as libcni runs it (CRI has no CHECK call): the venv's
    runner, the cached capability and CNI args, the plugins in bin_dir, the daemon's env."""
    entry = json.loads((n.state / "results" / f"{network}-{pod_id}-eth0").read_text())
    env = {**env, "NETCONFPATH": str(conf_dir), "CNI_PATH": str(bin_dir),
           "CNI_CONTAINERID": pod_id, "CAP_ARGS": json.dumps(entry["capabilityArgs"]),
           "CNI_ARGS": ";".join(f"{k}={v}" for k, v in entry.get("cniArgs", []))}
    return n.node.run(str(pycni), "check", network, pod_netns(n, pod_id), env=env, check=False,
                      cwd="/")


def settled(sock: str) -> dict:
    """The daemon's figures once every request it started is answered (a reply reaches the
    shim a moment before the daemon counts it)."""
    def figures() -> dict | None:
        got = status.query(sock, timeout=30)
        assert got is not None, f"no daemon answers on {sock}"
        return got if got["started"] == got["answered"] and not got["queued"] else None
    return wait_for("the daemon to count every answer", figures, timeout=60, interval=0.1)


def reservations(n: CRINode, network: str) -> dict[str, str]:
    """host-local's store: address -> the container ID holding it."""
    store = n.state / "networks" / network
    if not store.is_dir():
        return {}
    return {p.name: p.read_bytes().split(b"\r\n")[0].decode() for p in store.iterdir()
            if p.name != "lock" and not p.name.startswith("last_reserved_ip")}


def overlapping_addresses(lives: list[tuple[str, list[str], float, float]]) -> list[str]:
    """Addresses two pods held at the same time."""
    out = []
    for i, (a, ips_a, born_a, died_a) in enumerate(lives):
        for b, ips_b, born_b, died_b in lives[i + 1:]:
            if born_a < died_b and born_b < died_a and set(ips_a) & set(ips_b):
                out.append(f"{a} and {b}: {set(ips_a) & set(ips_b)}")
    return out


@pytest.fixture
def venv(tmp_path, wheel_pair) -> Iterator[wheels.Venv]:
    yield wheels.make_venv(tmp_path / "venv", wheel_pair[0])


def test_upgrade_under_live_pods(node_netns, oci_image, pause_image, tmp_path, venv,
                                 wheel_pair) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc", "nft")
    old, new = cni.__version__, bumped(cni.__version__)
    conf = cri_conflist()
    network = conf["name"]
    conflist = tmp_path / f"{network}.conflist"
    conflist.write_text(json.dumps(conf))
    bin_dir, conf_dir = tmp_path / "cni" / "bin", tmp_path / "cni" / "net.d"
    dirs = ("--bin-dir", bin_dir, "--conf-dir", conf_dir, "--conflist", conflist, "--no-systemd")
    venv.run(venv.pycni, "install", *dirs, cwd=tmp_path, env=user_env())  # N's
    manifest = json.loads((bin_dir / ".pycni-install.json").read_text())

    with cri_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir,
                  images=[pause_image, oci_image], daemon=True, pycni=venv.pycni) as n:
        assert n.daemon is not None
        sock = str(n.daemon.socket)
        before = status.query(sock, timeout=30)
        assert before is not None and before["version"] == old, before

        # ---- pods made under N: the web pod (hostPort, bandwidth, httpd) and a plain one
        web, web_ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        plain = n.cri.run_pod("plain", cgroup_parent=n.cgroup)
        ip, more = n.cri.pod_ip(plain.id)
        live = {web.id: web_ips, plain.id: [ip, *more]}  # the pods made under N
        wait_host_port(n, web_ips)
        under_n = status.query(sock, timeout=30)
        assert under_n is not None and under_n["answered"] >= 2 * CHAIN, under_n

        # ---- the churn and the exec loop, then the upgrade under them
        n.node.run("ip", "netns", "add", "pycni-upgrade-lo")
        churn = Churn(n)
        execs = ExecLoop(n, bin_dir, n.daemon.env, "/run/netns/pycni-upgrade-lo")
        threads = [in_thread(churn.run), in_thread(execs.run)]
        try:
            wait_for("the churn's first pod", lambda: churn.cycles >= 1 or churn.errors,
                     timeout=180, interval=0.2)
            venv.install(wheel_pair[1])  # pip: N+1 into the same venv, over N
            said = venv.run(venv.pycni, "install", "--force", *dirs, cwd=tmp_path,
                            env=user_env(PYCNI_SOCKET=sock))
            assert "handed over to pid" in said and f"({new})" in said, said
            upgraded_at = churn.cycles
            wait_for(f"{AFTER_UPGRADE} churn cycles after the upgrade",
                     lambda: churn.cycles >= upgraded_at + AFTER_UPGRADE or churn.errors
                     or churn.cycles >= CHURN_MAX, timeout=300, interval=0.2)
        finally:
            churn.stop.set()
            execs.stop.set()
            for thread in threads:
                thread.join(timeout=300)
        assert churn.errors == [], churn.errors
        assert churn.cycles >= upgraded_at + AFTER_UPGRADE, (churn.cycles, upgraded_at)
        assert execs.failures == [], execs.failures
        assert execs.runs > 0

        # ---- the daemon now: another process, N+1, serving
        after = settled(sock)
        assert after["version"] == new, after
        assert after["pid"] != before["pid"]
        n.daemon.proc.wait(60)  # N's daemon finishes what it accepted and exits
        # install over its own files: replaced in place, no backup of them, one manifest
        assert not (bin_dir / ".pycni-backup").exists()
        assert [e["path"] for e in json.loads(
            (bin_dir / ".pycni-install.json").read_text())["entries"]] == \
            [e["path"] for e in manifest["entries"]]

        # ---- addresses: none held twice, the store = the live pods
        assert overlapping_addresses(churn.lives) == []
        assert sorted(n.cri.pod_ids()) == sorted(live)
        store = reservations(n, network)
        assert sorted(store.items()) == sorted((ip, pod_id) for pod_id, ips in live.items()
                                               for ip in ips), store

        # ---- N+1 checks and deletes the pods N made
        answered = after["answered"]
        for pod_id in live:
            proc = runner_check(n, venv.pycni, network, pod_id, bin_dir=bin_dir,
                                conf_dir=conf_dir, env=n.daemon.env)
            assert proc.returncode == 0, proc.stderr
        checked = settled(sock)
        assert checked["pid"] == after["pid"]
        assert checked["answered"] - answered == CHAIN * len(live), checked
        wait_host_port(n, web_ips)
        n.cri.stop_remove(web.id, web.containers)
        n.cri.stop_remove(plain.id)
        assert n.cri.pod_ids() == []
        deleted = settled(sock)
        assert deleted["pid"] == after["pid"] and deleted["answered"] > checked["answered"]

        # ---- nothing left
        n.node.run("ip", "netns", "del", "pycni-upgrade-lo")
        all_ids = [pod_id for pod_id, _, _, _ in churn.lives] + list(live)
        all_ips = sorted({ip for _, ips, _, _ in churn.lives for ip in ips}
                         | {ip for ips in live.values() for ip in ips})
        assert shared_leftovers(n, network, "") == []
        assert rules_naming(n.node, *all_ids) == []
        addresses = re.compile("|".join(rf"(?<![\d.]){re.escape(ip)}(?![\d.])" for ip in all_ips))
        assert [line for line in firewall(n.node) if addresses.search(line)] == []
        log = n.daemon.log.read_text()
        assert re.search(rf"handed over to successor {after['pid']}\b", log), log[-3000:]
        print(f"churn: {churn.cycles} pods ({upgraded_at} before install returned); execs: "
              f"{execs.runs}; N answered {under_n['answered']}+, N+1 {deleted['answered']}")
