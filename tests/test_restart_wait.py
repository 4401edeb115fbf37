"""An upgrade's restart fails no call: the old daemon's drain is bounded and shorter than
systemd's stop timeout, and the shim waits for its request to be taken longer than a stop and a
start can last (shim.py's docstring works the bounds out)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cnitest import ROOT, VENV_PY
from test_daemon import (  # noqa: F401 (start_daemon, a fixture)
    LOOPBACK,
    _close_fifo_writers,
    finish,
    hang_conf,
    spawn,
    start_daemon,
    wait_for,
)

from cni.fast import handover, shim
from cni.fast import protocol as proto
from cni.fast.state import Options

OLD_ACCEPT_TIMEOUT = 60.0  # what the shim waited before


def unit_seconds(name: str) -> float:
    for line in (ROOT / "conf" / "pycni.service").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return float(value)
    raise AssertionError(f"conf/pycni.service sets no {name}")


def test_the_waits_fit_together() -> None:
    """A daemon stopping (systemctl restart) runs what it accepted within its drain bound, which
    systemd's TimeoutStopSec exceeds (it never kills a request mid-run); a new daemon serves
    within TimeoutStartSec (READY_TIMEOUT too, a handover's); a request in the socket's backlog
    meanwhile waits in its shim for both, and then some."""
    from cni.fast.server import drain_bound

    stop, start = unit_seconds("TimeoutStopSec"), unit_seconds("TimeoutStartSec")
    assert drain_bound(Options()) < stop
    assert start >= handover.READY_TIMEOUT
    assert stop + start < shim.ACCEPT_TIMEOUT


def activated(host, listener: socket.socket, log: Path) -> subprocess.Popen:
    """A daemon on `listener` passed as systemd passes it (fd 3, LISTEN_FDS/LISTEN_PID)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, "sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"',
             "sh", str(VENV_PY), "-m", "cni.fast.daemon", "-v", "--socket", "/nonexistent/x"],
            preexec_fn=lambda: os.dup2(listener.fileno(), 3), pass_fds=[3],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    wait_for(lambda: f"pycni daemon {proc.pid} listening" in log.read_text()
             or proc.poll() is not None, "the daemon to listen")
    assert proc.poll() is None, log.read_text()
    return proc


def kids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.root
def test_a_call_made_during_a_restart_waits_for_the_next_daemon(host, pod, plugins,
                                                                tmp_path) -> None:
    """systemctl restart pycni.service, the way `pycni install` does it: the socket stays
    (pycni.socket's), the old daemon drains a long request, and a call made meanwhile (fallback
    off) sits in the backlog longer than the shim used to wait (60 s), then is served by the
    new daemon. Slow by nature: it waits out the old bound."""
    base = Path(tempfile.mkdtemp(prefix="pycni-restart-"))
    path, log = base / "pycni.sock", base / "daemon.log"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    env = {"PYCNI_SOCKET": str(path), proto.FALLBACK_ENV: "0"}
    procs: list[subprocess.Popen] = []
    try:
        old = activated(host, listener, log)
        procs.append(old)
        fifo, release = hang_conf(tmp_path)
        running = spawn(plugins, "CHECK", fifo, env)
        wait_for(lambda: any(comm(k) == "pycni-loopback" for k in kids(old.pid)),
                 "the long request's child")
        old.send_signal(signal.SIGTERM)  # systemd's stop
        wait_for(lambda: "stopping" in log.read_text(), "the old daemon to stop accepting")
        pod.run("ip", "link", "set", "lo", "down")
        call = spawn(plugins, "ADD", pod.path, env, container_id="during1")
        deadline = time.monotonic() + OLD_ACCEPT_TIMEOUT + 5
        while time.monotonic() < deadline and call.poll() is None:
            time.sleep(0.5)
        assert call.poll() is None, finish(call)  # still waiting, not failed
        release()
        code, out = finish(running)
        assert code == 1 and "not a network namespace" in out["msg"]  # its real answer
        old.wait(30)
        procs.append(activated(host, listener, log))  # systemd's start
        code, out = finish(call)
        assert code == 0 and out["interfaces"][0]["name"] == "lo", out
        assert "UP" in pod.links()["lo"]["flags"]
    finally:
        listener.close()
        for proc in procs:
            for kid in kids(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kid, signal.SIGKILL)
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def accepted(figures: dict) -> int:
    return figures["started"] + figures["queued"]


@pytest.mark.root
def test_a_stopping_daemon_drains_within_its_bound(host, plugins, start_daemon,  # noqa: F811
                                                   tmp_path) -> None:
    """Requests held behind a hung one on their attachment run one after another while the
    daemon drains, each up to --timeout: the one that starts last only gets what is left of the
    drain bound (--timeout + the read timeout), and its answer says so (11: try again, the next
    daemon takes it)."""
    daemon = start_daemon(host, "--timeout", "3")
    fifo, _ = hang_conf(tmp_path)
    shims = []
    for i in range(8):  # on one attachment: 3 s each, in order, well past the 13 s bound
        shims.append(spawn(plugins, "ADD", fifo, daemon.env))
        wait_for(lambda i=i: accepted(daemon.status()) == i + 1, f"request {i} accepted")
    daemon.proc.send_signal(signal.SIGTERM)
    answers = [finish(s) for s in shims]
    daemon.proc.wait(60)
    assert all(code == 1 and out["code"] == proto.TRY_AGAIN_LATER for code, out in answers)
    whys = [out["msg"] for _, out in answers]
    assert all("timed out after 3s" in w or "drain ended" in w for w in whys), whys
    assert "drain ended" in whys[-1], whys
