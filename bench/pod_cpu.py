"""CPU per pod (issue 38): what one pod's CNI calls cost in CPU, every process summed, pycni with
its daemon (and, given its bin dir, pycni's forwarder: issue 48) vs the reference v1.9.1.

- cnitool (libcni 1.3): one pod's ADD, CHECK and DEL over fullnode.py's chain (bridge +
  host-local, portmap with one hostPort, bandwidth; CAP_ARGS), each side in its own node netns.
- CRI-O's ADD + CHECK (what RunPodSandbox waits for): the six execs crio_requests.py replays.

Each side is a node: its own host netns (fullnode.Node), and for pycni's sides its own daemon,
started in that netns as a node's daemon runs in its host's. Every process is counted through
fresh cgroups v2 (world.Cgroup): one the tools are born in (cnitool, the replayed plugin execs,
so the shims, the reference's plugins and what they run: host-local, nft), and one for each
daemon (its parent, zygote and spares, exited ones too).
CPU = usage_usec after - before around each pod, read 50 ms after its last call returned (so
the spare's trip home is in); pycni's figure is the tools' and its node's daemon's, the
reference's the tools' alone.
The sides interleave, a pod each; the first pod of each side is left out.

    .venv/bin/python bench/pod_cpu.py [--pods 10] [--forwarder]   # (root) prints the rows

`make bench` calls `rows` and puts them in its table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from crio_requests import CrioSide, crio_sides, one_pod  # noqa: E402
from fullnode import REFERENCE_V19, Node, drop_netns, new_pod_netns, node_state  # noqa: E402
from world import Cgroup, Daemon  # noqa: E402

V19, OURS, FWD = "reference v1.9.1", "pycni+daemon", "pycni+forwarder"
CPU_VS_V19_MAX = 1.4  # issue 38's goal: a pod's CPU <= 1.4x v1.9.1's
FWD_CRIO_VS_V19_MAX = 1.0  # issue 48's for the forwarder, on CRI-O's path
SETTLE = 0.05  # s after a pod's last call before reading: the spare's way home is counted
CNITOOL_ROW = "CPU per pod: cnitool ADD + CHECK + DEL (ms, every process, median)"
CRIO_ROW = "CPU per pod: CRI-O's ADD + CHECK (ms, every process, median)"

Figures = dict[str, dict[str, list[tuple[float, float]]]]  # row -> side -> (tools, daemon) ms


def measure(tmp: Path, ours_bin: Path, pods: int, fwd_bin: Path | None = None) -> Figures:
    tools = Cgroup("tools")
    figures: Figures = defaultdict(lambda: defaultdict(list))
    daemons: dict[str, tuple[Daemon, Cgroup]] = {}
    with node_state():
        nodes = [Node(V19, REFERENCE_V19, "cpuref", "10.62.0.0/16", tmp, cgroup=tools),
                 Node(OURS, ours_bin, "cpupy", "10.63.0.0/16", tmp, cgroup=tools)]
        if fwd_bin is not None:
            nodes.append(Node(FWD, fwd_bin, "cpufw", "10.64.0.0/16", tmp, cgroup=tools))
        try:
            (tmp / "crio").mkdir()
            # Each pycni node its own daemon, started in the node's network namespace, as a
            # node's daemon lives in its host's (systemd; the DaemonSet's hostNetwork): a
            # caller in another namespace than the daemon's costs each request a setns there
            # and back and fresh netlink sockets (~5 ms a CRI-O pod), which no node pays.
            for node in nodes[1:]:
                node.enter()
                (tmp / f"daemon-{node.host}").mkdir()
                cgroup = Cgroup(f"daemon-{node.host}")
                daemons[node.name] = (Daemon.start(tmp / f"daemon-{node.host}", cgroup), cgroup)
                node.env["PYCNI_SOCKET"] = str(daemons[node.name][0].socket)
            crio: dict[str, CrioSide] = dict(zip(
                (V19, OURS, FWD)[:len(nodes)],
                crio_sides(tmp / "crio", ours_bin, daemons[OURS][0].socket, fwd_bin,
                           daemons[FWD][0].socket if FWD in daemons else None), strict=True))
            for side in crio.values():
                side.cgroup = tools

            def reader(name: str) -> Callable[[], tuple[float, float]]:
                cgroup = daemons[name][1] if name in daemons else None
                return lambda: (tools.cpu_ms(), cgroup.cpu_ms() if cgroup else 0.0)

            for i in range(pods + 1):
                k = i % len(nodes)
                for node in nodes[k:] + nodes[:k]:
                    node.enter()
                    cpu = reader(node.name)
                    keep = figures if i else defaultdict(lambda: defaultdict(list))
                    cnitool_pod(node, cpu, keep[CNITOOL_ROW][node.name])
                    crio_pod(crio[node.name], cpu, keep[CRIO_ROW][node.name])
        finally:
            for daemon, _ in daemons.values():
                daemon.stop()
            for node in nodes:
                node.close()
            for cg in (tools, *(cgroup for _, cgroup in daemons.values())):
                cg.remove()
    return figures


def spent(cpu: Callable[[], tuple[float, float]], before: tuple[float, float]) -> tuple[float,
                                                                                       float]:
    time.sleep(SETTLE)
    after = cpu()
    return after[0] - before[0], after[1] - before[1]


def cnitool_pod(node: Node, cpu: Callable[[], tuple[float, float]],
                into: list[tuple[float, float]]) -> None:
    pod = node.new_pod()
    try:
        before = cpu()
        oks = [node.cnitool(verb, pod)[1] for verb in ("add", "check", "del")]
        if all(oks):
            into.append(spent(cpu, before))
    finally:
        drop_netns(pod.netns)


def crio_pod(side: CrioSide, cpu: Callable[[], tuple[float, float]],
             into: list[tuple[float, float]]) -> None:
    netns = new_pod_netns()
    try:
        before = cpu()
        one_pod(side, netns, None, None, before_del=lambda: into.append(spent(cpu, before)))
    finally:
        drop_netns(netns)


def rows(tmp: Path, ours_bin: Path, pods: int,
         fwd_bin: Path | None = None) -> list[tuple[str, dict[str, str]]]:
    """The table rows (run.py's `extra` form): each side's median, pycni's ratios to v1.9.1
    and the goals; pycni's cells split the shims (or forwarders) and tools from the daemon."""
    figures = measure(tmp, ours_bin, pods, fwd_bin)
    out = []
    for row in (CNITOOL_ROW, CRIO_ROW):
        by = figures.get(row, {})
        if not by.get(V19) or not by.get(OURS) or (fwd_bin is not None and not by.get(FWD)):
            out.append((row, {"target": "not measured (a call failed)"}))
            continue
        ref = statistics.median(t + d for t, d in by[V19])
        cells: dict[str, str] = {V19: f"{ref:.1f}"}
        notes = []
        for side, short, bound in ((OURS, "daemon", CPU_VS_V19_MAX),
                                   (FWD, "forwarder", FWD_CRIO_VS_V19_MAX)):
            if not by.get(side):
                continue
            ours = statistics.median(t + d for t, d in by[side])
            ratio = ours / ref
            cells[side] = (f"{ours:.1f} (tools {statistics.median(t for t, _ in by[side]):.1f}, "
                           f"daemon {statistics.median(d for _, d in by[side]):.1f})")
            cells[f"{side} ratio v1.9.1"] = f"{ratio:.2f}x"
            if side == OURS or row == CRIO_ROW:  # the forwarder's goal is CRI-O's path
                notes.append(f"{short}: " + ("ok" if ratio <= bound else
                                              f"MISSED (<= {bound}x v1.9.1)"))
        cells["target"] = "; ".join(notes)
        out.append((row, cells))
    return out


def main() -> int:
    import os

    from world import enter_private_mounts, our_bin

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--forwarder", action="store_true", help=f"a {FWD} side too")
    args = parser.parse_args()
    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-pod-cpu-"))
    ours_bin, _ = our_bin(tmp)
    fwd_bin = our_bin(tmp, forwarder=True)[0] if args.forwarder else None
    load = os.getloadavg()[0]
    lines = rows(tmp, ours_bin, args.pods, fwd_bin)
    print(f"load (1-min): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
          f"{os.cpu_count()} CPUs; {args.pods} pods per side, interleaved")
    sides = [OURS, *([FWD] if fwd_bin else [])]
    print(f"| metric | {V19} | " + " | ".join(f"{n} | ratio" for n in sides) + " | target |")
    print("| --- " * (3 + 2 * len(sides)) + "|")
    for metric, by in lines:
        print(f"| {metric} | {by.get(V19, '')} | "
              + " | ".join(f"{by.get(n, '')} | {by.get(f'{n} ratio v1.9.1', '')}" for n in sides)
              + f" | {by.get('target', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
