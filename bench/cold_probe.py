"""Why a spare's verb costs more than the same verb in a warm loop (issue 38): one link read in
another network namespace, step by step, warm and after a pause.

The steps are those of every verb that looks into a pod (loopback CHECK is nothing else):
enter the namespace (setns), build pyroute2's IPRoute there, one RTM_GETLINK (dumps.request),
close, go back. Each round times them back to back ("warm"), then after a pause: asleep 1, 10
or 100 ms, or 100 ms spinning on the CPU (never idle, touching nothing else). If the spinning
pause is as slow as the sleeping one, what a spare loses is its caches to time (what else ran on
the machine and the host meanwhile), not a CPU waking from idle. Runs as a spare does
(world.become_spare_like, its kept sockets and event loop), in a throwaway namespace of its own
with a pod namespace made for it. Root:

    .venv/bin/python bench/cold_probe.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from world import become_spare_like, enter_private_mounts  # noqa: E402

STEPS = ("enter", "IPRoute", "request", "close", "leave")


def read_lo(fd: int) -> list[float]:
    """One link read in the namespace of `fd`: ms per step."""
    from cni.host import dumps, links, netns

    t = [time.perf_counter()]
    with netns.entered(fd):
        t.append(time.perf_counter())
        with netns.iproute() as ipr:
            t.append(time.perf_counter())
            dumps.request(ipr, links.get_request(0, "lo"))
            t.append(time.perf_counter())
        t.append(time.perf_counter())
    t.append(time.perf_counter())
    return [(b - a) * 1e3 for a, b in zip(t, t[1:], strict=False)]


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


PAUSES: dict[str, Callable[[], None]] = {
    "warm": lambda: None,
    "asleep 1 ms": lambda: time.sleep(0.001),
    "asleep 10 ms": lambda: time.sleep(0.01),
    "asleep 100 ms": lambda: time.sleep(0.1),
    "spinning 100 ms": lambda: spin(100),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    opts = parser.parse_args()
    enter_private_mounts()
    become_spare_like()
    from cni.fast import preload

    preload.keep_home_sockets()
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one CPU: no migration between
    pod = f"pycni-cold-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", pod], check=True)
    try:
        subprocess.run(["ip", "-n", pod, "link", "set", "lo", "up"], check=True)
        fd = os.open(f"/run/netns/{pod}", os.O_RDONLY)
        for _ in range(20):
            read_lo(fd)
        times: dict[str, list[list[float]]] = {name: [] for name in PAUSES}
        for _ in range(opts.rounds):
            for name, pause in PAUSES.items():
                read_lo(fd)  # the pause starts warm
                pause()
                times[name].append(read_lo(fd))
        os.close(fd)
    finally:
        subprocess.run(["ip", "netns", "del", pod], check=False)
    load = os.getloadavg()[0]
    print(f"{opts.rounds} rounds, load (1-min) {load:.1f}; ms, medians")
    print("| before the read | " + " | ".join(STEPS) + " | whole |")
    print("| --- " * (len(STEPS) + 2) + "|")
    for name, rounds in times.items():
        steps = [statistics.median(r[i] for r in rounds) for i in range(len(STEPS))]
        whole = statistics.median(sum(r) for r in rounds)
        print(f"| {name} | " + " | ".join(f"{s:.3f}" for s in steps) + f" | {whole:.3f} |")


if __name__ == "__main__":
    main()
