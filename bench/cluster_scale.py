"""A cluster at scale, measured (issue 46 item 6; not part of `make bench`, run alone as root):

    .venv/bin/python bench/cluster_scale.py [--nodes 6] [--pods 20] [--pairs 50] [--write]

For each side, pycni (the installed executables, a daemon per node) and the reference v1.9.1
(../shared/reference/bin), one cluster of --nodes nodes and one lone node, all up at once and
driven interleaved. A node is a network namespace; the cluster's nodes are joined by an underlay
bridge and run BIRD 2 with conf/bird-node.conf.in (iBGP full mesh, each announcing its pod CIDR),
as integration/cluster/topology.py builds them for `make cluster-test` (its underlay, node
network, BIRD and address plan are reused: node N is 192.168.100.N, its pods 10.100.N.0/24 of
10.100.0.0/16). cnitool 1.3 stands in for the runtime: the chain is bridge (cni0, gateway,
ipMasq with the nftables backend, host-local on the node's /24, pycni's side with
nonMasqueradeCIDRs [the cluster's /16]) + loopback + portmap (nftables, one hostPort per pod).
A pod is a network namespace.

1. Join: node by node, its BIRD starts and its first pod is ADDed; each earlier node's first pod
   pings the new pod (one echo per try) until a reply: the seconds from the ADD's start (BGP
   session, route to every node, the first ADD that makes the bridge).
2. Fill: --pods pods per node, one at a time, round-robin over every node of both sides (lone
   nodes too): ADD, then CHECK, each timed (cnitool's wall time).
3. Reachability: --pairs random (source, destination) pod pairs per side, the same indices on
   both sides: `ping -c1 -W2` by pod IP; across nodes, whether the destination node's
   conntrack saw the source pod's own IP (no NAT between pods) or its node's (masqueraded).
4. DEL of every pod, timed, round-robin; then each node's leftovers (reservations, veths on
   cni0).

Report: per side, ADD / CHECK / DEL medians and p90 on the lone node and on the cluster's nodes
(and the slowest node's median), cluster / lone and pycni / v1.9.1 ratios; reachability; the
join times. Bounded: --max-minutes (a step past it stops the run), every command with a timeout.
It runs in its own mount and PID namespaces (`unshare --pid --kill-child`): everything it
starts (BIRD, daemons, pings) dies with it, Ctrl-C or not, and the network namespaces, pinned
only in its private /run/netns, go with the mount namespace. Traffic only between the namespaces
it made. --write puts the section into bench/RESULTS.md and bench/BREAKDOWN.md (the record
`make bench` carries into the RESULTS.md it writes), between its markers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "integration"),
                str(ROOT / "integration" / "cluster")]

from cnitest import Netns, delete_netns, new_netns  # noqa: E402
from fullnode import (  # noqa: E402
    CLONE_NEWNET,
    CNITOOL,
    REFERENCE_V19,
    RESULTS,
    _libc,
    node_state,
    write_section,
)
from topology import CLUSTER4, Bird, Member, _node_network, _underlay, pod_cidrs, render_bird  # noqa: E402
from world import Daemon, enter_private_mounts, our_bin  # noqa: E402

NETWORK = "scale"
BRIDGE = "cni0"
BEGIN, END = "<!-- cluster-scale: begin -->", "<!-- cluster-scale: end -->"
BREAKDOWN = ROOT / "bench" / "BREAKDOWN.md"
VERBS = ("ADD", "CHECK", "DEL")
CMD_TIMEOUT = 60  # any one command
JOIN_TIMEOUT = 60  # a new node's pod reached by the others
STOP = threading.Event()  # set when the run is failing or interrupted: the pollers give up


class NetnsNode:
    """What topology.Bird needs of a node (run, popen) where the node is a network namespace
    only (no runtime, so no mount namespace of its own)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def argv(self, *cmd: str) -> list[str]:
        return ["nsenter", f"--net={self.path}", "--", *cmd]

    def run(self, *cmd: str, check: bool = True, timeout: float = CMD_TIMEOUT,
            **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*cmd), capture_output=True, text=True, check=check,
                              timeout=timeout, **kw)

    def popen(self, *cmd: str, **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*cmd), **kw)


@dataclass
class Pod:
    netns: Netns
    port: int
    ip: str = ""


@dataclass
class ScaleNode:
    """One node of a side: its netns, conflist, store, daemon (pycni), BIRD (cluster), pods."""

    side: Side
    member: Member  # topology's node (its number, netns, addresses)
    lone: bool
    pods: list[Pod] = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    bird: Bird | None = None
    fd: int = -1

    @property
    def name(self) -> str:
        return "lone" if self.lone else f"node{self.member.i}"

    @property
    def conf_dir(self) -> Path:
        return self.member.work / "net.d"

    @property
    def data_dir(self) -> Path:
        return self.member.work / "ipam"

    def setup(self) -> None:
        self.member.work.mkdir(parents=True)
        self.conf_dir.mkdir()
        (self.conf_dir / f"{NETWORK}.conflist").write_text(json.dumps(self.conflist()))
        self.fd = os.open(self.member.netns.path, os.O_RDONLY | os.O_CLOEXEC)

    def conflist(self) -> dict[str, Any]:
        bridge: dict[str, Any] = {
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
            "ipMasqBackend": "nftables",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidrs(self.member.i)[0]}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.data_dir)}}
        if not self.side.reference:  # the reference has no such key
            bridge["nonMasqueradeCIDRs"] = [CLUSTER4]
        return {"cniVersion": "1.1.0", "name": NETWORK, "plugins": [
            bridge, {"type": "loopback"},
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables",
             "snat": True}]}

    def enter(self) -> None:
        """The calling thread into this node's netns (the processes it starts begin there)."""
        if _libc.setns(self.fd, CLONE_NEWNET) != 0:
            raise OSError("setns into " + self.member.netns.name)

    def cnitool(self, verb: str, pod: Pod, timed: bool = True) -> dict[str, Any] | None:
        """One cnitool run for pod; its wall ms into times[verb]; the result (ADD) or None."""
        self.enter()
        caps = {"portMappings": [{"hostPort": pod.port, "containerPort": 80, "protocol": "tcp"}]}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NETCONFPATH": str(self.conf_dir),
               "CNI_PATH": str(self.side.cni_path), "CAP_ARGS": json.dumps(caps), **self.env}
        start = time.perf_counter()
        proc = subprocess.run([str(CNITOOL), verb.lower(), NETWORK, pod.netns.path], env=env,
                              capture_output=True, text=True, timeout=CMD_TIMEOUT)
        ms = (time.perf_counter() - start) * 1000
        if proc.returncode != 0:
            self.side.errors.append(f"{self.name} {verb} {pod.netns.name}: exit "
                                    f"{proc.returncode}: {(proc.stdout + proc.stderr)[:300]}")
            return None
        if timed:
            self.times.setdefault(verb, []).append(ms)
        return json.loads(proc.stdout) if verb == "ADD" else {}

    def add_pod(self, verb_key: str = "ADD") -> Pod | None:
        """A new pod ADDed (its time under verb_key), then CHECKed; None if the ADD failed."""
        j = len(self.pods)
        pod = Pod(new_netns(f"cs-{self.side.tag}{self.member.i}-{j}"), 10000 + j)
        self.side.pod_ns.append(pod.netns)
        start = time.perf_counter()
        result = self.cnitool("ADD", pod, timed=False)
        if result is None:
            self.cnitool("DEL", pod, timed=False)
            return None
        self.times.setdefault(verb_key, []).append((time.perf_counter() - start) * 1000)
        pod.ip = result["ips"][0]["address"].split("/")[0]
        self.pods.append(pod)
        self.cnitool("CHECK", pod)
        return pod

    def leftovers(self) -> str:
        store = self.data_dir / NETWORK
        held = [f for f in store.iterdir() if f.name != "lock"
                and not f.name.startswith("last_reserved_ip")] if store.is_dir() else []
        veths = self.member.netns.ip("link", "show", "master", BRIDGE) if any(
            ln["ifname"] == BRIDGE for ln in self.member.netns.ip("link", "show")) else []
        return "" if not held and not veths else \
            f"{self.name}: {len(held)} reservations, {len(veths)} veths on {BRIDGE}"


@dataclass
class Side:
    name: str
    tag: str  # in its namespaces' names
    cni_path: Path
    reference: bool
    work: Path
    nodes: list[ScaleNode] = field(default_factory=list)  # the cluster's
    lone: ScaleNode | None = None
    errors: list[str] = field(default_factory=list)
    pod_ns: list[Netns] = field(default_factory=list)
    joins: list[tuple[int, int, float | None]] = field(default_factory=list)  # new, peer, s
    reach: list[tuple[bool, bool, bool | None]] = field(default_factory=list)  # (same node,
    # replied, across nodes: the source pod's IP seen at the destination's node)
    leftovers: list[str] = field(default_factory=list)

    @property
    def all_nodes(self) -> list[ScaleNode]:
        assert self.lone is not None
        return [self.lone, *self.nodes]


class Budget:
    def __init__(self, minutes: float) -> None:
        self.deadline = time.monotonic() + minutes * 60

    def check(self, step: str) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"over the time budget (--max-minutes) at {step}")


def build(side: Side, n: int, stack: contextlib.ExitStack) -> None:
    """The side's underlay, cluster nodes and lone node, each with its conflist and (pycni) its
    daemon; no BIRD yet (a node's BIRD starts when it joins)."""
    underlay, _router, _outside = _underlay(stack)
    for i in range(n + 1):
        m = Member(i or 250, "cnitool", new_netns(f"cs-{side.tag}n{i}"), work=side.work / f"n{i}")
        stack.callback(delete_netns, m.netns)
        node = ScaleNode(side, m, lone=i == 0)
        node.setup()
        if node.lone:
            m.netns.run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            side.lone = node
        else:
            _node_network(underlay, m)
            side.nodes.append(node)
        if not side.reference:
            node.enter()  # the daemon lives in the node's netns, as on a node
            daemon = Daemon.start(m.work)
            stack.callback(daemon.stop)
            node.env = {"PYCNI_SOCKET": str(daemon.socket), "PYCNI_SHIM_FALLBACK": "0"}


def ping_until_reply(src: Pod, dst: str, timeout: float) -> bool:
    """src's namespace pings dst (one echo, 0.3 s for its reply) until a reply (True) or
    timeout. One ping per try: a ping counts an ICMP error (the router's "net unreachable"
    before the route is there, seen when the source is masqueraded) as its one answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not STOP.is_set():
        if subprocess.run(["nsenter", f"--net={src.netns.path}", "--", "ping", "-n", "-q",
                           "-c1", "-W0.3", dst], capture_output=True,
                          timeout=CMD_TIMEOUT).returncode == 0:
            return True
        time.sleep(0.05)
    return False


def join(side: Side, node: ScaleNode) -> None:
    """node's BIRD starts, its first pod is ADDed; the earlier nodes' first pods ping it."""
    peers = [o.member.i for o in side.nodes if o is not node]
    node.bird = Bird(NetnsNode(node.member.netns.path), node.member.work / "bird",
                     render_bird(node.member.i, peers))
    start = time.monotonic()
    pod = node.add_pod("first ADD")
    if pod is None:
        return
    earlier = [o for o in side.nodes[:side.nodes.index(node)] if o.pods]

    def reached(peer: ScaleNode) -> tuple[int, int, float | None]:
        ok = ping_until_reply(peer.pods[0], pod.ip, JOIN_TIMEOUT)
        return node.member.i, peer.member.i, (time.monotonic() - start) if ok else None
    side.joins += in_threads(reached, earlier, max(1, len(earlier)))


def reachability(side: Side, pairs: list[tuple[int, int]]) -> None:
    """Each pair's source pod pings the destination pod by its IP; for a reply across nodes,
    whether the destination node's conntrack saw the source pod's own IP (no NAT on the way:
    nonMasqueradeCIDRs) or another (the source node's, masqueraded)."""
    pods = [(n, p) for n in side.nodes for p in n.pods]

    def one(pair: tuple[int, int]) -> tuple[bool, bool, bool | None]:
        (a_node, a), (b_node, b) = pods[pair[0] % len(pods)], pods[pair[1] % len(pods)]
        proc = subprocess.run(["nsenter", f"--net={a.netns.path}", "--", "ping", "-n", "-q",
                               "-c1", "-W2", b.ip], capture_output=True, timeout=CMD_TIMEOUT)
        same, ok = a_node is b_node, proc.returncode == 0
        if same or not ok:
            return same, ok, None
        out = NetnsNode(b_node.member.netns.path).run(
            "conntrack", "-L", "-f", "ipv4", "-p", "icmp", "-d", b.ip, check=False).stdout
        sources = {ln.split("src=")[1].split()[0] for ln in out.splitlines() if "src=" in ln}
        return same, ok, a.ip in sources
    side.reach = in_threads(one, pairs, 4)


def in_threads(fn: Any, items: list, workers: int) -> list:
    """fn over items in `workers` threads; on an interrupt the pollers are told to give up
    before the pool is waited for."""
    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(fn, items))
    except BaseException:
        STOP.set()
        raise
    finally:
        pool.shutdown(wait=True)


def interleaved(sides: list[Side], k: int) -> list[Side]:
    return sides[k % len(sides):] + sides[:k % len(sides)]


def run(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> list[Side]:
    budget = Budget(args.max_minutes)
    pycni_bin, _how = our_bin(tmp)
    sides = [Side("v1.9.1", "r", REFERENCE_V19, True, tmp / "ref"),
             Side("pycni+daemon", "p", pycni_bin, False, tmp / "pycni")]
    for side in sides:
        build(side, args.nodes, stack)
        stack.callback(lambda s=side: [n.bird.stop() for n in s.nodes if n.bird])
        stack.callback(lambda s=side: [delete_netns(ns) for ns in s.pod_ns])
    print(f"cluster-scale: {args.nodes} nodes + a lone node per side built", flush=True)
    for side in interleaved(sides, 0):
        side.all_nodes[0].add_pod("first ADD")  # the lone node's first pod
    for k in range(args.nodes):
        for side in interleaved(sides, k):
            budget.check(f"node{k + 1}'s join")
            join(side, side.nodes[k])
    print("cluster-scale: joined", flush=True)
    for j in range(1, args.pods):
        budget.check(f"pod {j}")
        for k in range(args.nodes + 1):
            for side in interleaved(sides, j + k):
                side.all_nodes[k].add_pod()
    print("cluster-scale: filled", flush=True)
    rng = random.Random(args.seed)
    total = args.nodes * args.pods
    pairs = [(a, b) for a, b in (rng.sample(range(total), 2) for _ in range(args.pairs))]
    for side in sides:
        budget.check("reachability")
        reachability(side, pairs)
    for j in range(args.pods):
        budget.check(f"DEL {j}")
        for k in range(args.nodes + 1):
            for side in interleaved(sides, j + k):
                node = side.all_nodes[k]
                if j < len(node.pods):
                    node.cnitool("DEL", node.pods[j])
    for side in sides:
        side.leftovers = [x for n in side.all_nodes if (x := n.leftovers())]
    return sides


# --- the report --------------------------------------------------------------------------------

def stats(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
    return statistics.median(values), p90


def fmt(s: tuple[float, float] | None) -> str:
    return f"{s[0]:.1f} / {s[1]:.1f}" if s else "-"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(sides: list[Side], args: argparse.Namespace, load: list[tuple[str, float]],
           minutes: float) -> list[str]:
    ref, ours = sides
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [BEGIN, "", f"## Issue 46: a cluster at scale ({when})",
             "", f"`bench/cluster_scale.py --nodes {args.nodes} --pods {args.pods} --pairs "
             f"{args.pairs}`: per side ({ref.name}, {ours.name}) a cluster of {args.nodes} nodes "
             f"(network namespaces on an underlay bridge, BIRD 2 each, iBGP full mesh) and a "
             f"lone node, {args.pods} pods (network namespaces) on every node; cnitool 1.3 "
             "driving bridge (ipMasq, nftables, host-local /24; pycni with nonMasqueradeCIDRs) "
             "+ loopback + portmap (nftables, one hostPort per pod); both sides and every node "
             "interleaved pod by pod, one request at a time. "
             f"{minutes:.1f} min; load (1-min average, {os.cpu_count()} CPUs, other helpers' "
             "tests on the box too): " + ", ".join(f"{p} {v:.1f}" for p, v in load) + ".", "",
             "ADD / CHECK / DEL, cnitool's wall ms, median / p90 (`first ADD` makes the bridge "
             "and, on a cluster node, runs while its BIRD joins; one per node):", "",
             "| verb | where | v1.9.1 | pycni+daemon | pycni / v1.9.1 |",
             "| --- | --- | --- | --- | --- |"]
    for verb in ("first ADD", *VERBS):
        lone = [stats(s.lone.times.get(verb, [])) if s.lone else None for s in sides]
        pooled = [stats([t for n in s.nodes for t in n.times.get(verb, [])]) for s in sides]
        rows = [("lone node", lone), (f"cluster, {args.nodes} nodes pooled", pooled)]
        for where, (a, b) in rows:
            lines.append(f"| {verb} | {where} | {fmt(a)} | {fmt(b)} | "
                         f"{ratio(b and b[0], a and a[0])} |")
        lines.append(f"| {verb} | cluster / lone (medians) | "
                     f"{ratio(pooled[0] and pooled[0][0], lone[0] and lone[0][0])} | "
                     f"{ratio(pooled[1] and pooled[1][0], lone[1] and lone[1][0])} | |")
        if verb != "first ADD":
            slow = [max((stats(n.times.get(verb, [])) or (0.0, 0.0), n.name) for n in s.nodes)
                    for s in sides]
            lines.append(f"| {verb} | slowest cluster node's median | "
                         + " | ".join(f"{m[0]:.1f} ({name})" for m, name in slow)
                         + f" | {ratio(slow[1][0][0], slow[0][0][0])} |")
    lines += ["", f"Reachability: {args.pairs} random pod pairs of the cluster (the same pairs "
              "on both sides), `ping -c1 -W2` by pod IP; across nodes, the source address the "
              "destination node's conntrack saw for the echo (the pod's own: no NAT between "
              "pods):", "",
              "| side | other node: replied / pairs | pod's own source seen | "
              "same node: replied / pairs |", "| --- | --- | --- | --- |"]
    for s in sides:
        cells = [f"{sum(ok for same, ok, _k in s.reach if same == want)} / "
                 f"{sum(same == want for same, _ok, _k in s.reach)}" for want in (False, True)]
        kept = [k for _s, _o, k in s.reach if k is not None]
        lines.append(f"| {s.name} | {cells[0]} | {sum(kept)} / {len(kept)} | {cells[1]} |")
    lines += ["", "Join: node by node, its BIRD starts and its first pod is ADDed; every "
              "earlier node's first pod pings it (one echo per try, 0.3 s for its reply): "
              f"seconds from that ADD's start to the first reply (no reply in {JOIN_TIMEOUT} s: "
              "missed):", "",
              "| side | pairs | median | max | missed | per joining node (max) |",
              "| --- | --- | --- | --- | --- | --- |"]
    for s in sides:
        got = [t for _n, _p, t in s.joins if t is not None]
        per: dict[int, str] = {}
        for new in sorted({new for new, _p, _t in s.joins}):
            times = [t for n, _p, t in s.joins if n == new]
            per[new] = f"{max(times):.2f}" if None not in times else "missed"
        lines.append(f"| {s.name} | {len(s.joins)} | "
                     + (f"{statistics.median(got):.2f} | {max(got):.2f}" if got else "- | -")
                     + f" | {len(s.joins) - len(got)} | "
                     + ", ".join(f"node{k}: {v}" for k, v in per.items()) + " |")
    lines += ["", "Leftovers after every DEL: "
              + "; ".join(f"{s.name}: {', '.join(s.leftovers) or 'none'}" for s in sides)]
    errors = [f"[{s.name}] {e}" for s in sides for e in s.errors]
    if errors:
        lines += ["", "Errors:", *[f"- {e}" for e in errors[:20]]]
    lines += ["", END]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--pods", type=int, default=20, help="pods per node")
    p.add_argument("--pairs", type=int, default=50, help="random pod pairs pinged per side")
    p.add_argument("--seed", type=int, default=46)
    p.add_argument("--max-minutes", type=float, default=30)
    p.add_argument("--write", action="store_true", help="the section into bench/RESULTS.md")
    args = p.parse_args()
    if not 2 <= args.nodes <= 200 or not 1 <= args.pods <= 250 or args.pairs < 0:
        p.error("--nodes 2..200, --pods 1..250, --pairs >= 0")
    if os.environ.get("PYCNI_BENCH_NS") != "1":  # own mount and PID namespaces: see above
        if os.geteuid() != 0:
            raise SystemExit("bench: needs root (network namespaces)")
        os.environ["PYCNI_BENCH_NS"] = "1"
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--pid",
                              "--fork", "--kill-child", "--mount-proc", "--",
                              sys.executable, *sys.argv])
    enter_private_mounts()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # pid 1 here: no default action
    tmp = Path(tempfile.mkdtemp(prefix="pycni-scale-"))
    started = time.monotonic()
    load = [("start", os.getloadavg()[0])]
    try:
        with node_state(), contextlib.ExitStack() as stack:
            sides = run(args, tmp, stack)
            load.append(("end", os.getloadavg()[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = report(sides, args, load, (time.monotonic() - started) / 60)
    print("\n".join(lines))
    if args.write:  # BREAKDOWN.md: the record `make bench` appends to the RESULTS.md it writes
        for path in (RESULTS, BREAKDOWN):
            write_section(lines, BEGIN, END, path)
        print("\nwritten to bench/RESULTS.md and bench/BREAKDOWN.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
