"""A full node: the cost of one pod while the node fills (issue 26).

cnitool 1.3 (libcni) drives the chain bridge (ipMasq, ipMasqBackend nftables, host-local /16) +
portmap (backend nftables, one hostPort per pod) + bandwidth, with CAP_ARGS carrying each pod's
portMappings and bandwidth, for two sides interleaved in one run: pycni (its daemon running) and
the reference v1.9.1 (../shared/reference/bin). Each side lives in its own throwaway host netns
(its bridge, rules, ifbs), with its own store; libcni's cache is a tmpfs over /var/lib/cni in a
private mount namespace. At each fill (0, 110, 250 pods already attached):

- 10 more pods ADDed, CHECKed and DELed one at a time (cnitool's wall time, medians);
- 30 pods ADDed at once (wall time), then DELed at once;
- the daemon's memory;
- at the last fill: 50 more pods whose netns is then deleted (stale: cache, reservations,
  rules, ifb), `pycni gc` with the fill's pods as valid attachments, checked to remove exactly
  those 50 (timed).

Writes a section to bench/RESULTS.md (between markers) when run alone:

    .venv/bin/python bench/fullnode.py          # PYCNI_BENCH_FILL=0,20,50 for a quick run

(PYCNI_BENCH_PROFILE_ROWS: how many functions the profile lists per verb, default 12.)

`make bench` (bench/run.py) calls `run_section` and puts the section in its own report.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from world import Cgroup, born_in  # noqa: E402

REFERENCE_V19 = (ROOT / ".." / "shared" / "reference" / "bin").resolve()
CNITOOL = REFERENCE_V19 / "cnitool"
VENV_PY = ROOT / ".venv" / "bin" / "python"
RESULTS = ROOT / "bench" / "RESULTS.md"
CACHE_DIR = Path("/var/lib/cni")  # cnitool's (libcni's default), a tmpfs here
MARKERS = Path("/run/pycni")  # the daemon's DEL markers (cni.deleted), a tmpfs here
BEGIN, END = "<!-- fullnode: begin -->", "<!-- fullnode: end -->"
MEASURED = 10  # pods ADDed, CHECKed, DELed one at a time at each fill
PARALLEL = 30  # pods ADDed at once at each fill
STALE = 50  # stale attachments for GC at the last fill
FILL_WORKERS = 4  # threads filling a node (untimed)
IFNAME = "eth0"
CLONE_NEWNET = 0x40000000
BANDWIDTH = {"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
             "egressRate": 100_000_000, "egressBurst": 1_000_000}
# issue 26's targets
GROWTH_MAX, VS_REF_MAX, GC_MAX_S, RSS_GROWTH_MAX_MB = 1.15, 0.8, 2.0, 5.0

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def fills() -> list[int]:
    text = os.environ.get("PYCNI_BENCH_FILL", "0,110,250")
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 0:
        raise SystemExit(f"bench: PYCNI_BENCH_FILL={text!r}: pod counts, e.g. 0,110,250")
    return values


def container_id(netns: str) -> str:
    """cnitool's container ID: "cnitool-" + 20 hex digits of sha512(netns path)."""
    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def ifb_name(network: str, cid: str) -> str:
    return "bwp" + hashlib.sha512((network + cid).encode()).hexdigest()[:12]


@dataclass
class Pod:
    netns: str
    port: int

    @property
    def cid(self) -> str:
        return container_id(self.netns)


def new_pod_netns() -> str:
    name = f"fn-pod-{secrets.token_hex(5)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    return f"/run/netns/{name}"


def drop_netns(path: str) -> None:
    subprocess.run(["ip", "netns", "del", os.path.basename(path)], check=False,
                   capture_output=True)


@dataclass
class Node:
    """One side's throwaway node: a host netns, its conflist, store, attached pods."""

    name: str
    cni_path: Path
    network: str
    subnet: str
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    next_port: int = 10000
    errors: list[str] = field(default_factory=list)
    cgroup: Cgroup | None = None  # a world.Cgroup cnitool is born in (Cgroup.holding)
    host: str = ""
    fd: int = -1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.host = f"fn-host-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", self.host], check=True)
        self.fd = os.open(f"/run/netns/{self.host}", os.O_RDONLY | os.O_CLOEXEC)
        self.conf_dir = self.tmp / f"{self.network}-conf"
        self.data_dir = self.tmp / f"{self.network}-ipam"
        self.conf_dir.mkdir(parents=True)
        (self.conf_dir / f"{self.network}.conflist").write_text(json.dumps(self.conflist()))
        self.enter()
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        # a node's conntrack table is never empty (see run.py's Lab.track_a_flow)
        subprocess.run(["conntrack", "-I", "-p", "tcp", "-s", "192.0.2.10", "-d", "192.0.2.1",
                        "-r", "192.0.2.1", "-q", "192.0.2.10", "--sport", "40000", "--dport",
                        "80", "--reply-port-src", "80", "--reply-port-dst", "40000", "-t",
                        "86400", "--state", "ESTABLISHED"], check=True, capture_output=True)

    def conflist(self) -> dict[str, Any]:
        return {"cniVersion": "1.1.0", "name": self.network, "plugins": [
            {"type": "bridge", "bridge": "cnifn0", "isGateway": True, "ipMasq": True,
             "ipMasqBackend": "nftables",
             "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.data_dir)}},
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables",
             "snat": True},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        ]}

    def enter(self) -> None:
        """Move the calling thread into this node's host netns (its children start there)."""
        if _libc.setns(self.fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {self.host}")

    def new_pod(self) -> Pod:
        with self._lock:
            port, self.next_port = self.next_port, self.next_port + 1
        return Pod(new_pod_netns(), port)

    def cnitool(self, verb: str, pod: Pod) -> tuple[float, bool]:
        """One cnitool run in this node (calling thread moved here); its wall ms and success."""
        self.enter()
        caps = {"portMappings": [{"hostPort": pod.port, "containerPort": 80, "protocol": "tcp"}],
                "bandwidth": BANDWIDTH}
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "NETCONFPATH": str(self.conf_dir), "CNI_PATH": str(self.cni_path),
               "CAP_ARGS": json.dumps(caps), **self.env}
        start = time.perf_counter()
        with born_in(self.cgroup):
            proc = subprocess.run([str(CNITOOL), verb, self.network, pod.netns], env=env,
                                  capture_output=True)
        ms = (time.perf_counter() - start) * 1000
        if proc.returncode != 0:
            self.errors.append(f"{verb} {pod.cid}: exit {proc.returncode}: "
                               f"{(proc.stdout + proc.stderr).decode(errors='replace')[:300]}")
        return ms, proc.returncode == 0

    def add_many(self, count: int, workers: int) -> tuple[float, list[Pod]]:
        """ADD `count` new pods, `workers` at a time; the wall ms and the pods that succeeded."""
        pods = [self.new_pod() for _ in range(count)]
        with ThreadPoolExecutor(workers) as pool:
            start = time.perf_counter()
            oks = list(pool.map(lambda p: self.cnitool("add", p)[1], pods))
            ms = (time.perf_counter() - start) * 1000
        for pod, ok in zip(pods, oks, strict=True):
            if not ok:
                self.cnitool("del", pod)
                drop_netns(pod.netns)
        return ms, [p for p, ok in zip(pods, oks, strict=True) if ok]

    def del_many(self, pods: list[Pod], workers: int) -> float:
        with ThreadPoolExecutor(workers) as pool:
            start = time.perf_counter()
            list(pool.map(lambda p: self.cnitool("del", p), pods))
            ms = (time.perf_counter() - start) * 1000
        for pod in pods:
            drop_netns(pod.netns)
        return ms

    def fill_to(self, count: int) -> None:
        while len(self.pods) < count:
            _ms, added = self.add_many(count - len(self.pods), FILL_WORKERS)
            if not added:
                raise SystemExit(f"bench: {self.name}: cannot fill the node: {self.errors[-3:]}")
            self.pods += added

    # --- what is on the node (for GC's check) ---------------------------------------------

    def state(self) -> dict[str, set[str]]:
        """Container IDs found in each place an attachment leaves something."""
        self.enter()
        store = self.data_dir / self.network
        reservations = set()
        if store.is_dir():
            for f in store.iterdir():
                if f.name != "lock" and not f.name.startswith("last_reserved_ip"):
                    reservations.add(f.read_bytes().decode(errors="replace").split("\r\n")[0].strip())
        prefix = f"{self.network}-"
        cache = {f.name[len(prefix):].rsplit("-", 1)[0]
                 for f in (CACHE_DIR / "results").glob(f"{self.network}-*")}
        out = subprocess.run(["nft", "-j", "list", "ruleset"], capture_output=True, text=True)
        rules: set[str] = set()
        for o in json.loads(out.stdout or "{}").get("nftables", []):
            text = str(o.get("rule", {}).get("comment", ""))
            if "cnitool-" in text:
                at = text.index("cnitool-")
                rules.add(text[at:at + len("cnitool-") + 20])
        links = json.loads(subprocess.run(["ip", "-j", "link", "show", "type", "ifb"],
                                          capture_output=True, text=True).stdout or "[]")
        ifbs = {ln["ifname"] for ln in links}
        return {"reservations": reservations, "cache": cache, "rules": rules, "ifbs": ifbs}

    def close(self) -> None:
        for pod in self.pods:
            drop_netns(pod.netns)
        self.pods = []
        os.close(self.fd)
        subprocess.run(["ip", "netns", "del", self.host], check=False)


# --- the run -----------------------------------------------------------------------------------

@dataclass
class Figures:
    """fill -> metric -> side -> values; and the GC and memory lines."""

    values: dict[int, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    rss: dict[int, dict[str, int]] = field(default_factory=dict)
    gc: list[str] = field(default_factory=list)
    gc_ok: bool | None = None
    gc_seconds: float | None = None
    load: list[tuple[str, float]] = field(default_factory=list)
    profile: dict[tuple[int, str], Any] = field(default_factory=dict)

    def add(self, fill: int, metric: str, side: str, value: float) -> None:
        self.values.setdefault(fill, {}).setdefault(metric, {}).setdefault(side, []).append(value)

    def median(self, fill: int, metric: str, side: str) -> float | None:
        v = self.values.get(fill, {}).get(metric, {}).get(side)
        return statistics.median(v) if v else None


def one_at_a_time(nodes: list[Node], fill: int, f: Figures) -> None:
    for i in range(MEASURED):
        for node in nodes[i % len(nodes):] + nodes[:i % len(nodes)]:
            pod = node.new_pod()
            try:
                for verb in ("add", "check", "del"):
                    ms, ok = node.cnitool(verb, pod)
                    if ok:
                        f.add(fill, verb.upper(), node.name, ms)
                    elif verb == "add":
                        node.cnitool("del", pod)
                        break
            finally:
                drop_netns(pod.netns)


def at_once(nodes: list[Node], fill: int, f: Figures) -> None:
    for node in nodes[fill % len(nodes):] + nodes[:fill % len(nodes)]:
        ms, added = node.add_many(PARALLEL, PARALLEL)
        f.add(fill, f"{PARALLEL} ADD at once, wall", node.name, ms)
        f.add(fill, f"{PARALLEL} ADD at once, failures", node.name, PARALLEL - len(added))
        f.add(fill, f"{PARALLEL} DEL at once, wall", node.name, node.del_many(added, PARALLEL))


def pycni_gc(node: Node, f: Figures) -> None:
    """50 stale attachments beside the fill's valid ones; `pycni gc` must remove exactly them."""
    _ms, stale = node.add_many(STALE, FILL_WORKERS)
    for pod in stale:
        drop_netns(pod.netns)  # the pod is gone; its cache, store, rules and ifb are not
    gone = {p.cid for p in stale}
    valid = {p.cid for p in node.pods}
    before = node.state()
    valid_file = node.tmp / "valid.json"
    valid_file.write_text(json.dumps([{"containerID": c, "ifname": IFNAME} for c in valid]))
    node.enter()
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "NETCONFPATH": str(node.conf_dir), "CNI_PATH": str(node.cni_path), **node.env}
    start = time.perf_counter()
    proc = subprocess.run([str(VENV_PY), "-m", "cni.cli", "gc", node.network,
                           "--cache-dir", str(CACHE_DIR), "--valid-attachments",
                           f"@{valid_file}"], env=env, capture_output=True, text=True, cwd=ROOT)
    f.gc_seconds = time.perf_counter() - start
    after = node.state()
    ifbs = {ifb_name(node.network, c): c for c in gone | valid}
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[:300]}")
    for place in ("reservations", "cache", "rules", "ifbs"):
        def ids(state: dict[str, set[str]], place: str = place) -> set[str]:
            return {ifbs.get(x, "") for x in state[place]} if place == "ifbs" else state[place]
        was, now = ids(before), ids(after)
        removed = was - now
        if not gone <= was:
            problems.append(f"{place}: only {len(gone & was)} of the {len(gone)} stale were there")
        if removed != gone & was:
            problems.append(f"{place}: removed {len(removed)} ({len(removed - gone)} valid ones), "
                            f"left {len(gone & now)} stale")
        if not valid <= now:
            problems.append(f"{place}: {len(valid - now)} valid attachments lost")
        f.gc.append(f"{place}: {len(gone & was)} stale before, {len(removed)} removed, "
                    f"{len(valid & now)} of {len(valid)} valid kept")
    f.gc_ok = not problems
    f.gc += [f"PROBLEM {p}" for p in problems]


PROFILE_REPS = 5  # pods per profiled fill


def chain_requests(node: Node, pod: Pod, verb: str, prev: Any) -> list[tuple[str, bytes]]:
    """(plugin, stdin) as libcni builds them for one verb (prevResult threaded for ADD)."""
    caps = {"portMappings": [{"hostPort": pod.port, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": BANDWIDTH}
    conf = node.conflist()
    out = []
    for plugin in conf["plugins"]:
        one = {"cniVersion": conf["cniVersion"], "name": node.network, **plugin}
        wanted = {k: v for k, v in caps.items() if plugin.get("capabilities", {}).get(k)}
        if wanted:
            one["runtimeConfig"] = wanted
        if prev is not None:
            one["prevResult"] = prev
        out.append((plugin["type"], json.dumps(one).encode()))
    return out[::-1] if verb == "DEL" else out


def profile_verbs(node: Node, fill: int, into: dict[tuple[int, str], Any]) -> None:
    """cProfile of each verb of the chain run in-process (skel.run, as a daemon child runs it)
    in this node's host netns, PROFILE_REPS pods; stats accumulate into into[(fill, verb)]."""
    import cProfile

    from cni import skel
    from cni.fast import preload

    preload.preimport()  # what a daemon child has loaded (CHECK's rules by handle need it)
    node.enter()
    for rep in range(PROFILE_REPS + 1):  # the first pod warms imports, unprofiled
        pod = node.new_pod()
        env = {"CNI_CONTAINERID": pod.cid, "CNI_NETNS": pod.netns, "CNI_IFNAME": IFNAME,
               "CNI_PATH": str(node.cni_path)}
        result = None
        try:
            for verb in ("ADD", "CHECK", "DEL"):
                prof = cProfile.Profile() if rep else None
                if prof:
                    prof.enable()
                prev = result
                for plugin, stdin in chain_requests(node, pod, verb, result if verb != "ADD"
                                                    else None):
                    if verb == "ADD" and prev is not None:
                        stdin = json.dumps({**json.loads(stdin), "prevResult": prev}).encode()
                    reply = skel.run(plugin, {**env, "CNI_COMMAND": verb}, stdin)
                    if reply.code != 0:
                        node.errors.append(f"profile {verb} {plugin}: {reply.stdout[:200]!r}")
                    elif verb == "ADD":
                        prev = json.loads(reply.stdout)
                if verb == "ADD":
                    result = prev
                if prof:
                    prof.disable()
                    if (fill, verb) in into:
                        into[(fill, verb)].add(prof)
                    else:
                        import pstats
                        into[(fill, verb)] = pstats.Stats(prof)
        finally:
            drop_netns(pod.netns)


def profile_lines(stats: dict[tuple[int, str], Any], first: int, last: int) -> list[str]:
    """Per verb: the total, and the functions (ours, and the libraries' entry points) whose
    time per verb grew most from the first fill to the last."""
    def per_func(fill: int, verb: str) -> dict[str, tuple[float, float]]:
        st = stats.get((fill, verb))
        if st is None:
            return {}
        out = {}
        for (path, line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():
            if "/cni/" not in path and "nftables" not in path:
                continue
            where = path.split("/cni/", 1)[-1] if "/cni/" in path else os.path.basename(path)
            out[f"{where}:{line} {func}"] = (nc / PROFILE_REPS, ct * 1000 / PROFILE_REPS)
        return out

    rows = int(os.environ.get("PYCNI_BENCH_PROFILE_ROWS", "12"))
    lines = ["", f"Profile (cProfile, in-process skel.run of bridge, portmap, bandwidth in "
             f"pycni's node, {PROFILE_REPS} pods per fill; ms and calls per verb, cumulative; "
             f"the functions whose time grew most from {first} to {last} pods):", ""]
    for verb in ("ADD", "CHECK", "DEL"):
        a, b = per_func(first, verb), per_func(last, verb)
        if not b:
            continue
        total = [stats[(f, verb)].total_tt * 1000 / PROFILE_REPS for f in (first, last)
                 if (f, verb) in stats]
        lines += [f"{verb}: {' -> '.join(f'{t:.1f}' for t in total)} ms per verb in-process "
                  "(wall, under the profiler)", "",
                  f"| function | calls | ms at {first} | ms at {last} |",
                  "| --- | --- | --- | --- |"]
        grown = sorted(b, key=lambda k: b[k][1] - a.get(k, (0, 0))[1], reverse=True)[:rows]
        for k in grown:
            lines.append(f"| `{k}` | {b[k][0]:g} | {a.get(k, (0, 0))[1]:.2f} | {b[k][1]:.2f} |")
        lines.append("")
    return lines


def run_section(tmp: Path, pycni_bin: Path, start_daemon: Any) -> list[str]:
    """The whole full-node run; the report section's lines. `start_daemon(dir)` starts a pycni
    daemon (run.py's Daemon.start) in the calling thread's netns."""
    with node_state():
        return _run_section(tmp, pycni_bin, start_daemon)


@contextmanager
def node_state() -> Iterator[None]:
    """libcni's cache and pycni's DEL markers on a tmpfs (in the private mount namespace), and
    the calling thread back in its netns afterwards (Nodes move it into theirs)."""
    for where, opts in ((CACHE_DIR, "mode=0755"), (MARKERS, "mode=0700")):
        where.mkdir(parents=True, exist_ok=True)  # as scripts/test.sh: a tmpfs over it, here only
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "pycni-bench", str(where)],
                       check=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)  # to come back to
    try:
        yield
    finally:
        for where in (CACHE_DIR, MARKERS):
            subprocess.run(["umount", str(where)], check=False)
        _libc.setns(home, CLONE_NEWNET)
        os.close(home)


def _run_section(tmp: Path, pycni_bin: Path, start_daemon: Any) -> list[str]:
    f = Figures()
    steps = fills()
    ref = Node("reference v1.9.1", REFERENCE_V19, "fullref", "10.60.0.0/16", tmp)
    ours = Node("pycni+daemon", pycni_bin, "fullpy", "10.61.0.0/16", tmp)
    ours.enter()
    daemon_dir = tmp / "fullnode-daemon"
    daemon_dir.mkdir()
    daemon = start_daemon(daemon_dir)
    ours.env["PYCNI_SOCKET"] = str(daemon.socket)
    nodes = [ref, ours]
    try:
        for fill in steps:
            for node in nodes:
                node.fill_to(fill)
            f.load.append((f"at {fill}", os.getloadavg()[0]))
            f.rss[fill] = daemon.memory_kb()
            one_at_a_time(nodes, fill, f)
            at_once(nodes, fill, f)
            f.rss[fill] = daemon.memory_kb()  # after this fill's work: RSS grown with the node?
            if fill in (steps[0], steps[-1]):
                profile_verbs(ours, fill, f.profile)
        pycni_gc(ours, f)
        f.load.append(("end", os.getloadavg()[0]))
    finally:
        daemon.stop()
        for node in nodes:
            node.close()
    errors = [f"[{n.name}] {e}" for n in nodes for e in n.errors]
    return report(f, steps, [n.name for n in nodes], errors)


# --- the report ----------------------------------------------------------------------------------

def report(f: Figures, steps: list[int], names: list[str], errors: list[str]) -> list[str]:
    ref, ours = names
    last = steps[-1]
    lines = [BEGIN, "", "## Full node (issue 26)", "",
             f"cnitool 1.3 driving bridge (ipMasq, nftables, host-local /16) + portmap "
             f"(nftables, one hostPort) + bandwidth; {ref} and {ours} interleaved, each in its "
             f"own throwaway host netns. At each fill: {MEASURED} pods ADDed, CHECKed, DELed "
             f"one at a time (cnitool wall ms, median / max), {PARALLEL} pods ADDed at once "
             "(wall ms). Growth = cost at the fill / cost at the first fill; "
             "vs ref = ours / reference at the same fill.",
             f"- load (1-min average, {os.cpu_count()} CPUs): "
             + ", ".join(f"{p} {v:.1f}" for p, v in f.load), ""]
    head = ["metric", "fill", ref, f"{ref} growth", ours, f"{ours} growth", "vs ref"]
    rows = [head, ["---"] * len(head)]
    metrics = [m for m in ("ADD", "CHECK", "DEL", f"{PARALLEL} ADD at once, wall",
                           f"{PARALLEL} DEL at once, wall", f"{PARALLEL} ADD at once, failures")]
    for metric in metrics:
        for fill in steps:
            by = f.values.get(fill, {}).get(metric, {})
            row = [metric, str(fill)]
            for side in names:
                values = by.get(side)
                if not values:
                    row += ["-", ""]
                    continue
                if "failures" in metric:
                    row += [f"{sum(values):g}", ""]
                    continue
                med = statistics.median(values)
                base = f.median(steps[0], metric, side)
                row += [f"{med:.1f} / {max(values):.1f}" if len(values) > 2 else f"{med:.1f}",
                        f"{med / base:.2f}x" if base else ""]
            r, o = f.median(fill, metric, ref), f.median(fill, metric, ours)
            row.append(f"{o / r:.2f}x" if r and o is not None and "failures" not in metric
                       else "")
            rows.append(row)
    for fill in steps:
        kb = f.rss.get(fill, {})
        rows.append(["daemon memory (VmRSS; PSS with children)", str(fill), "", "",
                     f"{kb.get('VmRSS', 0) / 1024:.1f} MB; {kb.get('Pss', 0) / 1024:.1f} MB",
                     "", ""])
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"Targets (issue 26, at {last} pods"
              + ("" if last == 250 else "; the issue's figures are for 250") + "):", ""]
    lines += targets(f, steps, names)
    lines += ["", f"GC at {last} pods ({STALE} stale, `pycni gc --valid-attachments`): "
              + ("; ".join(f.gc) or "not run")]
    lines += ["", "The reference's `cnitool gc` is not run: it passes libcni no valid "
              "attachments, so every cached attachment is stale (it would remove all of them)."]
    lines += profile_lines(f.profile, steps[0], last)
    if errors:
        lines += ["", "Errors:", *[f"- {e}" for e in errors[:20]]]
    lines += ["", END]
    return lines


def targets(f: Figures, steps: list[int], names: list[str]) -> list[str]:
    ref, ours = names
    first, last = steps[0], steps[-1]
    out = []

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"
    for verb in ("ADD", "CHECK", "DEL"):
        o0, o, r = f.median(first, verb, ours), f.median(last, verb, ours), \
            f.median(last, verb, ref)
        if o0 and o:
            out.append(f"- {verb} growth {first} -> {last} <= {GROWTH_MAX}x: "
                       f"{o / o0:.2f}x ({o0:.1f} -> {o:.1f} ms): {mark(o / o0 <= GROWTH_MAX)}")
        if r and o:
            out.append(f"- {verb} at {last} <= {VS_REF_MAX}x the reference: {o / r:.2f}x "
                       f"({o:.1f} vs {r:.1f} ms): {mark(o / r <= VS_REF_MAX)}")
    wall = f"{PARALLEL} ADD at once, wall"
    o, r = f.median(last, wall, ours), f.median(last, wall, ref)
    if o and r:
        out.append(f"- {PARALLEL} ADDs at once at {last} <= {VS_REF_MAX}x the reference: "
                   f"{o / r:.2f}x ({o:.0f} vs {r:.0f} ms): {mark(o / r <= VS_REF_MAX)}")
    if f.gc_seconds is not None:
        out.append(f"- GC of {last + STALE} attachments removes exactly the {STALE} stale: "
                   f"{mark(bool(f.gc_ok))}; <= {GC_MAX_S} s: {f.gc_seconds:.2f} s: "
                   f"{mark(f.gc_seconds <= GC_MAX_S)}")
    r0, r1 = f.rss.get(first, {}).get("VmRSS"), f.rss.get(last, {}).get("VmRSS")
    if r0 and r1:
        grown = (r1 - r0) / 1024
        out.append(f"- daemon RSS at {last} within {RSS_GROWTH_MAX_MB:g} MB of its RSS at "
                   f"{first}: {grown:+.1f} MB: {mark(grown <= RSS_GROWTH_MAX_MB)}")
    return out


def write_section(lines: list[str], begin: str = BEGIN, end: str = END,
                  path: Path = RESULTS) -> None:
    """Put the section into bench/RESULTS.md (or path), replacing an earlier one (between its
    markers), else at the end."""
    text = path.read_text() if path.exists() else ""
    section = "\n".join(lines)
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> int:
    import tempfile

    from world import Daemon, enter_private_mounts, our_bin

    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-fullnode-"))
    pycni_bin, _how = our_bin(tmp)
    lines = run_section(tmp, pycni_bin, Daemon.start)
    print("\n".join(lines))
    write_section(lines)
    print(f"\nwritten to {RESULTS.relative_to(ROOT)}")
    subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
