"""The daemon path: same bytes as in-process, root-only socket, crashes and hangs contained,
fallback when the daemon is gone. Daemons run in the test's host netns on a tmp socket.

Daemon.env forbids the shim's in-process fallback (PYCNI_SHIM_FALLBACK=0): a test that sends
its requests with it fails when the daemon does not serve them, and wait_served checks the
daemon's own count of what it answered (status.query). Tests of the fallback itself use
Daemon.fallback_env."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import pytest
from cnitest import BIN, ROOT, VENV_PY, Netns, Plugins
from test_shim import EXPENSIVE, assert_stdlib_only

from cni.fast import protocol as proto
from cni.fast import status
from cni.install import upgrade

pytestmark = pytest.mark.root
NO_DAEMON = {"PYCNI_SOCKET": "/nonexistent/pycni.sock"}
NO_FALLBACK = {proto.FALLBACK_ENV: "0"}
# Set by test_daemon_path_tests_fail_when_the_daemon_is_gone: start_daemon then kills each
# daemon it started, so that the tests it runs show they fail without one.
KILL_ENV = "PYCNI_TEST_KILL_DAEMON"
LOOPBACK = {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback"}


@dataclass
class Daemon:
    proc: subprocess.Popen
    socket: Path
    log: Path
    kids: set[int] = field(default_factory=set)

    @property
    def env(self) -> dict[str, str]:
        """Requests through this daemon only: the shim's fallback is off."""
        return self.fallback_env | NO_FALLBACK

    @property
    def fallback_env(self) -> dict[str, str]:
        """Requests to this daemon, run in-process by the shim if it does not take them."""
        return {"PYCNI_SOCKET": str(self.socket)}

    def status(self) -> dict:
        figures = status.query(str(self.socket), timeout=30)
        assert figures is not None, f"the daemon does not answer\n{self.log.read_text()}"
        return figures

    def served(self) -> int:
        """Requests a child ran (the daemon logs each with -v, once the child has exited)."""
        return self.log.read_text().count(" served ")

    def wait_served(self, count: int) -> None:
        """Until `count` requests are served, then: exactly `count`, in the log and in the
        daemon's own figures (status.query; as long as it runs)."""
        wait_for(lambda: self.served() >= count, f"{count} requests served")
        assert self.served() == count, self.log.read_text()
        if self.proc.poll() is None:
            assert self.status()["answered"] == count

    def wait_warm(self, spares: list[int] | set[int]) -> None:
        """Until the daemon has each of `spares` warm (the zygote's warm up at idle priority,
        slowly on a loaded box): a request before that is forked a child of its own."""
        wait_for(lambda: all(f"spare {p} is warm" in self.log.read_text() for p in spares),
                 f"spares {sorted(spares)} warm")

    def all_children(self) -> list[int]:
        """Every child: running requests and idle spares."""
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        kids = [int(p) for p in text.split()]
        self.kids.update(kids)
        return kids

    def children(self) -> list[int]:
        """The children running a request: named pycni-<plugin> (spares are pycni-spare, the
        spare maker pycni-zygote, and one that has sent its reply is pycni-done)."""
        return [p for p in self.all_children() if comm(p).startswith("pycni-")
                and comm(p) not in ("pycni-spare", "pycni-zygote", "pycni-done")]

    def named(self, name: str) -> list[int]:
        return [p for p in self.all_children() if comm(p) == name]

    def kill(self) -> None:
        """SIGKILL the daemon and every child it has (they would outlive it otherwise)."""
        kids = self.all_children()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def start_daemon() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons in a host namespace; every one (and its children) is killed at teardown."""
    started: list[Daemon] = []
    base = Path(tempfile.mkdtemp(prefix="pycni-daemon-"))  # 0700; outside pytest's tmp tree

    def start(host: Netns, *args: str) -> Daemon:
        home = base / f"d{len(started)}"
        home.mkdir(mode=0o700)
        sock, log = home / "run" / "pycni.sock", home / "daemon.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.name, str(VENV_PY), "-m", "cni.fast.daemon",
                 "--socket", str(sock), "-v", *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        d = Daemon(proc, sock, log)
        started.append(d)
        wait_for(lambda: "listening" in log.read_text() or proc.poll() is not None,
                 "the daemon to listen")
        assert proc.poll() is None, log.read_text()
        if os.environ.get(KILL_ENV) == "1":
            d.kill()
        return d

    yield start
    for d in started:
        print(f"--- {d.log}\n{d.log.read_text()}")  # pytest shows it when the test failed
        d.kill()
        for pid in d.kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


# --- same bytes both ways ---------------------------------------------------------------------

MBIT = 1_000_000


def scenario(name: str, tmp: Path) -> list[dict]:
    """The plugin configs of a chain (cniVersion 1.1.0: GC and STATUS too)."""
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]],
            "dataDir": str(tmp / "ipam")}
    base = {"cniVersion": "1.1.0", "name": "idnet"}
    loopback = base | {"type": "loopback"}
    bridge = base | {"type": "bridge", "bridge": "idbr0", "isGateway": True, "ipMasq": True,
                     "ipam": ipam}
    portmap = base | {"type": "portmap", "capabilities": {"portMappings": True},
                      "runtimeConfig": {"portMappings": [
                          {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
                          {"hostPort": 18081, "containerPort": 81, "protocol": "udp"}]}}
    bandwidth = base | {"type": "bandwidth", "capabilities": {"bandwidth": True},
                        "runtimeConfig": {"bandwidth": {
                            "ingressRate": 10 * MBIT, "ingressBurst": 80_000,
                            "egressRate": 20 * MBIT, "egressBurst": 160_000}}}
    tuning = base | {"type": "tuning", "dataDir": str(tmp / "tuning"), "mtu": 1400,
                     "mac": "02:77:00:00:00:01", "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}
    firewall = base | {"type": "firewall", "ingressPolicy": "same-bridge"}
    return {"loopback": [loopback], "host-local": [base | {"type": "host-local", "ipam": ipam}],
            "bridge": [bridge], "portmap": [bridge, portmap], "bandwidth": [bridge, bandwidth],
            "tuning": [bridge, tuning], "firewall": [bridge, portmap, firewall],
            "chain": [loopback, bridge, portmap, bandwidth]}[name]


def run_chain(plugins: Plugins, pod: Netns, confs: list[dict], env: dict) -> list[tuple]:
    """ADD, CHECK in order, DEL in reverse (twice), GC, STATUS and two errors, as a runtime
    would; returns (step, code, stdout, stderr) for each."""
    steps: list[tuple] = []

    def call(plugin: str, command: str, conf: dict, netns: str = pod.path) -> tuple[int, bytes]:
        code, out, err = plugins.exec(plugin, command, conf, netns=netns, env=env)
        steps.append((f"{plugin} {command}", code, json.dumps(out), err))
        return code, out

    prev = None
    for conf in confs:
        code, out = call(conf["type"], "ADD", conf | ({"prevResult": prev} if prev else {}))
        assert code == 0, steps[-1]
        prev = out
    for conf in confs:
        call(conf["type"], "CHECK", conf | {"prevResult": prev})
    for _ in range(2):
        for conf in reversed(confs):
            call(conf["type"], "DEL", conf | {"prevResult": prev})
    for conf in confs:
        call(conf["type"], "GC", conf | {"cni.dev/valid-attachments": []})
        call(conf["type"], "STATUS", conf)
        call(conf["type"], "ADD", conf | {"cniVersion": "0.0.9"})
        call(conf["type"], "DEL", conf, netns=pod.path + "-gone")
    return steps


def normalize(steps: list[tuple], pod: Netns, tmp: Path) -> list[tuple]:
    """Mask what differs between two runs by nature: MACs, random veth names, pod, tmp dir."""
    def clean(text: str) -> str:
        text = text.replace(pod.path, "<pod>").replace(str(tmp), "<tmp>")
        text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "<mac>", text)
        return re.sub(r"veth[0-9a-f]{8}", "<veth>", text)
    return [(step, code, clean(out), clean(err)) for step, code, out, err in steps]


@pytest.mark.parametrize("name", ["loopback", "host-local", "bridge", "portmap", "bandwidth",
                                  "tuning", "firewall", "chain"])
def test_daemon_and_in_process_give_the_same_bytes(name, netns_factory, start_daemon,
                                                   tmp_path) -> None:
    host_a, host_b = netns_factory("pycni-host"), netns_factory("pycni-host")
    pod_a, pod_b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    daemon = start_daemon(host_a)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    through = run_chain(Plugins(host_a), pod_a, scenario(name, tmp_path / "a"), daemon.env)
    daemon.wait_served(len(through))
    local = run_chain(Plugins(host_b), pod_b, scenario(name, tmp_path / "b"), NO_DAEMON)
    assert daemon.served() == len(through)  # the in-process run never reached it
    assert normalize(through, pod_a, tmp_path / "a") == normalize(local, pod_b, tmp_path / "b")


def test_the_daemon_acts_in_the_callers_namespace(netns_factory, start_daemon, tmp_path) -> None:
    """The daemon lives in one netns; a shim in another gets its bridge in its own."""
    home, caller, pod = (netns_factory("pycni-host"), netns_factory("pycni-host"),
                         netns_factory("pycni-pod"))
    daemon = start_daemon(home)
    conf = scenario("bridge", tmp_path)[0]
    Plugins(caller).ok("bridge", "ADD", conf, netns=pod.path, env=daemon.env)
    daemon.wait_served(1)
    assert "idbr0" in caller.links() and "idbr0" not in home.links()
    assert (tmp_path / "ipam" / "idnet").is_dir()  # the caller's mount namespace
    Plugins(caller).ok("bridge", "DEL", conf, netns=pod.path, env=daemon.env)


def test_firewall_through_the_daemon_writes_the_callers_iptables(netns_factory, start_daemon,
                                                                tmp_path) -> None:
    """firewall's iptables-nft runs in the caller's namespace (a dropping FORWARD there), not
    the daemon's."""
    home, caller, pod = (netns_factory("pycni-host"), netns_factory("pycni-host"),
                         netns_factory("pycni-pod"))
    caller.run("iptables-nft", "-P", "FORWARD", "DROP")
    daemon = start_daemon(home)
    bridge, portmap, firewall = scenario("firewall", tmp_path)
    prev = Plugins(caller).ok("bridge", "ADD", bridge, netns=pod.path, env=daemon.env)
    Plugins(caller).ok("firewall", "ADD", firewall | {"prevResult": prev}, netns=pod.path,
                       env=daemon.env)
    daemon.wait_served(2)
    assert "-A CNI-FORWARD -s 10.77.0.2/32 -j ACCEPT" in caller.run("iptables-save").stdout
    assert "CNI-FORWARD" not in home.run("iptables-save").stdout
    assert "cni_firewall" not in home.run("nft", "list", "tables").stdout
    Plugins(caller).ok("firewall", "DEL", firewall, netns=pod.path, env=daemon.env)
    assert "10.77.0.2" not in caller.run("iptables-save").stdout


def test_shim_on_the_daemon_path_imports_only_cheap_stdlib(host, pod, start_daemon,
                                                           tmp_path) -> None:
    from test_shim import run_probe

    daemon = start_daemon(host)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "lo", "CNI_PATH": str(BIN), **daemon.env}
    code, out, modules = run_probe(tmp_path, "loopback", env, json.dumps(LOOPBACK).encode(),
                                   wrap=("ip", "netns", "exec", host.name))
    assert code == 0 and json.loads(out)["interfaces"][0]["name"] == "lo"
    daemon.wait_served(1)
    assert_stdlib_only(modules)
    assert not modules & EXPENSIVE, sorted(modules & EXPENSIVE)
    # Each ~0.2-0.4 ms a request: the framing needs no _struct, the netns check is the child's.
    assert not modules & {"_struct", "fcntl"}, sorted(modules & {"_struct", "fcntl"})


# --- who may talk to it -------------------------------------------------------------------------

def as_nobody(fn: Callable[[], bytes]) -> bytes:
    """Run fn in a forked child as uid/gid 65534; returns what it returned (or the error)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = fn()
            except OSError as e:
                result = f"OSError:{e.errno}".encode()
            os.write(w, result)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return data


def talk(path: Path, data: bytes) -> bytes:
    """Send raw bytes, return everything the daemon answers until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(path))
        with contextlib.suppress(BrokenPipeError):  # it may answer and close before reading all
            s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def loopback_request(netns: str = "") -> bytes:
    env = {b"CNI_COMMAND": b"CHECK", b"CNI_CONTAINERID": b"c1", b"CNI_NETNS": netns.encode(),
           b"CNI_IFNAME": b"lo", b"CNI_PATH": str(BIN).encode()}
    return proto.encode_request("loopback", proto.encode_env(env),
                                json.dumps(LOOPBACK).encode(), 0, 0o022)


def refusal(answer: bytes) -> dict:
    """A REPLY without ACK: the daemon refused; returns its error JSON."""
    assert answer[:1] == proto.REPLY, answer[:40]
    code, out_len, _ = proto.reply_sizes(answer[:proto.REPLY_PREFIX])
    return json.loads(answer[proto.REPLY_PREFIX:proto.REPLY_PREFIX + out_len])


def test_socket_is_private_and_refuses_non_root_peers(host, start_daemon) -> None:
    daemon = start_daemon(host)
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    # The file modes already keep nobody out ...
    assert as_nobody(lambda: talk(daemon.socket, b"")) == b"OSError:13"
    # ... and with the modes opened up (a misconfiguration) SO_PEERCRED still refuses it.
    run_dir, home, base = daemon.socket.parents[0:3]
    assert base.name.startswith("pycni-daemon-")  # never loosen anything but our own dirs
    for p in (base, home, run_dir):
        p.chmod(0o755)
    daemon.socket.chmod(0o666)
    answer = as_nobody(lambda: talk(daemon.socket, loopback_request()))
    assert answer[:1] == proto.DENIED  # final (peercaps.py): the shim relays it, runs nothing
    assert "runs as uid 65534, not root" in refusal(answer[1:])["msg"]
    answer = as_nobody(lambda: talk(daemon.socket, proto.STATUS_MAGIC))
    assert "runs as uid 65534, not root" in refusal(answer)["msg"]  # its status too
    assert daemon.served() == 0
    assert "refused a connection from" in daemon.log.read_text()


def test_oversize_and_garbage_requests_are_refused(host, start_daemon) -> None:
    daemon = start_daemon(host)
    big = proto.MAGIC + proto.REQ_HEADER.pack(8, 0, proto.MAX_REQUEST, 0, 0o022)
    assert "larger than" in refusal(talk(daemon.socket, big))["msg"]
    assert "not a pycni request" in refusal(talk(daemon.socket, b"GET / HTTP/1.1\r\n\r\n"))["msg"]
    assert daemon.served() == 0
    assert daemon.proc.poll() is None


def test_an_idle_flood_does_not_block_a_real_request(host, pod, plugins, start_daemon) -> None:
    daemon = start_daemon(host)
    idle = []
    try:
        for i in range(300):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(daemon.socket))
            if i % 3 == 0:
                s.sendall(proto.MAGIC[:3])  # a request that starts and never finishes
            idle.append(s)
        out = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                         env=daemon.env)
        assert out["interfaces"][0]["name"] == "lo"
        daemon.wait_served(1)
    finally:
        for s in idle:
            s.close()


# --- crashes, hangs, restarts ---------------------------------------------------------------

_WRITERS: list[int] = []  # FIFO ends hang_conf's release() opened, closed after each test


@pytest.fixture(autouse=True)
def _close_fifo_writers() -> Iterator[None]:
    yield
    while _WRITERS:
        os.close(_WRITERS.pop())


def hang_conf(tmp_path: Path) -> tuple[str, Callable[[], None]]:
    """A CNI_NETNS that blocks whoever opens it (a FIFO), and how to release it."""
    fifo = tmp_path / "hang.fifo"
    os.mkfifo(fifo)

    def release() -> None:
        # A writer held open until the test ends: the blocked open() returns, and so does one
        # the child has not reached yet (the shim's own reader lets a writer's open succeed
        # before the child opens, and a writer closed at once would leave that open hanging).
        _WRITERS.append(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    return str(fifo), release


def spawn(plugins: Plugins, command: str, netns: str, env: dict,
          container_id: str = "hang1") -> subprocess.Popen:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": "lo",
            "CNI_PATH": str(BIN), **env}
    proc = subprocess.Popen(["ip", "netns", "exec", plugins.host.name, str(BIN / "loopback")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=full)
    proc.stdin.write(json.dumps(LOOPBACK).encode())
    proc.stdin.close()
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, dict]:
    out = proc.stdout.read()
    proc.wait(60)
    return proc.returncode, json.loads(out)


def test_a_hung_request_does_not_block_others(host, pod, plugins, start_daemon,
                                              tmp_path) -> None:
    daemon = start_daemon(host)
    fifo, release = hang_conf(tmp_path)
    hung = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the hung request's child")
    for command in ("ADD", "CHECK", "DEL"):
        plugins.ok("loopback", command, LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    assert hung.poll() is None  # still waiting on its FIFO
    release()
    code, out = finish(hung)
    assert code == 1 and "not a network namespace" in out["msg"]  # what in-process says too


def test_a_request_over_its_timeout_is_killed_with_an_error(host, plugins, start_daemon,
                                                            tmp_path) -> None:
    daemon = start_daemon(host, "--timeout", "1")
    fifo, _ = hang_conf(tmp_path)
    code, out = finish(spawn(plugins, "ADD", fifo, daemon.env))
    assert code == 1
    assert out["code"] == proto.TRY_AGAIN_LATER and "timed out" in out["msg"]
    assert daemon.proc.poll() is None and daemon.children() == []


def test_killing_the_daemon_mid_run_then_calls_fall_back(host, pod, plugins, start_daemon,
                                                         tmp_path) -> None:
    daemon = start_daemon(host)
    plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    daemon.wait_served(1)
    fifo, _ = hang_conf(tmp_path)
    running = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the running request's child")
    daemon.kill()  # the daemon and its child die mid-request
    code, out = finish(running)
    assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER  # may have run: retry, not rerun
    assert daemon.socket.exists()  # a stale socket: connect is refused
    for command in ("CHECK", "DEL", "ADD", "CHECK"):
        plugins.ok("loopback", command, LOOPBACK, netns=pod.path, ifname="lo",
                   env=daemon.fallback_env)
    assert daemon.served() == 1  # the killed one never logged
    # With the fallback off, the same call is an error naming the socket, and changes nothing.
    pod.run("ip", "link", "set", "lo", "down")
    code, out, _ = plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                                env=daemon.env)
    assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER, out
    assert str(daemon.socket) in out["msg"] and proto.FALLBACK_ENV in out["msg"]
    assert "UP" not in pod.links()["lo"]["flags"]


def test_sigterm_finishes_running_requests_and_new_ones_run_in_process(
        host, pod, plugins, start_daemon, tmp_path) -> None:
    daemon = start_daemon(host)
    fifo, release = hang_conf(tmp_path)
    running = spawn(plugins, "CHECK", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the running request's child")
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: not daemon.socket.exists(), "the daemon to stop listening")
    plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
               env=daemon.fallback_env)
    assert daemon.proc.poll() is None  # still finishing the running one
    release()
    code, out = finish(running)
    assert code == 1 and "not a network namespace" in out["msg"]  # its real answer
    daemon.proc.wait(30)
    assert daemon.served() == 1


def test_sigterm_runs_the_requests_it_accepted(host, pod, plugins, start_daemon,
                                               tmp_path) -> None:
    """systemctl restart: a request the daemon accepted but had not started yet (it waits for
    the one running on its attachment) still runs there; dropped, its shim (fallback off) would
    fail it, and the runtime's call with it."""
    daemon = start_daemon(host)
    fifo, release = hang_conf(tmp_path)
    running = spawn(plugins, "CHECK", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the running request's child")
    queued = spawn(plugins, "ADD", pod.path, daemon.env)  # the same attachment: it waits
    wait_for(lambda: daemon.status()["queued"] == 1, "the second request to wait")
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: not daemon.socket.exists(), "the daemon to stop listening")
    assert daemon.proc.poll() is None and queued.poll() is None
    release()
    code, out = finish(running)
    assert code == 1 and "not a network namespace" in out["msg"]
    code, out = finish(queued)
    assert code == 0 and out["interfaces"][0]["name"] == "lo", out
    assert "UP" in pod.links()["lo"]["flags"]
    daemon.proc.wait(30)
    assert daemon.served() == 2


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (a successor is not the test's child)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for kid in kids:
        kill_tree(int(kid))


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except OSError:
        return True


def test_handover_to_a_successor_loses_no_request(host, pod, plugins, start_daemon,
                                                  tmp_path) -> None:
    """What `pycni install` asks of a daemon of another version (no systemd): a successor from
    its own command line takes the socket; requests all along go through one or the other, the
    old one finishes what it runs, and the socket file is the successor's afterwards."""
    metrics = "127.0.0.1:19311"  # the successor serves it too: both listen meanwhile
    daemon = start_daemon(host, "--metrics-listen", metrics)
    old = daemon.status()
    fifo, release = hang_conf(tmp_path)
    running = spawn(plugins, "CHECK", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the running request's child")
    results: list[tuple[int, dict, bytes]] = []
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            results.append(plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path,
                                        ifname="lo", env=daemon.env))
    thread = threading.Thread(target=churn)
    thread.start()
    successor = 0
    try:
        answer = upgrade.request(str(daemon.socket))
        successor = answer["successor"]
        assert answer["pid"] == old["pid"] == daemon.proc.pid, answer
        new = daemon.status()  # whoever answers now
        assert new["pid"] == successor and new["version"] == old["version"], new
        wait_for(lambda: daemon.status()["answered"] >= 3, "the successor to serve requests")
        assert daemon.proc.poll() is None  # the old one still runs its request
        stop.set()
        thread.join()
        assert results and [r[0] for r in results] == [0] * len(results), results
        release()
        code, out = finish(running)
        assert code == 1 and "not a network namespace" in out["msg"]  # its real answer
        daemon.proc.wait(30)
        assert daemon.socket.exists()  # the old one left it to the successor
        plugins.ok("loopback", "CHECK", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
        wait_for(lambda: daemon.served() == len(results) + 2, "every request logged")
        scrape = host.run("curl", "-sS", "--max-time", "10", f"http://{metrics}/metrics")
        assert "pycni_spares_warm" in scrape.stdout  # from the successor, the old one is gone
        os.kill(successor, signal.SIGTERM)
        wait_for(lambda: gone(successor), "the successor to stop")
        assert not daemon.socket.exists()  # its own now: removed at its exit
    finally:
        stop.set()
        thread.join()
        if successor:
            kill_tree(successor)


def test_install_hands_over_a_daemon_of_another_version_only(host, start_daemon) -> None:
    """upgrade.upgrade, as `pycni install` calls it: a daemon running the installed version is
    left alone; one of another version hands over, and a successor that does not then run the
    installed version (its command line runs another install) is an error saying so."""
    daemon = start_daemon(host)
    old = daemon.status()
    said = upgrade.upgrade(old["version"], str(daemon.socket))
    assert "already" in said and daemon.status()["pid"] == old["pid"], said
    successor = 0
    try:
        with pytest.raises(upgrade.HandoverError, match=f"runs {old['version']}, not 9.9.9"):
            upgrade.upgrade("9.9.9", str(daemon.socket))
        successor = daemon.status()["pid"]
        assert successor != old["pid"]
        daemon.proc.wait(30)
    finally:
        if successor:
            kill_tree(successor)


def test_a_killed_shim_takes_its_request_down(host, pod, plugins, start_daemon,
                                              tmp_path) -> None:
    """The runtime's timeout kills the plugin; with the daemon the work must stop too, as it
    would have with the process, or an ADD could finish behind the DEL that follows."""
    daemon = start_daemon(host)
    fifo, _ = hang_conf(tmp_path)
    shim = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the request's child")
    shim.kill()
    shim.wait()
    wait_for(lambda: daemon.children() == [], "the orphaned request to be stopped")
    assert "the caller went away" in daemon.log.read_text()
    plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)


def test_requests_on_one_attachment_never_overlap(host, pod, plugins, start_daemon,
                                                  tmp_path) -> None:
    daemon = start_daemon(host)
    fifo, release = hang_conf(tmp_path)
    add = spawn(plugins, "ADD", fifo, daemon.env, container_id="same1")
    wait_for(lambda: len(daemon.children()) == 1, "the ADD's child")
    delete = spawn(plugins, "DEL", pod.path, daemon.env, container_id="same1")
    wait_for(lambda: "DEL same1 waits" in daemon.log.read_text(), "the DEL to be held")
    other = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                       container_id="other1", env=daemon.env)  # other attachments go on
    assert other["interfaces"][0]["name"] == "lo"
    assert delete.poll() is None and len(daemon.children()) == 1
    release()
    assert finish(add)[0] == 1
    delete.stdout.read()
    assert delete.wait(60) == 0


def test_spares_come_from_the_zygote_and_are_the_daemons_children(host, plugins, start_daemon,
                                                                  tmp_path) -> None:
    """The parent forks no spare itself (after a fork it pays copy-on-write faults on the next
    request's path): the zygote makes them at SCHED_IDLE and the daemon adopts them (subreaper),
    so it still reaps, kills and answers for them; a request runs at SCHED_OTHER. A spare that
    served comes back for the next request: none is made while it runs."""
    daemon = start_daemon(host)
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "two spares")
    spares = set(daemon.named("pycni-spare"))
    daemon.wait_warm(spares)
    zygotes = daemon.named("pycni-zygote")
    assert len(zygotes) == 1 and os.sched_getscheduler(zygotes[0]) == os.SCHED_IDLE
    fifo, release = hang_conf(tmp_path)
    hung = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the request's child")
    serving = daemon.children()[0]
    assert serving in spares and os.sched_getscheduler(serving) == os.SCHED_OTHER
    # Each query is answered in a round of the daemon's loop, which then decides on refills:
    # the second answer comes after a round that saw the spare serving, and asked for none.
    daemon.status()
    figures = daemon.status()["spares"]
    assert (figures["serving"], figures["warm"], figures["ordered"]) == (1, 1, 0), figures
    assert set(daemon.named("pycni-spare")) == spares - {serving}
    release()
    code, out = finish(hung)
    assert code == 1 and "not a network namespace" in out["msg"]
    daemon.wait_served(1)
    wait_for(lambda: set(daemon.named("pycni-spare")) == spares, "the spare back")
    assert os.sched_getscheduler(serving) == os.SCHED_OTHER
    assert daemon.named("pycni-zygote") == zygotes


def test_spares_warm_up_in_a_namespace_of_the_daemons_own(host, start_daemon) -> None:
    """Spares run loopback ADD and CHECK ahead of their request (preload.warm_requests), in a
    namespace only the daemon holds (an fd): the host's lo and the DEL markers are untouched."""
    lo_before = subprocess.run(["ip", "-n", host.name, "-j", "link", "show", "lo"],
                               capture_output=True, text=True, check=True).stdout
    daemon = start_daemon(host)
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "two spares")
    daemon.wait_warm(daemon.named("pycni-spare"))
    assert all(os.sched_getscheduler(p) == os.SCHED_OTHER for p in daemon.named("pycni-spare"))
    own = os.readlink(f"/proc/{daemon.proc.pid}/ns/net")
    held = {os.readlink(f"/proc/{daemon.proc.pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{daemon.proc.pid}/fd")}
    assert [n for n in held if n.startswith("net:[") and n != own]  # the warm-up namespace
    assert subprocess.run(["ip", "-n", host.name, "-j", "link", "show", "lo"],
                          capture_output=True, text=True, check=True).stdout == lo_before
    assert not Path("/run/pycni/deleted/loopback@pycni-warm-up@lo").exists()


def test_requests_go_on_when_the_zygote_dies(host, pod, plugins, start_daemon) -> None:
    daemon = start_daemon(host, "--max-spares", "2")  # no growth: the pool is --spares exactly
    wait_for(lambda: len(daemon.named("pycni-zygote")) == 1, "the zygote")
    os.kill(daemon.named("pycni-zygote")[0], signal.SIGKILL)
    wait_for(lambda: "the spare maker is gone" in daemon.log.read_text(), "the daemon to notice")
    for command in ("ADD", "CHECK", "DEL", "ADD"):
        plugins.ok("loopback", command, LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    daemon.wait_served(4)
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "spares the daemon forks itself")
    wait_for(lambda: daemon.named("pycni-zygote") == [], "the zygote reaped")
    assert len(daemon.named("pycni-spare")) == 2
    assert daemon.status()["spares"] == {"configured": 2, "max": 2, "warm": 2, "serving": 0,
                                         "retired": 0, "ordered": 0}


def test_a_child_no_request_waits_for_is_reaped(host, start_daemon) -> None:
    """A spare killed while idle: reaped at once (no zombie waiting for some request's child
    to exit), and replaced."""
    daemon = start_daemon(host)
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "two spares")
    spares = daemon.named("pycni-spare")
    daemon.wait_warm(spares)
    os.kill(spares[0], signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{spares[0]}").exists(), f"spare {spares[0]} reaped")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "a new spare")


def test_a_crashing_child_gets_an_error_reply(host, pod, plugins, start_daemon,
                                              tmp_path) -> None:
    daemon = start_daemon(host, "--timeout", "60")
    fifo, _ = hang_conf(tmp_path)
    running = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the running request's child")
    os.kill(daemon.children()[0], signal.SIGSEGV)
    code, out = finish(running)
    assert code == 1 and out["code"] == 999 and "crashed (signal 11)" in out["msg"]
    plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    daemon.wait_served(2)


def test_socket_activation(host, pod, plugins, tmp_path) -> None:
    """systemd's way: a listening socket on fd 3 with LISTEN_FDS/LISTEN_PID."""
    path = tmp_path / "act" / "pycni.sock"
    path.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    log = tmp_path / "act.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(  # fd 3 and LISTEN_PID=$$ (sh's pid, kept by exec)
            ["ip", "netns", "exec", host.name, "sh", "-c",
             'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh",
             str(VENV_PY), "-m", "cni.fast.daemon", "-v", "--socket", "/nonexistent/x.sock"],
            preexec_fn=lambda: os.dup2(listener.fileno(), 3), pass_fds=[3],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    listener.close()
    try:
        out = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                         env={"PYCNI_SOCKET": str(path)})
        assert out["interfaces"][0]["name"] == "lo"
        wait_for(lambda: " served " in log.read_text(), "the request to be logged")
        with pytest.raises(upgrade.HandoverError, match="systemctl restart pycni.service"):
            upgrade.request(str(path))  # systemd's socket: its restart is the way there
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert path.exists()  # the socket is systemd's: left in place for the next start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_concurrent_requests_all_answer(host, netns_factory, start_daemon) -> None:
    daemon = start_daemon(host)
    pods = [netns_factory("pycni-pod") for _ in range(12)]
    plugins = Plugins(host)
    results: list[tuple[int, str]] = []

    def one(pod: Netns) -> None:
        code, out, err = plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                                      env=daemon.env)
        results.append((code, f"{out} {err}"))
    threads = [threading.Thread(target=one, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [code for code, _ in results] == [0] * len(pods), (results, daemon.log.read_text())
    daemon.wait_served(len(pods))


def test_systemd_hears_ready_once_served_and_stopping_on_sigterm(host, pod, plugins, start_daemon,
                                                                 tmp_path, monkeypatch) -> None:
    """conf/pycni.service is Type=notify: READY=1 must mean requests go through the daemon."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(path))
        notify.settimeout(60)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))  # as systemd passes it
        daemon = start_daemon(host)
        ready = notify.recv(4096).decode()
        assert ready.startswith("READY=1\n") and f"MAINPID={daemon.proc.pid}" in ready, ready
        plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
        daemon.wait_served(1)
        daemon.proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096).decode().startswith("STOPPING=1\n")
        daemon.proc.wait(30)


# --- nested calls: an IPAM plugin behind a wrapper script ------------------------------------

def wrapped_ipam(tmp_path: Path) -> tuple[Path, Callable[[], None]]:
    """A CNI_PATH dir with `logged-ipam`, a wrapper script that execs our host-local (as people
    put in front of a plugin to log it): bridge execs it, and it calls the daemon from inside
    bridge's own request. Its first run waits on a gate; returns the dir and the gate's key."""
    bin_dir = tmp_path / "wrapbin"
    bin_dir.mkdir()
    gate, started = tmp_path / "gate.fifo", tmp_path / "gate.started"
    os.mkfifo(gate)
    script = bin_dir / "logged-ipam"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$CNI_COMMAND $CNI_CONTAINERID" >> {tmp_path}/ipam.log\n'
        f'if [ -p {gate} ]; then touch {started}; read _ < {gate}; rm -f {gate}; fi\n'
        f'exec {BIN}/host-local "$@"\n')
    script.chmod(0o755)

    def release() -> None:
        wait_for(started.exists, "the wrapper to wait on its gate")
        with open(gate, "w") as f:
            f.write("go\n")
    return bin_dir, release


WRAPPED = ("wrap1", "eth0")  # the attachment the wrapped-IPAM tests run bridge for


def wrapped_bridge_conf(tmp_path: Path) -> dict:
    """bridge with `logged-ipam` (wrapped_ipam) as its IPAM plugin."""
    return {"cniVersion": "1.0.0", "name": "wrapnet", "type": "bridge", "bridge": "wrapbr0",
            "ipam": {"type": "logged-ipam", "ranges": [[{"subnet": "10.79.0.0/24"}]],
                     "dataDir": str(tmp_path / "ipam")}}


def run_wrapped_bridge(host: Netns, pod: Netns, command: str, conf: dict,
                       env: dict) -> subprocess.Popen:
    """bridge exec'd in `host` for the WRAPPED attachment, its stdin written and closed."""
    cid, ifname = WRAPPED
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid, "CNI_NETNS": pod.path, "CNI_IFNAME": ifname, **env}
    proc = subprocess.Popen(["ip", "netns", "exec", host.name, str(BIN / "bridge")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=full)
    proc.stdin.write(json.dumps(conf).encode())
    proc.stdin.close()
    return proc


def test_a_nested_ipam_call_skips_its_callers_lock_but_a_racing_del_waits(
        host, pod, plugins, start_daemon, tmp_path) -> None:
    """bridge -> wrapper script -> our host-local shim -> the daemon, for bridge's own
    attachment: it must not wait behind bridge (which waits for it: a deadlock until the
    timeout), while a runtime DEL for the attachment still waits for the ADD to finish."""
    daemon = start_daemon(host)
    bin_dir, release = wrapped_ipam(tmp_path)
    conf = wrapped_bridge_conf(tmp_path)
    env = {**daemon.env, "CNI_PATH": f"{bin_dir}:{BIN}"}

    def run(command: str) -> subprocess.Popen:
        return run_wrapped_bridge(host, pod, command, conf, env)

    add = run("ADD")
    wait_for(lambda: (tmp_path / "gate.started").exists(), "bridge ADD to exec its IPAM")
    delete = run("DEL")  # the runtime gave up on the ADD: its DEL must wait for it
    wait_for(lambda: "bridge DEL wrap1 waits" in daemon.log.read_text(), "the DEL to be held")
    release()
    code, out = finish(add)
    assert code == 0, (out, add.stderr.read())
    assert out["ips"][0]["address"] == "10.79.0.2/24"
    log = daemon.log.read_text()
    assert "host-local ADD wrap1 runs nested in its caller's request" in log
    assert "host-local ADD wrap1 waits" not in log
    assert delete.stdout.read() == b"" and delete.wait(60) == 0
    daemon.wait_served(4)  # bridge ADD and DEL, each with its nested host-local
    log = daemon.log.read_text()
    assert log.index("served bridge ADD wrap1") < log.index("served bridge DEL wrap1")
    assert "host-local DEL wrap1 runs nested" in log  # the DEL's own IPAM call, nested too
    assert (tmp_path / "ipam.log").read_text().split("\n")[:2] == ["ADD wrap1", "DEL wrap1"]


def test_a_nested_ipam_call_never_waits_for_a_spare(host, pod, plugins, start_daemon,
                                                    tmp_path) -> None:
    """bridge holds the only spare while its IPAM plugin (a wrapper script around our
    host-local) calls the daemon: that call must not wait for the spare bridge holds (a
    deadlock until --spare-wait), it forks a child of its own."""
    daemon = start_daemon(host, "--spares", "1", "--max-spares", "1", "--spare-wait", "600")
    wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    bin_dir, release = wrapped_ipam(tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "wrapnet", "type": "bridge", "bridge": "wrapbr0",
            "ipam": {"type": "logged-ipam", "ranges": [[{"subnet": "10.79.0.0/24"}]],
                     "dataDir": str(tmp_path / "ipam")}}
    release_later = threading.Thread(target=release)
    release_later.start()
    result = plugins.ok("bridge", "ADD", conf, netns=pod.path, ifname="eth0",
                        env={**daemon.env, "CNI_PATH": f"{bin_dir}:{BIN}"})
    release_later.join()
    assert result["ips"][0]["address"] == "10.79.0.2/24"
    daemon.wait_served(2)
    assert daemon.status()["forked"] == 1  # the nested host-local's own child


def test_set_environ_makes_the_environment_exactly_the_requests() -> None:
    """The child's environment becomes the caller's, for what the plugin execs: keys it lacks
    go, changed ones change, equal ones stay, a name putenv refuses is skipped."""
    code = ("import os, subprocess; from cni.fast.preload import set_environ\n"
            "os.environ.update(KEEP='same', GONE='x', CHANGE='old')\n"
            "want = {'KEEP': 'same', 'CHANGE': 'new', 'NEW': 'a=b', 'PATH': '/usr/bin:/bin'}\n"
            "set_environ(want | {'': 'refused'})\n"
            "assert dict(os.environ) == want, dict(os.environ)\n"
            "seen = subprocess.run(['env'], capture_output=True, text=True, check=True).stdout\n"
            "assert sorted(seen.split()) == sorted(f'{k}={v}' for k, v in want.items()), seen\n")
    subprocess.run([str(VENV_PY), "-c", code], cwd=ROOT, check=True, env={"HOME": "/root"})


def test_preload_imports_pyroute2_once_for_every_request() -> None:
    """Every verb's netlink goes through pyroute2's IPRoute: the daemon imports it (and warms
    its parsers with one real read) before it forks, so no request's child imports it."""
    code = ("import sys; from cni.fast import preload\n"
            "assert preload.preimport() == [], preload.preimport()\n"
            "preload.warm_up()\n"
            "before = set(sys.modules)\n"
            "from cni.host import netns, links\n"
            "with netns.iproute() as ipr:\n"
            "    links.get(ipr, 'lo')\n"
            "print('pyroute2.iproute.linux' in before, sorted(set(sys.modules) - before))\n")
    out = subprocess.run([str(VENV_PY), "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "[]"]


def child_named(name: str) -> subprocess.Popen:
    """A process that names itself `name` (as a daemon's child does: child.DONE once it has
    answered) and sleeps."""
    code = ("import ctypes, sys, time\n"
            "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"  # PR_SET_NAME
            "print('named', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([str(VENV_PY), "-c", code, name], stdout=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout.readline() == b"named\n"
    return proc


def test_an_answered_request_frees_its_attachment_before_its_child_exits() -> None:
    """A child that has its reply (named DONE) and whose caller read it and hung up only exits:
    the next request on the attachment need not wait for that exit (closing an nftables or
    conntrack socket there can wait for an RCU grace period). A child still working holds it."""
    import selectors

    from cni.fast.child import DONE
    from cni.fast.server import Job, Options, Server

    listener, _ = socket.socketpair()
    server = Server(listener, Options(spares=0))
    key = ("ctr1", "eth0")
    outcome = {}
    for name in (DONE, "pycni-request"):
        child = child_named(name)
        conn, caller = socket.socketpair()
        job = Job(child.pid, conn, time.monotonic() + 60, f"loopback ADD {name}", b"", key)
        server.jobs[child.pid] = job
        server.busy[key] = {child.pid}
        server.sel.register(conn, selectors.EVENT_READ)
        caller.close()  # the shim read its reply (or was killed) and exited
        server._hangup(job)
        outcome[name] = (key in server.busy, job.abandoned)
        child.kill()
        child.wait()
        server.jobs.clear()
        server.busy.clear()
    assert outcome == {DONE: (False, False), "pycni-request": (True, True)}


def test_a_spare_is_asked_whether_it_answered_by_its_name_held_open() -> None:
    """A hang-up asks the spare serving the job whether it has sent its reply by its name: read
    through /proc/PID/comm opened once, when its pid is known (pool._name), and closed with it.
    That fd is the process's: once it is reaped, it no longer says answered."""
    from cni.fast.child import DONE
    from cni.fast.pool import Spare
    from cni.fast.server import Options, Server

    listener, _ = socket.socketpair()
    pool = Server(listener, Options(spares=0)).pool
    ctl, _spare_end = socket.socketpair()
    child = child_named(DONE)
    try:
        spare = pool._add(ctl)
        spare.pid, spare.serving = child.pid, True
        pool._name(spare)
        assert isinstance(spare, Spare) and spare.name is not None
        assert pool.answered(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pool.answered(child.pid)
    name = spare.name
    pool.drop(spare)
    with pytest.raises(OSError):
        os.fstat(name)


def test_status_counts_a_reply_sent_before_its_spare_is_back() -> None:
    """A spare sends its reply, then goes home at idle priority and only then says it is back
    (its job ends there). A caller that has its reply and asks the daemon's figures at once
    (tests count the requests a runtime made; a busy node starves SCHED_IDLE) must find that
    request answered, by its plugin too; one still running is not."""
    from cni.fast.child import DONE
    from cni.fast.server import Job, Options, Server

    listener, _ = socket.socketpair()
    server = Server(listener, Options(spares=0))
    children = [child_named(DONE), child_named("pycni-request")]
    try:
        for child, plugin in zip(children, ("loopback", "bridge"), strict=True):
            conn, _caller = socket.socketpair()
            server.jobs[child.pid] = Job(child.pid, conn, time.monotonic() + 60,
                                         f"{plugin} ADD c{child.pid}", b"")
        figures = server.status()
        assert (figures["answered"], figures["running"]) == (1, 2)
        assert figures["by_plugin"] == {"loopback": 1}
    finally:
        for child in children:
            child.kill()
            child.wait()


# --- the daemon's own figures (status.query) and pycni doctor's lines -------------------------

def test_status_counts_requests_forks_and_spares(host, pod, plugins, start_daemon) -> None:
    """A status query is answered by the daemon itself, never run as a plugin: it counts the
    requests it started and answered, those that forked because no spare was warm, spares."""
    daemon = start_daemon(host, "--spares", "1")
    wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    before = daemon.status()
    assert before["version"] == __import__("cni").__version__
    assert before["pid"] == daemon.proc.pid
    assert (before["started"], before["answered"], before["forked"]) == (0, 0, 0)
    assert before["spares"] == {"configured": 1, "max": 8, "warm": 1, "serving": 0,
                                "retired": 0, "ordered": 0}
    for i, command in enumerate(("ADD", "CHECK", "DEL")):
        plugins.ok("loopback", command, LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
        daemon.wait_served(i + 1)
        wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare back")
    after = daemon.status()
    assert (after["started"], after["answered"], after["forked"]) == (3, 3, 0)
    assert daemon.served() == 3  # the queries ran nothing
    spare = daemon.named("pycni-spare")
    os.kill(spare[0], signal.SIGKILL)
    wait_for(lambda: daemon.status()["spares"]["retired"] == 1, "the killed spare counted")


def test_status_counts_a_fork_when_no_spare_is_warm(host, pod, plugins, start_daemon) -> None:
    daemon = start_daemon(host, "--spares", "0")
    plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    daemon.wait_served(1)
    figures = daemon.status()
    assert (figures["started"], figures["answered"], figures["forked"]) == (1, 1, 1)
    assert figures["spares"]["configured"] == 0


def test_the_spare_pool_grows_while_every_spare_is_busy_and_shrinks_when_idle(
        host, pod, plugins, start_daemon, tmp_path) -> None:
    """With every spare busy, a request's child is forked as a spare that stays after its reply
    (up to --max-spares): a burst of pods pays a fork per spare, not per request. The spares
    beyond --spares retire once idle for --spare-linger seconds."""
    daemon = start_daemon(host, "--spares", "1", "--max-spares", "3", "--spare-linger", "2")
    wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    hung, releases = [], []
    for i in range(3):
        (tmp_path / f"h{i}").mkdir()
        fifo, release = hang_conf(tmp_path / f"h{i}")
        hung.append(spawn(plugins, "ADD", fifo, daemon.env, container_id=f"hang{i}"))
        releases.append(release)
    wait_for(lambda: len(daemon.children()) == 3, "three requests running")
    figures = daemon.status()
    assert (figures["forked"], figures["spares"]["serving"]) == (2, 3), figures
    for release in releases:
        release()
    for proc in hung:
        code, out = finish(proc)
        assert code == 1 and "not a network namespace" in out["msg"]
    daemon.wait_served(3)
    wait_for(lambda: daemon.status()["spares"]["warm"] == 3, "the three back as spares")
    assert len(daemon.named("pycni-spare")) == 3
    for command in ("ADD", "CHECK", "DEL"):
        plugins.ok("loopback", command, LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    daemon.wait_served(6)
    assert daemon.status()["forked"] == 2  # the pool served them
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1, "the pool back to --spares")
    figures = daemon.status()["spares"]
    assert (figures["warm"], figures["retired"]) == (1, 2), figures


def test_with_the_pool_full_a_request_waits_for_a_spare_then_forks(
        host, pod, plugins, start_daemon, tmp_path) -> None:
    """With --max-spares all busy, a request waits for one to come back (a spare is back in
    milliseconds, a fork costs more CPU) for up to --spare-wait seconds, then forks a child of
    its own."""
    daemon = start_daemon(host, "--spares", "1", "--max-spares", "1", "--spare-wait", "600")
    wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    fifo, release = hang_conf(tmp_path)
    hung = spawn(plugins, "ADD", fifo, daemon.env)
    wait_for(lambda: len(daemon.children()) == 1, "the hung request's child")
    waiting = spawn(plugins, "ADD", pod.path, daemon.env, container_id="waits1")
    wait_for(lambda: daemon.status()["queued"] == 1, "the request queued for the spare")
    assert waiting.poll() is None and daemon.status()["forked"] == 0
    release()
    assert finish(hung)[0] == 1
    code, out = finish(waiting)
    assert code == 0 and out["interfaces"][0]["name"] == "lo", out
    daemon.wait_served(2)
    assert daemon.status()["forked"] == 0  # the one spare ran both

    impatient = start_daemon(host, "--spares", "1", "--max-spares", "1", "--spare-wait", "0.2")
    wait_for(lambda: impatient.status()["spares"]["warm"] == 1, "the spare warm")
    (tmp_path / "impatient").mkdir()
    fifo, release = hang_conf(tmp_path / "impatient")  # the first FIFO stays released
    hung = spawn(plugins, "ADD", fifo, impatient.env)
    wait_for(lambda: len(impatient.children()) == 1, "the hung request's child")
    code, out = finish(spawn(plugins, "ADD", pod.path, impatient.env, container_id="forks1"))
    assert code == 0 and hung.poll() is None  # it did not wait for the hung one
    assert impatient.status()["forked"] == 1
    release()
    assert finish(hung)[0] == 1


def test_status_query_finds_no_daemon_without_crashing(tmp_path) -> None:
    assert status.query(str(tmp_path / "none.sock")) is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(tmp_path / "stale.sock"))  # bound, never listening: refused
    assert status.query(str(tmp_path / "stale.sock")) is None


def test_doctor_prints_the_daemons_answer_version_and_spares(host, start_daemon,
                                                             monkeypatch) -> None:
    from cni import doctor

    daemon = start_daemon(host, "--spares", "1")
    wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    monkeypatch.setenv("PYCNI_SOCKET", str(daemon.socket))
    found = {f.what: f for f in doctor.daemon_findings()}
    assert found["daemon answers"].status == doctor.OK
    assert f"pid {daemon.proc.pid}" in found["daemon answers"].detail
    assert found["daemon version"].detail == __import__("cni").__version__
    assert found["daemon spares"].detail == ("1 configured (up to 8 under load), 1 warm, "
                                             "0 serving, 0 retired")
    daemon.kill()  # the socket stays, stale: a finding with its fix, no crash
    found = {f.what: f for f in doctor.daemon_findings()}
    sock = found[f"daemon socket {daemon.socket}"]
    assert sock.status == doctor.WARN and "refuses connections" in sock.detail and sock.fix
    assert "daemon answers" not in found
    daemon.socket.unlink()
    found = {f.what: f for f in doctor.daemon_findings()}
    assert found[f"daemon socket {daemon.socket}"].detail == "configured but missing"


def test_daemon_path_tests_fail_when_the_daemon_is_gone(tmp_path) -> None:
    """The daemon stopped in the middle of a suite: the tests that claim the daemon path must
    fail (the shim's fallback is off for them), not pass on the in-process run. Runs them in
    a nested pytest whose start_daemon kills every daemon it has just started; each must fail
    on the shim's error 11 (no daemon took the request, no fallback), not for any reason."""
    selected = ["tests/test_own_netns.py::test_own_netns_is_refused_and_nothing_changes"
                "[ADD-daemon]",
                "tests/test_own_netns.py::test_override_allows_the_own_netns[1-daemon]",
                "tests/test_daemon.py::test_the_daemon_acts_in_the_callers_namespace"]
    report = tmp_path / "nested.xml"
    ran = subprocess.run([str(VENV_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"--junitxml={report}", *selected], cwd=ROOT, capture_output=True,
                         text=True, env=os.environ | {KILL_ENV: "1"}, timeout=600)
    summary = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 1, ran.stdout[-3000:]
    assert re.fullmatch(r"3 failed in .*", summary), ran.stdout[-3000:]
    failures = {case.get("name"): case.find("failure")
                for case in ElementTree.parse(report).iter("testcase")}
    assert sorted(failures) == sorted(s.split("::")[1] for s in selected), failures
    no_daemon = re.compile(rf"'code': {proto.TRY_AGAIN_LATER}, 'msg': 'no pycni daemon took "
                           rf"the request on [^']*, and {proto.FALLBACK_ENV}=0 forbids running "
                           r"it in-process'")
    for name, failure in failures.items():
        assert failure is not None, f"{name} did not fail\n{ran.stdout[-3000:]}"
        why = f"{failure.get('message')}\n{failure.text}"
        assert no_daemon.search(why), f"{name} failed for another reason:\n{why[-3000:]}"
