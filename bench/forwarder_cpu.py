"""pycni-forwarder's exec CPU beside the Python executable's and the reference's (issue 48).

Installs this checkout twice into a scratch dir (`pycni install`, with and without
--forwarder) and execs each one's loopback alternately with the reference v1.9.1 loopback:
VERSION (answered by each executable itself), and a CHECK sent to a stand-in daemon (shim_cpu's:
a root listener that ACKs and answers at once; the reference has no daemon, so it has no row
there). Per exec the CPU of the child (getrusage), medians and means. Run as root.

    .venv/bin/python bench/forwarder_cpu.py [--execs 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from shim_cpu import CONFIG, cpu_ms, stand_in  # noqa: E402

from cni import install  # noqa: E402
from cni.fast import protocol as proto  # noqa: E402

REFERENCE = ROOT.parent / "shared" / "reference" / "bin" / "loopback"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--execs", type=int, default=300)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-fwd-cpu-"))
    os.environ[proto.SOCKET_ENV] = str(tmp / "none.sock")  # install asks no daemon
    for name, use in (("py", False), ("fwd", True)):
        install.install(tmp / name, None, None, compile_bytecode=True, use_forwarder=use)
    stand_in(tmp / "daemon.sock")
    exes = {"python": tmp / "py" / "loopback", "forwarder": tmp / "fwd" / "loopback"}
    if REFERENCE.exists():
        exes["reference v1.9.1"] = REFERENCE
    cases = {
        "VERSION": ({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}', list(exes)),
        "CHECK to the daemon": ({"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "c1",
                                 "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
                                 "CNI_PATH": "/nonexistent", proto.SOCKET_ENV:
                                 str(tmp / "daemon.sock"), proto.FALLBACK_ENV: "0"}, CONFIG,
                                ["python", "forwarder"]),
    }
    got: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.execs):
            for case, (env, stdin, who) in cases.items():
                for name in who:
                    got.setdefault((case, name), []).append(cpu_ms(exes[name], env, stdin))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"execs={args.execs} per case and executable")
    print("| exec CPU ms | " + " | ".join(f"{n} median (mean)" for n in exes) + " |")
    print("| --- |" + " --- |" * len(exes))
    for case, (_, _, who) in cases.items():
        cells = [f"{statistics.median(got[(case, n)]):.3f} ({statistics.mean(got[(case, n)]):.3f})"
                 if n in who else "-" for n in exes]
        print(f"| {case} | " + " | ".join(cells) + " |")
    print(f"load (1-min) at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
