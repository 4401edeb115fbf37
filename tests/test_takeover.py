"""`pycni daemon --take-over`: a DaemonSet's rolling update (deploy/pycni.yaml, maxSurge 1)
starts the new pod's daemon while the old one serves, on the same socket path. The new one binds
beside the path and renames its socket onto it; the old one serves what it accepted until it is
stopped and leaves the path to the new one. Calls made all along never fail (no fallback)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cnitest import ROOT, VENV_PY, Netns, Plugins

from cni.fast import protocol as proto
from cni.fast import status

pytestmark = pytest.mark.root
LOOPBACK = {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback"}


def start(host: Netns, sock: Path, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", host.name, str(VENV_PY), "-m",
                                 "cni.fast.daemon", "--socket", str(sock), "-v", *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def wait(predicate, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


def test_a_second_daemon_takes_the_socket_over_with_no_failed_call(host, pod,
                                                                   plugins: Plugins) -> None:
    home = Path(tempfile.mkdtemp(prefix="pycni-takeover-"))  # short socket path, 0700
    sock = home / "run" / "pycni.sock"
    old = start(host, sock, home / "old.log")
    procs = [old]
    try:
        wait(lambda: "listening" in (home / "old.log").read_text(), "the old daemon")
        old_pid = status.query(str(sock), timeout=30)["pid"]
        # without --take-over a second daemon refuses the live path and leaves it alone
        refused = start(host, sock, home / "refused.log")
        procs.append(refused)
        assert refused.wait(120) != 0
        assert "another daemon is listening" in (home / "refused.log").read_text()
        assert status.query(str(sock), timeout=30)["pid"] == old_pid

        env = {"PYCNI_SOCKET": str(sock), proto.FALLBACK_ENV: "0"}
        failures: list[str] = []
        calls = [0]
        done = threading.Event()

        def traffic() -> None:  # a pod's loopback ADD after ADD through the executables
            while not done.is_set():
                code, out, err = plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path,
                                              ifname="lo", env=env)
                calls[0] += 1
                if code != 0:
                    failures.append(f"{code}: {out} {err}")

        t = threading.Thread(target=traffic)
        t.start()
        try:
            wait(lambda: calls[0] >= 3, "calls to the old daemon")
            new = start(host, sock, home / "new.log", "--take-over")
            procs.append(new)
            wait(lambda: (status.query(str(sock), timeout=30) or {}).get("pid") not in
                 (None, old_pid), "the new daemon on the path")
            assert "took" in (home / "new.log").read_text()
            at_switch = calls[0]
            wait(lambda: calls[0] >= at_switch + 3, "calls to the new daemon")
            old.send_signal(signal.SIGTERM)  # kubelet stops the old pod once the new is ready
            assert old.wait(120) == 0, (home / "old.log").read_text()
            at_stop = calls[0]
            wait(lambda: calls[0] >= at_stop + 3, "calls after the old daemon exited")
        finally:
            done.set()
            t.join(120)
        assert failures == [], failures
        assert sock.is_socket()  # the old daemon left the path (the new one's) in place
        assert sorted(os.listdir(sock.parent)) == ["pycni.sock"]  # no temporary name left
        new_status = status.query(str(sock), timeout=30)
        assert new_status["pid"] not in (None, old_pid)
        old_answered = (home / "old.log").read_text().count(" served ")
        assert old_answered >= 3 and new_status["answered"] >= 6
        assert old_answered + new_status["answered"] == calls[0]
    finally:
        for p in procs:
            stop(p)
