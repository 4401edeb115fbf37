"""Upgrading pycni on a node with live pods (#33 item 4): version N installed from its wheel into a
venv outside the tree, plugins installed from it, its daemon serving containerd's CRI (the shims'
fallback off: every plugin call goes through a daemon); pods made under N, and a churn of pods
through CRI by two threads at once (each keeping two pods up, so lifetimes overlap); then the
wheel of N+1 (this tree with its version bumped) pip-installed into the same venv and
`pycni install --force` run three times, the first two at once (#37 item 4: two configuration
runs upgrading one node), while the churn goes on, a loop execs the plugins (VERSION, and
loopback's ADD, CHECK and DEL through the daemon), and one ADD is held inside its verb in N's
daemon across the handover (#37 item 8).

Asserted: every install succeeds, exactly one of them hands over; no CRI call and no exec fails;
no churn pod gets an address a live pod holds or one another pod holds at the same time, and
the host-local store holds exactly one address per live pod; the held ADD is answered by N's
daemon after it handed over (its log), and succeeds, while N+1's daemon serves meanwhile; the
daemon answering afterwards is another process reporting N+1 (status query), and it serves: the
CHECK of the pods made under N (as libcni runs it, with their cached args) and their deletion
through CRI; nothing is left at the end (veths, reservations, cache entries, qdiscs, nft rules
naming a pod)."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations
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
from cni.fast.procs import parent

pytestmark = pytest.mark.root

CHURN_MAX = 120  # pod cycles a churn makes at most; it stops once the installs are behind it
CHURN_UP = 2  # pods each churn keeps up: a pod is removed once the next one is up
AFTER_UPGRADE = 3  # cycles each churn must complete after the installs returned
CHAIN = 3  # bridge, portmap, bandwidth (CRI adds loopback itself)
HELD_ID = "upgrade-held"  # the container ID of the ADD held across the handover
HELD_SUBNET = "10.77.0.0/24"


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


Life = tuple[str, list[str], float, float]  # pod ID, its addresses, and when it surely held them


@dataclass
class Churn:
    """Pods made and deleted through CRI in a thread, CHURN_UP of them up at a time (the oldest
    removed once a new one is up); every call's error and every pod's life kept for the
    assertions: from RunPodSandbox's return to the StopPodSandbox call, the span in which the
    pod surely held its addresses."""

    n: CRINode
    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    lives: list[Life] = field(default_factory=list)
    cycles: int = 0

    def _remove(self, pod_id: str, ips: list[str], born: float) -> None:
        died = time.monotonic()
        try:
            self.n.cri.stop_remove(pod_id)
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            self.errors.append(f"removing {pod_id}: {e!r}")
        self.lives.append((pod_id, ips, born, died))

    def run(self) -> None:
        up: deque[tuple[str, list[str], float]] = deque()
        while not self.stop.is_set() and self.cycles < CHURN_MAX:
            try:
                pod = self.n.cri.run_pod(f"{self.name}-{self.cycles}",
                                         cgroup_parent=self.n.cgroup)
                born = time.monotonic()
                ip, more = self.n.cri.pod_ip(pod.id)
                up.append((pod.id, [ip, *more], born))
                if len(up) > CHURN_UP:
                    self._remove(*up.popleft())
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                self.errors.append(f"{self.name} cycle {self.cycles}: {e!r}")
            self.cycles += 1
        while up:
            self._remove(*up.popleft())


@dataclass
class ExecLoop:
    """A runtime exec'ing the installed plugins over and over: VERSION by each name, and
    loopback's ADD, CHECK (with the ADD's result) and DEL in a netns of the node's own (through
    the daemon, fallback off)."""

    n: CRINode
    bin_dir: Path
    env: dict[str, str]
    netns: str
    stop: threading.Event = field(default_factory=threading.Event)
    failures: list[str] = field(default_factory=list)
    runs: int = 0

    def call(self, plugin: str, command: str, stdin: str) -> dict | None:
        """One exec; its JSON answer (None if it failed, or said nothing as DEL and CHECK)."""
        env = {"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir), **self.env}
        if command != "VERSION":
            env |= {"CNI_CONTAINERID": "upgrade-exec-loop", "CNI_NETNS": self.netns,
                    "CNI_IFNAME": "lo"}
        proc = self.n.node.run(str(self.bin_dir / plugin), input=stdin, env=env, check=False)
        self.runs += 1
        want = {"VERSION": '"supportedVersions"', "ADD": '"name": "lo"'}.get(command)
        if proc.returncode != 0 or (want not in proc.stdout if want else proc.stdout.strip()):
            self.failures.append(f"{plugin} {command}: {proc.returncode} {proc.stdout!r} "
                                 f"{proc.stderr[-2000:]!r}")
            return None
        return json.loads(proc.stdout) if want else None

    def run(self) -> None:
        lo = {"cniVersion": "1.0.0", "name": "upgrade-lo", "type": "loopback"}
        while not self.stop.is_set():
            for plugin in ("bridge", "portmap", "bandwidth", "host-local", "loopback"):
                self.call(plugin, "VERSION", '{"cniVersion": "1.0.0"}')
            if (added := self.call("loopback", "ADD", json.dumps(lo))) is not None:
                self.call("loopback", "CHECK", json.dumps({**lo, "prevResult": added}))
            self.call("loopback", "DEL", json.dumps(lo))


@dataclass
class HeldAdd:
    """A host-local ADD held inside its verb: the test holds the flock host-local takes on its
    store for the whole operation (cni/ipam/store.py), so the daemon's child running the ADD
    waits there, past the point of no return (its ACK), until release()."""

    n: CRINode
    bin_dir: Path
    env: dict[str, str]
    netns: str
    data_dir: Path
    lock_fd: int = -1
    proc: subprocess.Popen | None = None
    answer: tuple[int, str, str] | None = None

    def conf(self) -> str:
        return json.dumps({"cniVersion": "1.0.0", "name": "upgrade-held", "type": "host-local",
                           "ipam": {"type": "host-local", "dataDir": str(self.data_dir),
                                    "ranges": [[{"subnet": HELD_SUBNET}]]}})

    def argv_env(self, command: str) -> tuple[list[str], dict[str, str]]:
        return [str(self.bin_dir / "host-local")], {
            "CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir), "CNI_CONTAINERID": HELD_ID,
            "CNI_NETNS": self.netns, "CNI_IFNAME": "eth0", **self.env}

    def start(self) -> int:
        """Lock the store, exec the ADD; the pid of the process that waits for the lock."""
        store = self.data_dir / "upgrade-held"
        store.mkdir(parents=True, mode=0o755)
        self.lock_fd = os.open(store / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        argv, env = self.argv_env("ADD")
        stdin = self.data_dir / "add.json"
        stdin.write_text(self.conf())
        with stdin.open() as f:
            self.proc = self.n.node.popen(*argv, env=env, stdin=f, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
        inode = os.fstat(self.lock_fd).st_ino
        return wait_for("the held ADD to wait for its store's lock",
                        lambda: flock_waiter(inode) or self.proc.poll() is not None,
                        timeout=120, interval=0.05)

    def release(self) -> tuple[int, str, str]:
        """Unlock the store; the ADD's exit code, stdout and stderr (once more: the same)."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1
        if self.answer is None and self.proc is not None:
            try:
                out, err = self.proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
            self.answer = self.proc.returncode, out, err
        return self.answer or (-1, "", "never started")

    def delete(self) -> subprocess.CompletedProcess:
        argv, env = self.argv_env("DEL")
        return self.n.node.run(*argv, input=self.conf(), env=env, check=False)


def flock_waiter(inode: int) -> int:
    """The pid of a process blocked on a lock of the file with this inode (/proc/locks' "->"
    lines: "N: -> FLOCK ADVISORY WRITE pid maj:min:inode start end"); 0 if none."""
    for line in Path("/proc/locks").read_text().splitlines():
        words = line.split()
        if len(words) > 6 and words[1] == "->" and words[6].rsplit(":", 1)[-1] == str(inode):
            return int(words[5])
    return 0


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        pid = parent(pid)
        if pid == ancestor:
            return True
    return False


def in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def at_once(*calls: Callable[[], str]) -> list[str | BaseException]:
    """Run the calls concurrently; each one's result, or the exception it raised."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.exception() or f.result() for f in futures]


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


def concurrent_lives(lives: list[Life]) -> list[tuple[Life, Life]]:
    """The pairs of pods that were up at the same time."""
    return [(a, b) for a, b in combinations(lives, 2) if a[2] < b[3] and b[2] < a[3]]


def overlapping_addresses(lives: list[Life]) -> list[str]:
    """Addresses two pods held at the same time."""
    return [f"{a[0]} and {b[0]}: {set(a[1]) & set(b[1])}" for a, b in concurrent_lives(lives)
            if set(a[1]) & set(b[1])]


def served(log: str, pid: int, label: str = "") -> list[int]:
    """Where in the daemon log (shared by N's daemon and its successor) the daemon `pid` says it
    served a request (whose label starts with `label`): the offsets of those lines."""
    line = re.compile(rf"^pycni\.daemon\[{pid}\]: DEBUG served {re.escape(label)}", re.M)
    return [m.start() for m in line.finditer(log)]


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

        # ---- two churns and the exec loop; under them an ADD held in N's daemon, and the
        # installs: two at once (one hands over), then a third
        n.node.run("ip", "netns", "add", "pycni-upgrade-lo")
        netns = "/run/netns/pycni-upgrade-lo"
        churns = [Churn(n, "churn-a"), Churn(n, "churn-b")]
        execs = ExecLoop(n, bin_dir, n.daemon.env, netns)
        held = HeldAdd(n, bin_dir, n.daemon.env, netns, tmp_path / "held-ipam")
        threads = [in_thread(c.run) for c in churns] + [in_thread(execs.run)]

        def install() -> str:
            return venv.run(venv.pycni, "install", "--force", *dirs, cwd=tmp_path,
                            env=user_env(PYCNI_SOCKET=sock))
        try:
            wait_for("each churn's first pods", lambda: all(c.cycles > CHURN_UP for c in churns)
                     or any(c.errors for c in churns), timeout=300, interval=0.2)
            venv.install(wheel_pair[1])  # pip: N+1 into the same venv, over N
            waiter = held.start()
            assert held.proc is not None and held.proc.poll() is None, held.release()
            assert descends_from(waiter, before["pid"]), (waiter, before)  # N's child waits
            holding = status.query(sock, timeout=30)  # N counts it started, not answered
            assert holding is not None and holding["pid"] == before["pid"], holding
            assert holding["started"] > holding["answered"], holding
            said = at_once(install, install)
            assert [s for s in said if not isinstance(s, str)] == [], "\n".join(
                ["installs:", *map(str, said), "exec failures:", *execs.failures])
            handed = [s for s in said if "handed over to pid" in s]
            assert len(handed) == 1 and f"({new})" in handed[0], said
            assert [s for s in said if f"runs {new} already" in s] != [], said
            # N+1's daemon serves while N's still runs the held ADD
            successor = status.query(sock, timeout=30)
            assert successor is not None and successor["version"] == new, successor
            assert successor["pid"] != before["pid"]
            wait_for("N+1's daemon to answer requests", lambda: (status.query(
                sock, timeout=30) or {}).get("answered", 0) > 0, timeout=60, interval=0.1)
            assert n.daemon.proc.poll() is None and held.proc.poll() is None
            assert flock_waiter(os.fstat(held.lock_fd).st_ino) == waiter
            held_code, held_out, held_err = held.release()
            n.daemon.proc.wait(60)  # N's daemon answered what it accepted, and exited
            upgraded_at = [c.cycles for c in churns]
            said.append(install())  # the third, back to back
            assert f"runs {new} already" in said[-1], said[-1]
            wait_for(f"{AFTER_UPGRADE} cycles of each churn after the installs",
                     lambda: all(c.cycles >= at + AFTER_UPGRADE or c.cycles >= CHURN_MAX
                                 for c, at in zip(churns, upgraded_at, strict=True))
                     or any(c.errors for c in churns), timeout=300, interval=0.2)
        finally:
            held.release()
            for c in churns:
                c.stop.set()
            execs.stop.set()
            for thread in threads:
                thread.join(timeout=300)
        assert [e for c in churns for e in c.errors] == []
        assert all(c.cycles >= at + AFTER_UPGRADE for c, at in zip(churns, upgraded_at,
                                                                    strict=True))
        assert execs.failures == [], execs.failures
        assert execs.runs > 0

        # ---- the held ADD: it succeeded, N's daemon answered it after handing over
        assert held_code == 0, (held_out, held_err)
        [held_ip] = json.loads(held_out)["ips"]
        assert ipaddress.ip_interface(held_ip["address"]) in ipaddress.ip_network(HELD_SUBNET)
        log = n.daemon.log.read_text()
        handover = re.search(rf"^pycni\.daemon\[{before['pid']}\]: INFO handed over to "
                             rf"successor {successor['pid']}\b", log, re.M)
        about = "\n".join(line for line in log.splitlines() if HELD_ID in line or "hand" in line)
        assert handover, about
        answers = served(log, before["pid"], f"host-local ADD {HELD_ID} ")
        assert [at > handover.start() for at in answers] == [True], about
        assert f"ERROR host-local ADD {HELD_ID}" not in log, about
        assert served(log, successor["pid"], f"host-local ADD {HELD_ID}") == []
        assert served(log, successor["pid"]) != []  # N+1's daemon served the others

        # ---- the daemon now: another process, N+1, serving
        after = settled(sock)
        assert after["version"] == new and after["pid"] == successor["pid"], after
        # install over its own files: replaced in place, no backup of them, one manifest
        assert not (bin_dir / ".pycni-backup").exists()
        assert [e["path"] for e in json.loads(
            (bin_dir / ".pycni-install.json").read_text())["entries"]] == \
            [e["path"] for e in manifest["entries"]]

        # ---- addresses: none held twice, the store = the live pods
        lives = [life for c in churns for life in c.lives]
        live_ips = {ip for ips in live.values() for ip in ips}
        assert [(pod_id, ips) for pod_id, ips, _, _ in lives if live_ips & set(ips)] == []
        churn_a = {pod_id for pod_id, *_ in churns[0].lives}
        assert any((a[0] in churn_a) != (b[0] in churn_a)  # the two churns' pods overlapped
                   for a, b in concurrent_lives(lives))
        assert overlapping_addresses(lives) == []
        assert sorted(n.cri.pod_ids()) == sorted(live)
        store = reservations(n, network)
        assert sorted(store.items()) == sorted((ip, pod_id) for pod_id, ips in live.items()
                                               for ip in ips), store

        # ---- N+1 checks and deletes the pods N made, and the held ADD's reservation
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
        proc = held.delete()
        assert proc.returncode == 0, proc.stderr
        assert [p.name for p in (held.data_dir / "upgrade-held").iterdir()
                if not p.name.startswith("last_reserved_ip")] == ["lock"]
        deleted = settled(sock)
        assert deleted["pid"] == after["pid"] and deleted["answered"] > checked["answered"]

        # ---- nothing left
        n.node.run("ip", "netns", "del", "pycni-upgrade-lo")
        all_ids = [pod_id for pod_id, _, _, _ in lives] + list(live)
        all_ips = sorted({ip for _, ips, _, _ in lives for ip in ips} | live_ips)
        assert shared_leftovers(n, network, "") == []
        assert rules_naming(n.node, *all_ids) == []
        addresses = re.compile("|".join(rf"(?<![\d.]){re.escape(ip)}(?![\d.])" for ip in all_ips))
        assert [line for line in firewall(n.node) if addresses.search(line)] == []
        print(f"churns: {[c.cycles for c in churns]} pods ({upgraded_at} before the third "
              f"install); execs: {execs.runs}; N answered {under_n['answered']}+, N+1 "
              f"{deleted['answered']}")
