"""The forkserver daemon: faults (kill the shim, the forked child, the daemon) and who gets in.

Killing the shim is the runtime's timeout: containerd kills the plugin and calls DEL at once.
In the exec model the work dies with the process; with the daemon the forked child must not
finish an ADD behind the DEL's back, or the attachment leaks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import figures
import pytest
from cnitest import BIN, Netns
from relharness import (
    DAEMON_MODULE,
    NO_DAEMON,
    STARTUP,
    TIMEOUT,
    VERB,
    Daemon,
    Net,
    Phase,
    count,
    descendants,
    exec_plugin,
    kill_after,
    need,
    need_plugins,
    random_delay,
    spawn_add,
    tally_phases,
    timed,
)
from syscallstops import SyscallStops
from test_rel_faults import PLUGINS, Target, _clean_after_del, _ok, make_target

from cni.fast.procs import comm

pytestmark = pytest.mark.root


@pytest.fixture
def daemon(host: Netns, tmp_path: Path) -> Iterator[Daemon]:
    """With a warm spare that serves request after request: a killed or odd request must not
    spoil the next pod it serves."""
    need(DAEMON_MODULE)
    d = Daemon(host, tmp_path / "run" / "pycni.sock", tmp_path / "daemon.log", spares=1).start()
    yield d
    d.stop()


def _with_daemon(t: Target, d: Daemon, fallback: bool = False) -> Target:
    t.extra_env = {**t.extra_env, **d.env(fallback)}
    return t


def _dead(pids: list[int]) -> None:
    """Wait (bounded) until each of `pids` has exited (gone, or a zombie)."""
    deadline = time.monotonic() + TIMEOUT
    for pid in pids:
        while True:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rpartition(")")[2].split()[0] == "Z":
                        break
            except OSError:
                break
            assert time.monotonic() < deadline, f"killed process {pid} never exited"
            time.sleep(0.002)


def _settle(d: Daemon) -> None:
    """Wait (bounded) until the daemon runs and queues nothing: an orphaned ADD has finished
    (its child answered, or was reaped)."""
    deadline = time.monotonic() + TIMEOUT
    while d.proc is not None and d.proc.poll() is None:
        figures_now = d.status()
        if not (figures_now["running"] or figures_now["queued"]):
            return
        assert time.monotonic() < deadline, "a daemon child never finished"
        time.sleep(0.02)


IDLE_NAMES = {"pycni-spare", "pycni-zygote", "pycni-done"}
LAST_TRIES = 3  # ADDs the last round may take to hold its child in the verb


def _children(d: Daemon) -> list[int]:
    """The daemon's own children: spares (adopted), the zygote, a child forked for a request."""
    try:
        with open(f"/proc/{d.pid}/task/{d.pid}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        return []


def _requests_running(d: Daemon) -> list[int]:
    """The daemon's children running a request (named pycni-<plugin>; idle spares, the spare
    maker and a child that has answered are named otherwise)."""
    return [pid for pid in _children(d) if comm(pid).startswith("pycni-")
            and comm(pid) not in IDLE_NAMES]


def _child_soon(d: Daemon, proc: subprocess.Popen, rng: random.Random,
                typical: float) -> list[int]:
    """The request's child runs it for a fraction of the ADD (a warm spare: a few ms): watch
    the daemon's children's names (pread on their open comm files: µs a look) until one runs
    it, then let it run a random bit more, so most child kills land
    mid-request instead of finding nobody."""
    deadline = time.monotonic() + TIMEOUT  # the shim's own start-up comes first: wait it out
    watched: dict[int, int] = {}
    running: list[int] = []
    try:
        for look in itertools.count():
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            if look % 64 == 0:  # a child forked for it, a new spare: watch them too
                for pid in _children(d):
                    if pid not in watched:
                        with contextlib.suppress(OSError):
                            watched[pid] = os.open(f"/proc/{pid}/comm", os.O_RDONLY)
            running = [pid for pid, fd in watched.items() if _running_name(fd)]
            if running:
                break
    finally:
        for fd in watched.values():
            os.close(fd)
    if running:
        time.sleep(rng.uniform(0, 0.003))
    return running


def _running_name(fd: int) -> bool:
    try:
        name = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return False
    return name.startswith("pycni-") and name not in IDLE_NAMES


def _through_a_spare(d: Daemon, run: Callable[[], Any]) -> Any:
    """Run `run` (one request) once the daemon has a warm spare, and show a spare served it
    (no fork): the spare that served the killed or odd request before, when it came back."""
    deadline = time.monotonic() + TIMEOUT
    while d.status()["spares"]["warm"] < 1:
        assert time.monotonic() < deadline, "no warm spare"
        time.sleep(0.02)
    before = d.status()
    out = run()
    after = d.status()
    assert after["started"] == before["started"] + 1, "the daemon did not serve it"
    assert after["forked"] == before["forked"], "the request forked instead of using the spare"
    return out


def same_shape(out: Any) -> str:
    """A result without what differs between two ADDs by nature (MACs, veth names, the
    address host-local hands out next)."""
    text = json.dumps(out, sort_keys=True)
    text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "<mac>", text)
    text = re.sub(r"veth[0-9a-f]{8}", "<veth>", text)
    text = re.sub(r"bwp[0-9a-f]{12}", "<ifb>", text)  # bandwidth's ifb, named by container ID
    return re.sub(r"10\.77\.0\.\d+/", "10.77.0.<n>/", text)


def _ns(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _child_in_verb(d: Daemon, shim: int, pid: int) -> bool:
    """Whether the daemon's child `pid` is inside the request's verb: named for the request
    (not yet pycni-done) and in the caller's mount namespace, which it enters after its ACK
    (child.enter_caller). The shim runs in a mount namespace of its own (`ip netns exec` made
    one), so this cannot hold in the daemon's own."""
    caller = _ns(shim, "mnt")
    if not caller or caller == _ns(d.pid, "mnt") or _ns(pid, "mnt") != caller:
        return False
    try:
        fd = os.open(f"/proc/{pid}/comm", os.O_RDONLY)
    except OSError:
        return False
    try:
        return _running_name(fd)
    finally:
        os.close(fd)


def _kill_plan(d: Daemon, mode: str, rng: random.Random, typical: float, depth: int
               ) -> tuple[Callable[[subprocess.Popen], list[int]], Phase, Callable[[], None]]:
    """Made before the round's ADD: whom it kills, how its phase is told, and what to do once
    the kill is sent. VERB: the daemon's own count shows it started the request. With
    `depth`, the last round's kill lands in the verb for sure: the warm spares are traced
    (syscallstops) and the one the request goes to is held at the depth-th syscall it makes
    inside its verb; the kill (of the shim, that child or the daemon) comes while it is held
    there, then it goes on."""
    held: list[int] = []
    stops: SyscallStops | None = None
    if depth:
        deadline = time.monotonic() + TIMEOUT
        while d.status()["spares"]["warm"] < 1:
            assert time.monotonic() < deadline, "no warm spare"
            time.sleep(0.02)
        stops = SyscallStops([pid for pid in _children(d) if comm(pid) == "pycni-spare"])
    started = d.status()["started"]
    victim = {"shim": lambda p: [p.pid],  # the runtime's timeout kill
              "child": lambda p: _child_soon(d, p, rng, typical),
              "daemon": lambda p: [d.pid]}[mode]

    def phase(p: subprocess.Popen, _t: Any) -> str:
        if depth:
            return VERB if held and _child_in_verb(d, p.pid, held[0]) else STARTUP
        try:
            return VERB if d.status()["started"] > started else STARTUP
        except AssertionError:  # the daemon is gone
            return STARTUP

    def in_verb(p: subprocess.Popen) -> list[int]:
        assert stops is not None
        inside: dict[int, int] = {}

        def deep_enough(pid: int) -> bool:
            if not _child_in_verb(d, p.pid, pid):
                return False
            inside[pid] = inside.get(pid, 0) + 1
            return inside[pid] >= depth
        pid = stops.hold_when(p, deep_enough, TIMEOUT)
        if pid is None:
            return []  # its verb ended before the depth-th syscall: nothing to kill in it
        held.append(pid)
        return held if mode == "child" else victim(p)

    def release() -> None:
        if stops is not None:
            stops.release()
    return (in_verb if depth else victim), phase, release


def kill_with_daemon(host: Netns, t: Target, net: Net, d: Daemon, rng: random.Random, n: int,
                     mode: str, name: str) -> None:
    """Kill the shim, the request's child or the daemon during ADD; the runtime's DEL; then the
    next ADD, through a spare, must answer as a fresh process does and leave no more."""
    cid0 = "rlcal-0"
    fresh = {k: v for k, v in t.extra_env.items() if k != "PYCNI_SHIM_FALLBACK"} | {
        "PYCNI_SOCKET": NO_DAEMON}  # the exec path: a fresh process
    code, expected, err = exec_plugin(host, t.plugin, "ADD", t.conf(cid0), cid0, t.netns,
                                      t.ifname, fresh)
    assert code == 0, f"{expected} {err[-1500:]}"
    exec_plugin(host, t.plugin, "DEL", t.conf(cid0), cid0, t.netns, t.ifname, fresh)
    typical = timed(lambda: t.check_add(_ok(host, t, "ADD", cid0)))
    _ok(host, t, "DEL", cid0)
    outcomes = []
    # The last round is tried again (a new ADD) while its ADD ends before its child is caught
    # in the verb: one kill must land there.
    rounds = [False] * (n - 1) + [True] * LAST_TRIES
    for i, last in enumerate(rounds):
        cid = f"rld{i}-{rng.randrange(1 << 20):05x}"
        # the first last round holds its child a few syscalls into the verb, a retry at once
        depth = 0 if not last else rng.randint(1, 8) if i == n - 1 else 1
        victims, phase, release = _kill_plan(d, mode, rng, typical, depth)
        killed: list[int] = []

        def chosen(p: subprocess.Popen, victims=victims, killed=killed) -> list[int]:
            pids = victims(p)
            killed.extend(pids)
            return pids
        proc = spawn_add(host, t.plugin, cid, t.netns, t.ifname, t.extra_env)
        # child mode does its own waiting (for the child to run it), so it starts at once
        delay = 0.0 if mode == "child" or last else random_delay(rng, typical)
        outcome = kill_after(proc, delay, chosen, stdin=json.dumps(t.conf(cid)).encode(),
                             phase=phase, after_kill=release)
        # A child killed just after its ADD ended is a spare that may take the DEL before it
        # has died (its exit waits for a CPU on a loaded box): the daemon then answers 11,
        # nothing ran, which a runtime retries. The kill is for the ADD: let it land first.
        _dead(killed)
        outcomes.append(outcome)
        what = (f"daemon/{mode} {t.plugin} kill #{i} after {delay:.3f}s "
                f"(landed={outcome.landed} in {outcome.phase or '-'})")
        # the runtime's DEL comes at once (with the daemon dead, the shim runs it in-process)
        _ok(host, t, "DEL", cid)
        _settle(d)
        _clean_after_del(host, t, net, what)
        if mode == "daemon" and d.proc is not None and d.proc.poll() is not None:
            d.proc.wait()
            d.start()
        out = _through_a_spare(d, lambda cid=cid: _ok(host, t, "ADD", cid))
        t.check_add(out)
        assert same_shape(out) == same_shape(expected), f"{what}: {out} != {expected}"
        _ok(host, t, "DEL", cid)
        _settle(d)
        _clean_after_del(host, t, net, what + ", then ADD+DEL")
        if last and outcome.after_start:
            break
    else:
        raise AssertionError(f"{LAST_TRIES} last rounds: no kill caught the request's child in "
                             f"its verb ({[(o.landed, o.phase) for o in outcomes]})")
    phases = tally_phases(outcomes)
    figures.record(name, plugin=t.plugin, mode=mode, kills=len(outcomes),
                   landed_mid_add=sum(phases.values()), landed_by_phase=phases,
                   spares=d.spares, failures=0, leaks=0, typical_add_s=round(typical, 3))
    assert phases[VERB] >= 1, f"no kill landed after the daemon started the request: {phases}"


MODES = ["shim", "child", "daemon"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plugin", PLUGINS)
def test_kill_during_add_with_daemon(plugin: str, mode: str, host: Netns, pod: Netns, net: Net,
                                     daemon: Daemon, rng: random.Random) -> None:
    need_plugins(plugin)
    t = _with_daemon(make_target(plugin, host, pod, net), daemon, fallback=mode == "daemon")
    kill_with_daemon(host, t, net, daemon, rng, count(3, 3), mode, f"daemon-kill-{plugin}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plugin", PLUGINS)
def test_kill_during_add_with_daemon_long(plugin: str, mode: str, host: Netns, pod: Netns,
                                          net: Net, daemon: Daemon, rng: random.Random) -> None:
    need_plugins(plugin)
    t = _with_daemon(make_target(plugin, host, pod, net), daemon, fallback=mode == "daemon")
    kill_with_daemon(host, t, net, daemon, rng, count(3, 100), mode,
                     f"daemon-kill-{plugin}-long")


# ---- who gets in ------------------------------------------------------------------------------

def _request(plugin: str = "loopback", stdin: bytes = b"{}") -> bytes:
    from cni.fast import protocol as proto

    env = proto.encode_env({b"CNI_COMMAND": b"VERSION"})
    return proto.encode_request(plugin, env, stdin, 0, 0o022)


def _reply(sock: socket.socket) -> tuple[bool, int, bytes]:
    """(acked, exit code, stdout) of whatever the daemon answers; (False, -1, b"") if it only
    hung up (which is a refusal too: nothing was ACKed, so nothing ran)."""
    from cni.fast import protocol as proto

    sock.settimeout(TIMEOUT)
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    if not data:
        return False, -1, b""
    acked = data.startswith(proto.ACK)
    body = data[1:] if acked else data
    assert body.startswith(proto.REPLY), f"no reply frame: {data[:80]!r}"
    code, out_len, _ = proto.REPLY_HEADER.unpack_from(body, 1)
    start = proto.REPLY_PREFIX
    return acked, code, body[start:start + out_len]


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(str(path))
    return s


def test_socket_and_directory_are_root_only(daemon: Daemon) -> None:
    sock_st, dir_st = os.stat(daemon.socket), os.stat(daemon.socket.parent)
    assert stat.S_ISSOCK(sock_st.st_mode)
    assert sock_st.st_uid == 0 and stat.S_IMODE(sock_st.st_mode) & 0o077 == 0, oct(
        sock_st.st_mode)
    assert dir_st.st_uid == 0 and stat.S_IMODE(dir_st.st_mode) & 0o022 == 0, oct(dir_st.st_mode)


def test_daemon_refuses_a_group_or_world_writable_directory(host: Netns, tmp_path: Path) -> None:
    need(DAEMON_MODULE)
    run = tmp_path / "open"
    run.mkdir()
    run.chmod(0o777)
    d = Daemon(host, run / "pycni.sock", tmp_path / "daemon.log")
    with pytest.raises(AssertionError, match="daemon exited"):
        d.start()
    d.stop()
    assert not (run / "pycni.sock").exists()


# A child that drops to uid 65534 before it connects: SO_PEERCRED then names a non-root peer.
_AS_NOBODY = r"""
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(60)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES"); sys.exit(0)
s.sendall(bytes.fromhex(sys.argv[2]))
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.hex())
"""


def test_non_root_peer_is_refused_even_through_an_open_socket(host: Netns,
                                                               tmp_path: Path) -> None:
    from cni.fast import protocol as proto

    need(DAEMON_MODULE)
    # nobody must be able to reach the socket path for the second half: not under tmp_path
    run = Path(tempfile.mkdtemp(prefix="pycni-rel-", dir="/tmp"))
    d = Daemon(host, run / "pycni.sock", tmp_path / "daemon.log")
    try:
        d.start()

        def as_nobody() -> str:
            return subprocess.run([sys.executable, "-c", _AS_NOBODY, str(d.socket),
                                   _request().hex()], capture_output=True, text=True,
                                  timeout=TIMEOUT, check=True).stdout.strip()

        assert as_nobody() == "EACCES"  # file permissions alone keep nobody out...
        run.chmod(0o755)
        d.socket.chmod(0o666)
        out = as_nobody()  # ...and if an admin opens them up, SO_PEERCRED still does
        assert out != "EACCES", "the test could not reach the opened socket"
        data = bytes.fromhex(out)
        assert not data.startswith(proto.ACK), "a non-root peer got a request run"
        assert data.startswith(proto.DENIED + proto.REPLY) and b"not root" in data, data[:200]
        with _connect(d.socket) as s:  # root still gets served
            s.sendall(_request())
            acked, code, out_b = _reply(s)
        assert acked and code == 0 and b"supportedVersions" in out_b
    finally:
        d.stop()
        shutil.rmtree(run, ignore_errors=True)


def test_idle_connection_flood_does_not_block_real_requests(host: Netns, pod: Netns, net: Net,
                                                            daemon: Daemon) -> None:
    flood(host, pod, net, daemon, count(300, 300), "daemon-flood")


@pytest.mark.slow
def test_idle_connection_flood_does_not_block_real_requests_long(host: Netns, pod: Netns,
                                                                 net: Net, daemon: Daemon) -> None:
    flood(host, pod, net, daemon, count(300, 2000), "daemon-flood-long")


def flood(host: Netns, pod: Netns, net: Net, daemon: Daemon, n: int, name: str) -> None:
    idle: list[socket.socket] = []
    try:
        for _ in range(n):
            idle.append(_connect(daemon.socket))
        # half of them even start a request and stall mid-header
        for s in idle[::2]:
            s.sendall(_request()[:7])
        t = _with_daemon(make_target("loopback", host, pod, net), daemon)
        served = 0
        for i in range(5):
            out = _ok(host, t, "ADD", f"rlflood-{i}")
            assert out["interfaces"][0]["name"] == "lo"
            served += 1
            # and it went through the daemon, not the in-process fallback
            with _connect(daemon.socket) as s:
                s.sendall(_request())
                acked, code, _ = _reply(s)
            assert acked and code == 0
    finally:
        for s in idle:
            s.close()
    assert daemon.proc is not None and daemon.proc.poll() is None
    figures.record(name, idle_connections=n, real_requests_served=served, failures=0)


def test_oversized_request_is_refused_without_running(daemon: Daemon) -> None:
    from cni.fast import protocol as proto

    env = proto.encode_env({b"CNI_COMMAND": b"ADD"})
    header = proto.MAGIC + proto.REQ_HEADER.pack(8, len(env), proto.MAX_REQUEST, 0, 0o022)
    with _connect(daemon.socket) as s:
        s.sendall(header + b"loopback" + env + b"x" * 4096)  # claims 17 MiB, sends 4 KiB
        acked, code, out = _reply(s)
    assert not acked and code == 1
    err = json.loads(out)
    assert err["code"] == 5 and "larger than" in err["msg"], err
    # a bogus header (not our magic) is refused too, and the daemon lives on
    with _connect(daemon.socket) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        acked, code, out = _reply(s)
    assert not acked and code == 1
    with _connect(daemon.socket) as s:
        s.sendall(_request())
        assert _reply(s)[:2] == (True, 0)


def test_lying_fd_count_is_refused(daemon: Daemon) -> None:
    """A header promising fds the message does not carry must not run (or crash) anything."""
    from cni.fast import protocol as proto

    env = proto.encode_env({b"CNI_COMMAND": b"DEL"})
    req = proto.encode_request("loopback", env, b"{}", proto.ROLE_NETNS | proto.ROLE_CWD, 0o022)
    with _connect(daemon.socket) as s:
        s.sendall(req)
        acked, code, _ = _reply(s)
    assert not acked and code == 1
    fd = os.open("/", os.O_RDONLY)
    try:
        with _connect(daemon.socket) as s:  # more fds than roles
            s.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                               struct.pack("5i", fd, fd, fd, fd, fd))])
            acked, code, _ = _reply(s)
        assert not acked and code in (1, -1)
    finally:
        os.close(fd)
    with _connect(daemon.socket) as s:  # and it still serves
        s.sendall(_request())
        assert _reply(s)[:2] == (True, 0)


def test_killed_shim_does_not_let_its_add_finish_after_del(host: Netns, pod: Netns, net: Net,
                                                           daemon: Daemon, tmp_path: Path) -> None:
    """Deterministic version of the race the shim-kill loop hits under load: the ADD is slow
    (here: its IPAM sleeps, then it is stopped), the runtime kills the plugin on its timeout and
    calls DEL at once. Found by this suite; the daemon now stops a request whose caller hung up.
    The sleeping IPAM wrapper makes sure the ADD is still running when the test looks for it,
    however loaded the machine is."""
    need_plugins("bridge")
    slow = tmp_path / "slow-ipam"
    slow.write_text(f'#!/bin/sh\nsleep 2\nexec {BIN / "host-local"} "$@"\n')
    slow.chmod(0o755)
    t = _with_daemon(make_target("bridge", host, pod, net), daemon)
    t.extra_env["CNI_PATH"] = f"{tmp_path}:{BIN}"
    plain_conf = t.conf
    t.conf = lambda cid: {**plain_conf(cid), "ipam": {**plain_conf(cid)["ipam"],
                                                      "type": "slow-ipam"}}
    cid = "rlorphan-1"
    proc = spawn_add(host, "bridge", cid, t.netns, t.ifname, t.extra_env)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(t.conf(cid)).encode())
    proc.stdin.close()
    proc.stdin = None
    deadline = time.monotonic() + TIMEOUT
    while not (kids := _requests_running(daemon)):
        assert time.monotonic() < deadline and proc.poll() is None, "ADD never reached a child"
        time.sleep(0.001)
    kids += [pid for kid in kids for pid in descendants(kid)]  # its IPAM's sleep too
    for pid in kids:
        os.kill(pid, signal.SIGSTOP)  # a slow ADD, frozen before it has done much
    try:
        proc.kill()  # the runtime gives up on it...
        proc.communicate(timeout=TIMEOUT)
        code, out, err = exec_plugin(host, "bridge", "DEL", t.conf(cid), cid, t.netns,
                                     t.ifname, t.extra_env, timeout=30)
        assert code == 0, f"DEL failed (blocked by the frozen ADD?): {out} {err[-1000:]}"
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    _settle(daemon)
    _clean_after_del(host, t, net, "ADD resumed after the runtime's DEL")
