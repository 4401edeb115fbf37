"""The forwarder's trip step by step (issue 48 item 7), for bench/BREAKDOWN.md.

This checkout installed with `pycni install --forwarder` (world.our_bin) and without, a daemon
started for the run (in a cgroup of its own: its CPU per call, spares included) and shim_cpu's
stand-in daemon (ACK and reply at once), in bench's throwaway host netns with one pod netns
whose lo a loopback ADD raised. Exec'd in turn, per round: loopback VERSION (forwarder,
v1.9.1), loopback CHECK of the pod (forwarder to the stand-in, forwarder to the daemon, the
Python shim to the daemon, v1.9.1). Per case the median wall ms (driver.run_plugin), the exec's
CPU (RUSAGE_CHILDREN) and the daemon's CPU until 50 ms after it (pod_cpu's SETTLE: the spare's
way home counted). The differences read as steps: VERSION = exec + Go runtime start + the
install table; stand-in CHECK - VERSION = the request built (fds opened), connect,
SO_PEERCRED, send, ACK and reply read; daemon CHECK - stand-in CHECK = the daemon's part
(hand-over to a spare, setns, the lo read, the reply). `--strace FILE` also writes one
forwarder CHECK to the daemon under `strace -f -ttt -T`.

    .venv/bin/python bench/forwarder_trip.py [--rounds 100] [--strace /tmp/fwd.strace]  # root
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from driver import LIBCNI_VERSION_STDIN, Side, run_plugin  # noqa: E402
from pod_cpu import SETTLE  # noqa: E402
from shim_cpu import CONFIG, stand_in  # noqa: E402
from world import (  # noqa: E402
    REFERENCE_V19,
    Cgroup,
    Daemon,
    Lab,
    enter_private_mounts,
    our_bin,
)


def cpu_of_children() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (u.ru_utime + u.ru_stime) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--strace", type=Path, help="one forwarder CHECK under strace -f -ttt -T")
    args = ap.parse_args()
    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-fwd-trip-"))
    lab = Lab()
    py_bin, _ = our_bin(tmp)
    fwd_bin, _ = our_bin(tmp, forwarder=True)
    cgroup = Cgroup("fwd-trip")
    daemon = Daemon.start(tmp, cgroup)
    stand_in(tmp / "standin.sock")
    to = lambda sock: {"PYCNI_SOCKET": str(sock), "PYCNI_SHIM_FALLBACK": "0"}  # noqa: E731
    side = lambda name, d, env=None: Side(name, d, "", "", tmp, env or {})  # noqa: E731
    cases = [  # (label, side, verb)
        ("forwarder VERSION", side("fwd", fwd_bin), "VERSION"),
        ("v1.9.1 VERSION", side("ref", REFERENCE_V19), "VERSION"),
        ("forwarder CHECK, stand-in daemon", side("fwd", fwd_bin, to(tmp / "standin.sock")),
         "CHECK"),
        ("forwarder CHECK, daemon", side("fwd", fwd_bin, to(daemon.socket)), "CHECK"),
        ("python shim CHECK, daemon", side("py", py_bin, to(daemon.socket)), "CHECK"),
        ("v1.9.1 CHECK", side("ref", REFERENCE_V19), "CHECK"),
    ]
    netns = lab.pod()
    cid = secrets.token_hex(8)
    got: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _, _ in cases}
    try:
        add = run_plugin(cases[1][1], "loopback", "ADD", CONFIG, container_id=cid, netns=netns)
        if not add.ok:
            raise SystemExit(add.describe())
        for i in range(args.rounds + 1):  # the first round warms the pool: left out
            k = i % len(cases)
            for label, s, verb in cases[k:] + cases[:k]:
                cpu, dcpu = cpu_of_children(), cgroup.cpu_ms()
                ex = run_plugin(s, "loopback", verb,
                                LIBCNI_VERSION_STDIN if verb == "VERSION" else CONFIG,
                                container_id=cid, netns=netns)
                if not ex.ok:
                    raise SystemExit(f"{label}: {ex.describe()}")
                time.sleep(SETTLE)  # the spare's way home counted with its call
                if i:
                    got[label].append((ex.seconds * 1000, cpu_of_children() - cpu,
                                       cgroup.cpu_ms() - dcpu))
        if args.strace:
            env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid,
                   "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": str(fwd_bin),
                   **to(daemon.socket)}
            subprocess.run(["strace", "-f", "-ttt", "-T", "-o", str(args.strace),
                            str(fwd_bin / "loopback")], env=env, input=CONFIG, check=True,
                           capture_output=True)
    finally:
        daemon.stop()
        lab.drop(netns)
        cgroup.remove()
    print(f"rounds={args.rounds}; load (1-min) at the end {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print("| loopback exec | wall ms median | exec CPU ms median | daemon CPU ms median |")
    print("| --- | --- | --- | --- |")
    for label, samples in got.items():
        med = [statistics.median(s[j] for s in samples) for j in range(3)]
        print(f"| {label} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
