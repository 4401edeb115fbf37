"""The daemon's CPU for a request with nothing to do, two trees side by side (issue 38): A/B.

Starts a daemon from each tree (its own .venv and cni/), each in a fresh cgroup v2 from its
birth, in bench/run.py's throwaway host netns, and execs each tree's shim (bin/<plugin>, as a
runtime does: the exec evicts the caches a spare then runs on) for a few cheap requests:
loopback STATUS (the trip alone), loopback CHECK, portmap CHECK and DEL without mappings. The
trees alternate call by call. Per call: the daemon's CPU (cgroup cpu.stat, spares included,
read after GAP_MS so the spare is home) and its parent's (/proc/PID/schedstat). Medians.

    .venv/bin/python bench/hop_cpu.py OTHER_TREE [--rounds 60] [--gap 30]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from world import Cgroup, Lab, enter_private_mounts  # noqa: E402

PREV = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "x"}],
        "ips": [{"address": "10.1.0.5/24", "interface": 0}]}
CASES = {  # name -> (plugin, verb, config)
    "loopback STATUS": ("loopback", "STATUS", {"cniVersion": "1.1.0", "name": "n",
                                               "type": "loopback"}),
    "loopback CHECK": ("loopback", "CHECK", {"cniVersion": "1.0.0", "name": "n",
                                             "type": "loopback"}),
    "portmap CHECK": ("portmap", "CHECK", {"cniVersion": "1.0.0", "name": "n", "type": "portmap",
                                           "capabilities": {"portMappings": True},
                                           "snat": True, "prevResult": PREV}),
    "portmap DEL": ("portmap", "DEL", {"cniVersion": "1.0.0", "name": "n", "type": "portmap",
                                       "capabilities": {"portMappings": True},
                                       "snat": True, "prevResult": PREV}),
}


# What systemd gives the daemon, roughly; CRI-O's CNI_ARGS (bench/crio_requests.py)
DAEMON_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "LANG": "C.UTF-8", "INVOCATION_ID": "0" * 32, "JOURNAL_STREAM": "8:12345"}
CRIO_ARGS = ("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-1;"
             f"K8S_POD_INFRA_CONTAINER_ID={'0' * 64};K8S_POD_UID=bench")


class Tree:
    def __init__(self, name: str, root: Path, tmp: Path) -> None:
        self.name, self.root = name, root
        self.cgroup = Cgroup(f"hopcpu-{name}")
        self.sock = tmp / name / "pycni.sock"
        self.sock.parent.mkdir()
        log = tmp / f"{name}.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(root / ".venv/bin/python"), "-m", "cni.fast.daemon", "--socket",
                 str(self.sock)], stdout=out, stderr=subprocess.STDOUT, cwd=root,
                preexec_fn=self.cgroup.join, env=DAEMON_ENV)
        deadline = time.monotonic() + 120
        while "listening" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: the daemon did not start:\n{log.read_text()}")
            time.sleep(0.05)

    def parent_ms(self) -> float:
        return int(Path(f"/proc/{self.proc.pid}/schedstat").read_text().split()[0]) / 1e6

    def call(self, plugin: str, verb: str, conf: dict, netns: str, cid: str) -> None:
        env = {"PATH": os.environ["PATH"], "CNI_COMMAND": verb, "CNI_CONTAINERID": cid,
               "CNI_NETNS": netns, "CNI_IFNAME": "eth0" if plugin != "loopback" else "lo",
               "CNI_PATH": str(self.root / "bin"), "PYCNI_SOCKET": str(self.sock),
               "PYCNI_SHIM_FALLBACK": "0", "CNI_ARGS": CRIO_ARGS}
        proc = subprocess.run([str(self.root / "bin" / plugin)], env=env,
                              input=json.dumps(conf).encode(), capture_output=True)
        if proc.returncode != 0:
            raise SystemExit(f"{self.name} {plugin} {verb}: {proc.stdout!r} {proc.stderr!r}")

    def pss_kb(self) -> int:
        """The PSS of the parent and its children (spares, zygote) summed."""
        pids = [self.proc.pid, *map(int, Path(
            f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split())]
        total = 0
        for pid in pids:
            try:
                total += int(Path(f"/proc/{pid}/smaps_rollup").read_text()
                             .split("\nPss:")[1].split()[0])
            except OSError:
                continue
        return total

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.cgroup.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the tree to compare with (B)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--gap", type=float, default=30.0, help="ms after a call, then read")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-hop-cpu-"))
    lab = Lab()
    netns = lab.pod()
    subprocess.run(["ip", "-n", os.path.basename(netns), "link", "set", "lo", "up"], check=True)
    trees = [Tree("A", ROOT, tmp), Tree("B", args.other.resolve(), tmp)]
    cases = args.cases.split(",")
    cpu: dict[tuple[str, str], list[float]] = defaultdict(list)
    par: dict[tuple[str, str], list[float]] = defaultdict(list)
    try:
        for r in range(args.rounds + 2):  # two warm-up rounds (spares' first requests)
            for case in cases:
                plugin, verb, conf = CASES[case]
                for tree in trees[r % 2:] + trees[:r % 2]:
                    cid = secrets.token_hex(8)
                    c0, p0 = tree.cgroup.cpu_ms(), tree.parent_ms()
                    tree.call(plugin, verb, conf, netns, cid)
                    time.sleep(args.gap / 1000)
                    if r >= 2:
                        cpu[tree.name, case].append(tree.cgroup.cpu_ms() - c0)
                        par[tree.name, case].append(tree.parent_ms() - p0)
        time.sleep(1)
        pss = {tree.name: tree.pss_kb() for tree in trees}
    finally:
        for tree in trees:
            tree.stop()
        lab.drop(netns)
    print(f"A={ROOT} B={args.other} rounds={args.rounds} gap={args.gap:g} ms; "
          f"load (1-min) at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"PSS at the end (kB): A {pss['A']}, B {pss['B']}")
    print("| daemon CPU ms, median (p25-p75) | A all | B all | A parent | B parent |")
    print("| --- | --- | --- | --- | --- |")
    for case in cases:
        cells = []
        for d, t in ((cpu, "A"), (cpu, "B"), (par, "A"), (par, "B")):
            q = statistics.quantiles(d[t, case], n=4)
            cells.append(f"{statistics.median(d[t, case]):.3f} ({q[0]:.2f}-{q[2]:.2f})")
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
