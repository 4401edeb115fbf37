"""CRI-O's CNI requests one exec at a time: where RunPodSandbox's CNI time goes, per plugin.

bench/cri_pods.py times whole pods through CRI-O; this replays what CRI-O 1.33 sends the
plugins for those pods (read from CRI-O's plugin execs: conf/10-pycni.conflist without loopback
at 1.0.0, portmap with the portMappings capability but no runtimeConfig, as CRI-O makes
hostPorts itself; bandwidth with CRI-O's runtimeConfig for 100M annotations, its "no burst"
34359738359 included; CNI_ARGS with the K8S_POD_* keys; CHECK right after ADD with the chain's
result as prevResult, ~1 ms apart; DEL in reverse) through libcni-like execs (bench/driver.py),
for the reference v1.9.1 and pycni with its daemon, interleaved, in bench/run.py's throwaway
host netns. Per exec, medians: wall ms; CPU ms of the plugin process (with the processes it
waited for: the reference's host-local and nft); for pycni also the CPU its daemon and spares
spent meanwhile (the daemon runs in a fresh cgroup v2 from its birth: cpu.stat counts spares that
exited too). Run as root:

    .venv/bin/python bench/crio_requests.py [--pods N] [--forwarder]

--forwarder adds pycni+forwarder (`pycni install --forwarder`, on the same daemon) as a third
side, reported against v1.9.1 the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from driver import Side, plugin_config, run_plugin  # noqa: E402
from world import REFERENCE_V19, Cgroup, Daemon, Lab, enter_private_mounts, our_bin  # noqa: E402

GAP = 0.001  # CRI-O's own time between two plugin execs (its debug log and exec events: 1-2 ms)
BANDWIDTH_RUNTIME = {  # what CRI-O 1.33 passes for kubernetes.io/{in,e}gress-bandwidth: 100M
    "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 34359738359,
                  "egressRate": 100_000_000, "egressBurst": 34359738359},
    "io.kubernetes.cri.pod-annotations": {"kubernetes.io/ingress-bandwidth": "100M",
                                          "kubernetes.io/egress-bandwidth": "100M"}}


class CrioSide(Side):
    """A side whose chain is CRI-O's requests for the bench's pods."""

    def chain(self, index: int) -> list[dict[str, Any]]:
        conf = json.loads((ROOT / "conf" / "10-pycni.conflist").read_text())
        plugins = [p for p in conf["plugins"] if p["type"] != "loopback"]  # CRI-O raises lo
        for p in plugins:
            if p["type"] == "bridge":
                p |= {"bridge": self.bridge, "ipMasqBackend": "nftables",
                      "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                               "dataDir": str(self.data_dir)}}
            elif p["type"] == "bandwidth":
                p["runtimeConfig"] = BANDWIDTH_RUNTIME
        return plugins


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


Figures = dict[str, dict[str, list[tuple[float, float, float]]]]  # side -> exec -> samples


def one_pod(side: Side, netns: str, daemon_cpu: Callable[[], float] | None,
            figures: Figures | None, before_del: Callable[[], None] | None = None) -> None:
    """CRI-O's ADD, CHECK, DEL of one pod in `netns`; per exec into `figures` (None: a warm-up)
    its wall ms, its process's CPU ms (and what it waited for) and `daemon_cpu`'s growth;
    `before_del` is called between RunPodSandbox's part (ADD, CHECK) and the DELs."""
    cid = secrets.token_hex(32)

    def run(plugin: dict[str, Any], verb: str, prev: Any) -> Any:
        cpu, daemon = children_cpu_ms(), daemon_cpu() if daemon_cpu else 0.0
        ex = run_plugin(side, plugin["type"], verb, plugin_config(side, plugin, prev),
                        container_id=cid, netns=netns)
        if not ex.ok:
            raise SystemExit(ex.describe())
        spent = (children_cpu_ms() - cpu, daemon_cpu() - daemon if daemon_cpu else 0.0)
        if figures is not None:
            figures[side.name][f"{verb} {plugin['type']}"].append((ex.seconds * 1000, *spent))
        time.sleep(GAP)
        return ex.result()

    prev = None
    for plugin in side.chain(0):
        prev = run(plugin, "ADD", prev)
    for plugin in side.chain(0):
        run(plugin, "CHECK", prev)
    if before_del:
        before_del()
    for plugin in reversed(side.chain(0)):
        run(plugin, "DEL", prev)


def crio_sides(tmp: Path, ours: Path, socket: Path, forwarder: Path | None = None,
               forwarder_socket: Path | None = None) -> list[CrioSide]:
    """v1.9.1 and pycni+daemon (the daemon at `socket`, no fallback) with CRI-O's CNI_ARGS;
    with `forwarder` (a `pycni install --forwarder` bin dir) pycni+forwarder too, on the daemon
    at `forwarder_socket` (else the same daemon)."""
    crio_args = ("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-1;"
                 f"K8S_POD_INFRA_CONTAINER_ID={'0' * 64};K8S_POD_UID=bench")

    def env(at: Path) -> dict[str, str]:
        return {"CNI_ARGS": crio_args, "PYCNI_SOCKET": str(at), "PYCNI_SHIM_FALLBACK": "0"}

    return [
        CrioSide("v1.9.1", REFERENCE_V19, "bref9", "10.96.0.0/16", tmp / "ref9-ipam",
                 env={"CNI_ARGS": crio_args}),
        CrioSide("pycni+daemon", ours, "bpyd0", "10.99.0.0/16", tmp / "pyd-ipam",
                 env=env(socket)),
        *([CrioSide("pycni+forwarder", forwarder, "bpyf0", "10.94.0.0/16", tmp / "pyf-ipam",
                    env=env(forwarder_socket or socket))] if forwarder else []),
    ]


def report(figures: Figures, ref: str, ours: str) -> None:
    med = lambda samples, k: statistics.median(s[k] for s in samples)  # noqa: E731
    print(f"| exec (median ms) | {ref} wall | its CPU | {ours} wall | ratio | shim CPU | "
          "daemon CPU |\n| --- | --- | --- | --- | --- | --- | --- |")
    run_pod = [0.0] * 5  # ADD and CHECK: what RunPodSandbox waits for
    for name, samples in figures[ours].items():
        row = [med(figures[ref][name], 0), med(figures[ref][name], 1), med(samples, 0),
               med(samples, 1), med(samples, 2)]
        print(f"| {name} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} | "
              f"{row[2] / row[0]:.2f}x | {row[3]:.1f} | {row[4]:.1f} |")
        if not name.startswith("DEL"):
            run_pod = [a + b for a, b in zip(run_pod, row, strict=True)]
    s = run_pod
    print(f"| ADD + CHECK, summed | {s[0]:.1f} | {s[1]:.1f} | {s[2]:.1f} | "
          f"{s[2] / s[0]:.2f}x | {s[3]:.1f} | {s[4]:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=15)
    parser.add_argument("--forwarder", action="store_true", help="a pycni+forwarder side too")
    args = parser.parse_args()
    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-crio-requests-"))
    lab = Lab()
    ours, _ = our_bin(tmp)
    fwd = our_bin(tmp, forwarder=True)[0] if args.forwarder else None
    cgroup = Cgroup("crio-daemon")
    daemon = Daemon.start(tmp, cgroup)
    sides = crio_sides(tmp, ours, daemon.socket, fwd)
    figures: Figures = defaultdict(lambda: defaultdict(list))
    try:
        for i in range(args.pods + 1):  # the first round (bridges, pool) is left out
            k = i % len(sides)
            for side in sides[k:] + sides[:k]:
                netns = lab.pod()
                try:
                    one_pod(side, netns, cgroup.cpu_ms if side.name != "v1.9.1" else None,
                            figures if i else None)
                finally:
                    lab.drop(netns)
    finally:
        daemon.stop()
        cgroup.remove()
    print(f"load (1-min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for side in sides[1:]:
        report(figures, "v1.9.1", side.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
