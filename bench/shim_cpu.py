"""An installed executable's own CPU, two trees side by side (issue 38): A/B.

Renders each tree's executable as `pycni install` writes it (its own venv's python, `-IS`) and
execs them alternately: VERSION (answered by the shim), and a CHECK sent to a stand-in daemon
(a root listener in this process that ACKs and answers at once: the shim's own path to the
daemon and back, nothing run). Per exec the CPU of the child (getrusage), medians and means.
Nothing of the tree's daemon runs: this is what every runtime's exec costs before the trip.

    .venv/bin/python bench/shim_cpu.py OTHER_TREE [--execs 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from cni.fast import protocol as proto  # noqa: E402

RENDER = ("import sys; sys.path.insert(0, sys.argv[1]); from cni import install; "
          "sys.stdout.buffer.write(install.render_multicall(install.venv_python(), install.ROOT))")
CONFIG = b'{"cniVersion":"1.1.0","name":"n","type":"loopback"}'


def executable(tree: Path, where: Path) -> Path:
    """`tree`'s loopback as its install would write it, under `where`."""
    body = subprocess.run([str(tree / ".venv/bin/python"), "-c", RENDER, str(tree)],
                          capture_output=True, check=True).stdout
    where.mkdir()
    exe = where / "loopback"
    exe.write_bytes(body)
    exe.chmod(0o755)
    return exe


def stand_in(path: Path) -> None:
    """A root listener that takes each request and answers it at once (ACK, then a reply)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1 << 16)
                conn.sendall(proto.ACK + proto.encode_reply(0, b"{}", b""))

    threading.Thread(target=serve, daemon=True).start()


def cpu_ms(exe: Path, env: dict[str, str], stdin: bytes) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([str(exe)], env=env, input=stdin, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("other", type=Path)
    ap.add_argument("--execs", type=int, default=300)
    args = ap.parse_args()
    trees = [ROOT, args.other.resolve()]
    tmp = Path(tempfile.mkdtemp(prefix="pycni-shim-cpu-"))
    exes = [executable(tree, tmp / str(i)) for i, tree in enumerate(trees)]
    stand_in(tmp / "daemon.sock")
    cases = {
        "VERSION": ({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}'),
        "CHECK to the daemon": ({"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "c1",
                                 "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
                                 "CNI_PATH": "/nonexistent", proto.SOCKET_ENV:
                                 str(tmp / "daemon.sock"), proto.FALLBACK_ENV: "0"}, CONFIG),
    }
    got: dict[tuple[str, int], list[float]] = {(c, i): [] for c in cases for i in (0, 1)}
    for _ in range(args.execs):
        for i, exe in enumerate(exes):
            for case, (env, stdin) in cases.items():
                got[(case, i)].append(cpu_ms(exe, env, stdin))
    print(f"A={trees[0]} B={trees[1]} execs={args.execs} per case and tree")
    print("| exec CPU ms | A median | B median | A - B (means) |")
    print("| --- | --- | --- | --- |")
    for case in cases:
        a, b = got[(case, 0)], got[(case, 1)]
        print(f"| {case} | {statistics.median(a):.3f} | {statistics.median(b):.3f} | "
              f"{statistics.mean(a) - statistics.mean(b):+.3f} |")
    print(f"load (1-min) at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
