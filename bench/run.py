"""`make bench`: the pod chain through the reference Go plugins and through pycni, side by side.

Sides: the reference (/usr/lib/cni, Debian's v1.1.1), the reference v1.9.1 with its nftables
backends (../shared/reference/bin, when there), pycni with its daemon, pycni's forwarder (`pycni
install --forwarder`, the same daemon), pycni without a daemon (every exec imports everything).
They run interleaved in one process on the same machine, through one driver (driver.py) that
execs plugins as libcni does. Everything happens in throwaway namespaces: a private mount
namespace (its own /run/netns), one "host" netns this process enters, a pod netns per pod, a tmp
dataDir. Writes a table to stdout and bench/RESULTS.md.

    .venv/bin/python bench/run.py [--iterations 15] [--version-runs 40] [--pods 30]
    .venv/bin/python bench/run.py --trip-only [--trip-runs 20]   # the trip rows alone (issue 38)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from driver import (  # noqa: E402
    LIBCNI_VERSION_STDIN,
    Exec,
    Pod,
    Side,
    addresses,
    chain_add,
    chain_check,
    chain_del,
    run_plugin,
)
from world import (  # noqa: E402
    REFERENCE_V19,
    ROOT,
    VENV_PY,
    Daemon,
    Lab,
    enter_private_mounts,
    our_bin,
)

from cni import registry  # noqa: E402
from cni.install.errors import InstallError  # noqa: E402

REFERENCE = Path("/usr/lib/cni")
V19 = "reference v1.9.1"
# Each plugin measured is run on every side: those the v1.9.1 build has (tuning is not built
# there; Debian's 1.1.1 has it).
PLUGINS = tuple(n for n in registry.NAMES
                if not REFERENCE_V19.is_dir() or (REFERENCE_V19 / n).exists())
CHAIN = ("loopback", "bridge", "portmap", "bandwidth")
RESULTS = ROOT / "bench" / "RESULTS.md"


# --- the throwaway world ----------------------------------------------------------------------

def ensure_iptables() -> None:
    """The reference portmap and bridge ipMasq shell out to iptables (rules stay in our netns)."""
    if shutil.which("iptables") is None:
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "iptables"],
                       check=True)


# --- measuring --------------------------------------------------------------------------------

@dataclass
class Samples:
    """metric -> side -> values; plus what went wrong, to print under the table."""

    values: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    rss: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # side -> (kB, exec)
    errors: list[str] = field(default_factory=list)
    failures: dict[str, tuple[str, int]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def add(self, metric: str, side: str, value: float) -> None:
        if metric not in self.order:
            self.order.append(metric)
        self.values[metric][side].append(value)

    def record(self, side: Side, execs: list[Exec], failed_too: bool = False) -> None:
        """Times of the execs (failed ones too with failed_too); failures go to the errors."""
        for ex in execs:
            if ex.ok or failed_too:
                self.add(f"{ex.plugin} {ex.command}", side.name, ex.seconds * 1000)
            if not ex.ok:
                self.error(f"[{side.name}] {ex.describe()}")

    def error(self, text: str) -> None:
        """Each distinct error once, with how often it happened."""
        key = re.sub(r"[0-9a-f]{6,}", "#", text)  # the same error for another pod
        first, count = self.failures.get(key, (text, 0))
        self.failures[key] = (first, count + 1)

    def error_lines(self) -> list[str]:
        return [f"{text} (x{count})" for text, count in self.failures.values()] + self.errors


def rotated(sides: list[Side], i: int) -> list[Side]:
    k = i % len(sides)
    return sides[k:] + sides[:k]


def bench_version(sides: list[Side], runs: int, s: Samples) -> None:
    for i in range(runs):
        for plugin in PLUGINS:
            for side in rotated(sides, i):
                s.record(side, [run_plugin(side, plugin, "VERSION", LIBCNI_VERSION_STDIN)])


def timed(fn: Callable[[], list[Exec]]) -> tuple[float, list[Exec]]:
    start = time.perf_counter()
    execs = fn()
    return (time.perf_counter() - start) * 1000, execs


def one_pod(lab: Lab, side: Side, s: Samples | None, index: int) -> None:
    """ADD, CHECK, DEL of one pod; s=None is a warm-up."""
    pod = Pod(f"{side.name[:2]}-{secrets.token_hex(6)}", lab.pod(), index)
    try:
        for verb, fn in (("ADD", chain_add), ("CHECK", chain_check), ("DEL", chain_del)):
            ms, execs = timed(lambda fn=fn: fn(side, pod))
            if s is None:
                continue
            s.record(side, execs, failed_too=verb == "CHECK")
            if len(execs) == len(CHAIN) and (verb == "CHECK" or all(ex.ok for ex in execs)):
                s.add(f"whole chain {verb}", side.name, ms)
            if verb == "ADD" and pod.result is None:
                chain_del(side, pod)  # clean up what a failed ADD left, untimed
                return
    finally:
        lab.drop(pod.netns)


def bench_chain(lab: Lab, sides: list[Side], iterations: int, s: Samples) -> None:
    for side in sides:
        one_pod(lab, side, None, 0)
    for i in range(iterations):
        for side in rotated(sides, i):
            one_pod(lab, side, s, 0)


def ifb_name(side: Side, cid: str) -> str:
    return "bwp" + hashlib.sha512((side.network + cid).encode()).hexdigest()[:12]


def leftovers(side: Side, pods: list[Pod]) -> list[str]:
    """What a clean DEL must leave nothing of: veths, reservations, ifbs, rules naming a pod."""
    found = []
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                      text=True).stdout or "[]")
    on_bridge = [ln["ifname"] for ln in links if ln.get("master") == side.bridge]
    found += [f"veth {n}" for n in on_bridge]
    ifbs = {ifb_name(side, p.container_id) for p in pods}
    found += [f"ifb {ln['ifname']}" for ln in links if ln["ifname"] in ifbs]
    store = side.data_dir / side.network
    if store.is_dir():
        found += [f"ip {f.name}" for f in store.iterdir()
                  if f.name != "lock" and not f.name.startswith("last_reserved_ip")]
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
    found += [f"rule for {p.container_id}" for p in pods for line in ruleset.splitlines()
              if p.container_id in line]
    return found


def bench_rss(lab: Lab, sides: list[Side], s: Samples) -> None:
    """Peak RSS of each exec (VERSION, and a pod's ADD, CHECK, DEL), untimed."""
    for side in sides:
        execs = [run_plugin(side, p, "VERSION", LIBCNI_VERSION_STDIN, rss=True) for p in PLUGINS]
        pod = Pod(f"{side.name[:2]}-{secrets.token_hex(6)}", lab.pod(), 0)
        try:
            for fn in (chain_add, chain_check, chain_del):
                execs += fn(side, pod, rss=True)
        finally:
            lab.drop(pod.netns)
        s.rss[side.name] = [(ex.maxrss_kb, f"{ex.plugin} {ex.command}") for ex in execs]


def bench_concurrent(lab: Lab, side: Side, count: int, s: Samples) -> None:
    pods = [Pod(f"{side.name[:2]}-{secrets.token_hex(6)}", lab.pod(), i) for i in range(count)]
    try:
        with ThreadPoolExecutor(count) as pool:
            start = time.perf_counter()
            adds = list(pool.map(lambda p: chain_add(side, p), pods))
            add_ms = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            dels = list(pool.map(lambda p: chain_del(side, p), pods))
            del_ms = (time.perf_counter() - start) * 1000
    finally:
        for p in pods:
            lab.drop(p.netns)
    for execs in adds + dels:
        s.record(side, [ex for ex in execs if not ex.ok])
    ips = [a for p in pods for a in addresses(p.result)]
    s.add(f"{count} pods ADD, wall", side.name, add_ms)
    s.add(f"{count} pods DEL, wall", side.name, del_ms)
    s.add(f"{count} pods ADD failures", side.name, sum(p.result is None for p in pods))
    s.add(f"{count} pods DEL failures", side.name,
          sum(not all(ex.ok for ex in d) for d in dels))
    s.add(f"{count} pods duplicate IPs", side.name, len(ips) - len(set(ips)))
    left = leftovers(side, pods)
    s.add(f"{count} pods leftovers after DEL", side.name, len(left))
    s.errors += [f"[{side.name}] leftover {x}" for x in left[:10]]


# --- the trip: a near-no-op call over the same plugin's VERSION (issue 38) -------------------

# calls with (almost) nothing to do: what is left over VERSION is the hop to the daemon and back
TRIP = (("loopback", "ADD"), ("loopback", "CHECK"), ("loopback", "DEL"), ("portmap", "CHECK"),
        ("portmap", "DEL"), ("bandwidth", "CHECK"))
TRIP_SHARE = 0.15  # the goal: the trip <= 15% of the plugin's VERSION (1.0 ms where it is 6.4)


class TripSide(Side):
    """The bench chain with portmap given no mappings: its CHECK and DEL have nothing to do."""

    @classmethod
    def of(cls, side: Side) -> TripSide:
        return cls(**{f.name: getattr(side, f.name) for f in fields(side)})

    def chain(self, index: int) -> list[dict]:
        plugins = super().chain(index)
        for p in plugins:
            if p["type"] == "portmap":
                p.pop("runtimeConfig")
        return plugins


def bench_trip(lab: Lab, sides: list[Side], runs: int, t: Samples) -> None:
    """`runs` pods per side, interleaved; per pod each trip plugin's VERSION, then the chain's
    ADD, CHECK, DEL, keeping the trip calls' times (VERSION measured beside them, so the
    difference holds while the box drifts)."""
    trips = [TripSide.of(side) for side in sides]
    wanted = set(TRIP)
    for i in range(runs + 1):  # the first round warms the pool and makes the bridges: left out
        for side in rotated(trips, i):
            pod = Pod(f"{side.name[:2]}-{secrets.token_hex(6)}", lab.pod(), 0)
            try:
                execs = [run_plugin(side, plugin, "VERSION", LIBCNI_VERSION_STDIN)
                         for plugin in sorted({p for p, _ in TRIP})]
                execs += chain_add(side, pod)
                if pod.result is not None:
                    execs += chain_check(side, pod)
                execs += chain_del(side, pod)
            finally:
                lab.drop(pod.netns)
            if i:
                s_execs = [ex for ex in execs
                           if ex.command == "VERSION" or (ex.plugin, ex.command) in wanted]
                t.record(side, s_execs)


def trip_lines(t: Samples, sides: list[Side]) -> list[tuple[str, dict[str, str]]]:
    """Rows "trip: <plugin> <verb>": the verb's median minus the plugin's VERSION median (both
    from bench_trip's own runs), and the goal for pycni+daemon."""
    lines = []
    for plugin, verb in TRIP:
        row: dict[str, str] = {}
        for side in sides:
            calls = t.values.get(f"{plugin} {verb}", {}).get(side.name)
            version = t.values.get(f"{plugin} VERSION", {}).get(side.name)
            if not calls or not version:
                continue
            over, base = statistics.median(calls) - statistics.median(version), \
                statistics.median(version)
            row[side.name] = f"{over:.1f} ({statistics.median(calls):.1f} - {base:.1f})"
            if side.name == "pycni+daemon":
                bound = TRIP_SHARE * base
                row["target"] = "daemon: " + ("ok" if over <= bound else
                                              f"MISSED (<= {TRIP_SHARE:.0%} of VERSION: "
                                              f"{bound:.1f} ms)")
        lines.append((f"trip: {plugin} {verb} (ms: verb - VERSION, medians)",
                      row))
    return lines


# --- reporting --------------------------------------------------------------------------------

FWD = "pycni+forwarder"
SHORT = {"pycni+daemon": "daemon", FWD: "forwarder", "pycni (no daemon)": "no daemon"}
# issue 25: metric -> (column, bound as a ratio to Debian's v1.1.1, bound to v1.9.1)
TARGETS = {
    "whole chain ADD": ("pycni+daemon", 1.0, 0.85),
    "whole chain DEL": ("pycni+daemon", 0.5, 0.5),
    "whole chain CHECK": ("pycni+daemon", 1.5, 1.5),
}
# issue 48 item 7: the forwarder's column, metric -> (bound, against which reference: V19, or
# "reference" = Debian's v1.1.1, the only reference of containerd's CRI rows)
FORWARDER_TARGETS = {
    "whole chain ADD": (0.6, V19),
    "whole chain CHECK": (0.8, V19),
    "whole chain DEL": (0.35, V19),
    "loopback VERSION": (1.5, V19),  # its own exec within 1.5x of the reference loopback's
    "CRI-O RunPodSandbox": (0.95, V19),
    "CRI RunPodSandbox": (0.8, "reference"),
}
NO_DAEMON_PLUGIN_ADD_MS = 400  # one plugin's ADD without the daemon
LOOPBACK_OVER_VERSION_MS = 5  # loopback ADD through the daemon, over the shim's own VERSION
SHIM_RSS_MB, DAEMON_RSS_MB = 12, 80
BREAKDOWN = ROOT / "bench" / "BREAKDOWN.md"  # where one request's time goes (profiled by hand)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cell(values: list[float] | None, count_like: bool) -> str:
    if not values:
        return "skipped"
    if count_like:
        return f"{sum(values):g} (of {len(values)} runs)"
    return f"{statistics.median(values):.1f} / {pct(values, 0.9):.1f}"


def ratio(ours: list[float] | None, ref: list[float] | None, count_like: bool) -> str:
    if not ours or not ref or count_like:
        return ""
    base = statistics.median(ref)
    return f"{statistics.median(ours) / base:.2f}x" if base else ""


def target_note(metric: str, col: str, values: list[float] | None,
                ref: list[float] | None, s: Samples | None = None, v19: bool = False) -> str:
    """The metric's target for this column, against `ref` (v1.9.1's figures when `v19`)."""
    if not values:
        return ""
    med = statistics.median(values)
    if col == FWD and metric in FORWARDER_TARGETS:
        return forwarder_note(metric, med, s)
    if metric.endswith("VERSION") and col != "reference":
        return "ok" if med <= 20 else "MISSED (<= 20 ms)"
    if "failures" in metric or "duplicate" in metric or "leftovers" in metric:
        return "ok" if sum(values) == 0 else "MISSED (0)"
    if (metric.endswith(" ADD") and not metric.startswith("whole") and " " not in metric[:-4]
            and col == "pycni (no daemon)"):
        bound = NO_DAEMON_PLUGIN_ADD_MS
        return "ok" if med <= bound else f"MISSED (<= {bound} ms)"
    version = s.values.get("loopback VERSION", {}).get(col) if s is not None else None
    if metric == "loopback ADD" and col == "pycni+daemon" and version:
        bound = statistics.median(version) + LOOPBACK_OVER_VERSION_MS
        return "ok" if med <= bound else f"MISSED (<= VERSION + {LOOPBACK_OVER_VERSION_MS} ms)"
    goal = TARGETS.get(metric)
    if goal and goal[0] == col and ref:
        bound = goal[2] if v19 else goal[1]
        ok = med <= bound * statistics.median(ref)
        return "ok" if ok else f"MISSED (<= {bound}x)"
    return ""


def forwarder_note(metric: str, med: float, s: Samples | None) -> str:
    """Issue 48's goal for the forwarder's column: its median against the named reference's
    median in the same run (the forwarder's goals are all ratios; one reference each)."""
    bound, against = FORWARDER_TARGETS[metric]
    ref = s.values.get(metric, {}).get(against) if s is not None else None
    if not ref:
        return f"not judged ({against} not measured)"
    shown = "v1.9.1" if against == V19 else "Debian's v1.1.1"
    ok = med <= bound * statistics.median(ref)
    return f"vs {shown}: " + ("ok" if ok else f"MISSED (<= {bound}x)")


def ratio_target(metric: str, col: str) -> bool:
    """Whether the metric's target (for this column) is a ratio to a reference judged against
    both (the forwarder's name their one reference: forwarder_note)."""
    return metric in TARGETS and col != FWD


def table(s: Samples, sides: list[Side], extra: list[tuple[str, dict[str, str]]]) -> str:
    """Ratios are to the first column (Debian's v1.1.1) and, for ours, to v1.9.1 too when it
    runs; ratio targets are judged against both."""
    names = [side.name for side in sides]
    second = V19 if V19 in names else None
    head = ["metric (ms: median / p90)", *names[:1]]
    for n in names[1:]:
        head += [n, "ratio"] + (["vs v1.9.1"] if second and n != second else [])
    head.append("target")
    rows = [head, ["---"] * len(head)]
    for metric in s.order:
        by = s.values[metric]
        counting = any(w in metric for w in ("failures", "duplicate", "leftovers"))
        row = [metric, cell(by.get(names[0]), counting)]
        notes = []
        for n in names[1:]:
            row += [cell(by.get(n), counting), ratio(by.get(n), by.get(names[0]), counting)]
            if second and n != second:
                row.append(ratio(by.get(n), by.get(second), counting))
            if n.startswith("reference"):
                continue
            note = target_note(metric, n, by.get(n), by.get(names[0]), s)
            if second and ratio_target(metric, n):
                note19 = target_note(metric, n, by.get(n), by.get(second), s, v19=True)
                note = f"{note or '-'} / vs v1.9.1: {note19}" if note19 else note
            if note:
                notes.append(f"{SHORT.get(n, n)}: {note}")
        row.append("; ".join(notes))
        rows.append(row)
    for metric, by_side in extra:
        row = [metric, by_side.get(names[0], "")]
        for n in names[1:]:
            row += [by_side.get(n, ""), by_side.get(f"{n} ratio", "")]
            if second and n != second:
                row.append(by_side.get(f"{n} ratio v1.9.1", ""))
        row.append(by_side.get("target", ""))
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def rss_lines(s: Samples, sides: list[Side], daemon_kb: dict[str, int],
              burst_kb: dict[str, int]) -> list[tuple]:
    """The plugins' peak RSS, the daemon's; the PSS of the daemon with its children at rest
    (`daemon_kb`: after the chain one pod at a time, the spare pool at --spares) and right after
    the bursts (`burst_kb`: the pool grown for them, until --spare-linger retires it)."""
    names = [side.name for side in sides]
    worst = {n: max(s.rss[n]) for n in names if s.rss.get(n)}
    peak = {n: kb / 1024 for n, (kb, _) in worst.items()}
    ref = peak.get(names[0])
    row: dict[str, str] = {n: f"{peak[n]:.1f} MB ({what})" for n, (_, what) in worst.items()}
    for n in names[1:]:
        if ref and n in peak:
            row[f"{n} ratio"] = f"{peak[n] / ref:.2f}x"
        if peak.get(V19) and n in peak and n != V19:
            row[f"{n} ratio v1.9.1"] = f"{peak[n] / peak[V19]:.2f}x"
    shim = peak.get("pycni+daemon")
    row["target"] = "" if shim is None else (
        "shim ok" if shim <= SHIM_RSS_MB else f"shim MISSED (<= {SHIM_RSS_MB} MB)")
    lines = [("peak RSS of one plugin exec (max)", row)]
    if daemon_kb:
        hwm = (burst_kb or daemon_kb).get("VmHWM", 0) / 1024  # the latest: a high-water mark
        lines.append(("peak RSS of the daemon (VmHWM)", {
            "pycni+daemon": f"{hwm:.1f} MB",
            "target": "ok" if hwm <= DAEMON_RSS_MB else f"MISSED (<= {DAEMON_RSS_MB} MB)"}))
        pss = daemon_kb.get("Pss", 0) / 1024
        lines.append((f"PSS of the daemon and its children at rest "
                      f"({daemon_kb.get('processes')} processes, summed)", {
                          "pycni+daemon": f"{pss:.1f} MB",
                          "target": "ok" if pss <= DAEMON_RSS_MB else
                          f"MISSED (<= {DAEMON_RSS_MB} MB)"}))
    if burst_kb:
        lines.append((f"PSS of the daemon and its children after the pods at once "
                      f"({burst_kb.get('processes')} processes, summed; the extra spares "
                      "retire after --spare-linger)", {
                          "pycni+daemon": f"{burst_kb.get('Pss', 0) / 1024:.1f} MB"}))
    return lines


LOAD: list[tuple[str, float]] = []  # (phase, 1-minute load average) as the bench went


def note_load(phase: str) -> None:
    LOAD.append((phase, os.getloadavg()[0]))


def load_line() -> str:
    """How busy the box was: the ratios hold up (interleaved), the absolute ms do not."""
    if not LOAD:
        return "- load: not recorded"
    peak = max(LOAD, key=lambda x: x[1])
    steps = ", ".join(f"{phase} {value:.1f}" for phase, value in LOAD)
    return (f"- load (1-min average, {os.cpu_count()} CPUs, the bench's own work included): "
            f"peak {peak[1]:.1f} ({peak[0]}); {steps}")


def machine() -> list[str]:
    def out(*cmd: str) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            return (p.stdout or p.stderr).strip()
        except OSError:
            return "?"
    ref_about, ref19_about = (subprocess.run([str(d / "bridge")], capture_output=True, text=True,
                                             env={}).stderr.splitlines()
                              if (d / "bridge").exists() else []
                              for d in (REFERENCE, REFERENCE_V19))
    model = next((ln.split(":", 1)[1].strip() for ln in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?")
    return [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"- machine: {os.cpu_count()} CPUs ({model}), kernel {platform.release()}",
            f"- python: {platform.python_version()} ({sys.executable})",
            f"- pycni: {out('git', 'rev-parse', '--short', 'HEAD')}"
            f"{' (dirty tree)' if out('git', 'status', '--porcelain', '--', 'cni', 'bin') else ''}",
            f"- reference: {out('dpkg-query', '-W', 'containernetworking-plugins')} "
            f"({ref_about[0] if ref_about else '?'}); "
            f"{V19}: {ref19_about[0] if ref19_about else '?'}"
            ' (nftables backends: ipMasqBackend and portmap backend "nftables")',
            f"- iptables: {out('iptables', '--version')}; nft: {out('nft', '--version')}"]


def write_report(text: str) -> None:
    print(text)
    RESULTS.write_text(text + "\n")
    print(f"\nwritten to {RESULTS.relative_to(ROOT)}")


def trip_only(lab: Lab, sides: list[Side], runs: int, daemon: Daemon, tmp: Path) -> int:
    """`--trip-only`: the trip rows alone, printed (a quick look while working on the hop)."""
    trip = Samples()
    try:
        note_load("start")
        bench_trip(lab, sides, runs, trip)
        note_load("end")
    finally:
        daemon.stop()
    print("\n".join(["# The trip: near-no-op calls over their VERSION (bench/run.py --trip-only)",
                     "", *machine(), load_line(), f"- runs: {runs} pods per side, interleaved",
                     "", table(trip, sides, trip_lines(trip, sides)),
                     *[f"- {e}" for e in trip.error_lines()[:20]]]))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


# --- main -------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=15, help="pods per side, one at a time")
    parser.add_argument("--version-runs", type=int, default=40)
    parser.add_argument("--pods", type=int, default=30, help="pods ADDed at once")
    parser.add_argument("--rounds", type=int, default=3, help="concurrent rounds per side")
    parser.add_argument("--rounds-no-daemon", type=int, default=1,
                        help="concurrent rounds without the daemon (slow: every exec imports)")
    parser.add_argument("--cri-pods", type=int, default=10,
                        help="pods through containerd's CRI per side, one at a time (0: none)")
    parser.add_argument("--cri-pods-no-daemon", type=int, default=None,
                        help="CRI pods without the daemon (each takes seconds; default 3, "
                             "or none with --cri-pods 0)")
    parser.add_argument("--crio-pods", type=int, default=10,
                        help="pods through CRI-O per side (pycni+daemon, v1.9.1), one at a time "
                             "(0: none)")
    parser.add_argument("--pod-cpu", type=int, default=10,
                        help="pods per side for the CPU-per-pod rows (bench/pod_cpu.py: cnitool, "
                             "CRI-O's requests; pycni+daemon vs v1.9.1; 0: none)")
    parser.add_argument("--trip-runs", type=int, default=20,
                        help="pods per side for the trip rows (issue 38; 0: none)")
    parser.add_argument("--trip-only", action="store_true",
                        help="only the trip rows, for pycni+daemon, its forwarder and v1.9.1; "
                             "printed, RESULTS.md untouched")
    parser.add_argument("--no-full-node", action="store_true",
                        help="skip the full-node section (bench/fullnode.py; its fills: "
                             "PYCNI_BENCH_FILL, default 0,110,250)")
    args = parser.parse_args()
    if args.cri_pods_no_daemon is None:
        args.cri_pods_no_daemon = min(3, args.cri_pods)
    enter_private_mounts()
    ensure_iptables()
    subprocess.run([str(VENV_PY), "-m", "compileall", "-q", str(ROOT / "cni")], check=False)
    tmp = Path(tempfile.mkdtemp(prefix="pycni-bench-"))
    lab = Lab()
    ours, ours_how = our_bin(tmp)
    try:
        fwd_bin, fwd_how = our_bin(tmp, forwarder=True)
    except InstallError as e:  # no `make forwarder` here: the other columns still run
        fwd_bin, fwd_how = None, f"not measured ({e})"
    daemon = Daemon.start(tmp)
    sides = [
        Side("reference", REFERENCE, "bref0", "10.98.0.0/16", tmp / "ref-ipam"),
        *([Side(V19, REFERENCE_V19, "bref9", "10.96.0.0/16", tmp / "ref9-ipam",
                nftables=True)] if (REFERENCE_V19 / "bridge").exists() else []),
        Side("pycni+daemon", ours, "bpyd0", "10.99.0.0/16", tmp / "pyd-ipam",
             env={"PYCNI_SOCKET": str(daemon.socket)}),
        *([Side(FWD, fwd_bin, "bpyf0", "10.94.0.0/16", tmp / "pyf-ipam",
                env={"PYCNI_SOCKET": str(daemon.socket)})]  # one daemon, as on a node
          if fwd_bin else []),
        Side("pycni (no daemon)", ours, "bpyn0", "10.97.0.0/16", tmp / "pyn-ipam",
             env={"PYCNI_SOCKET": str(tmp / "no-daemon.sock")}),
    ]
    if args.trip_only:
        return trip_only(lab, [side for side in sides if side.name in (V19, "pycni+daemon",
                                                                        FWD)],
                         args.trip_runs, daemon, tmp)
    s = Samples()
    trip = Samples()
    daemon_kb: dict[str, int] = {}
    burst_kb: dict[str, int] = {}
    full_node: list[str] = []
    cpu_rows: list[tuple[str, dict[str, str]]] = []
    try:
        note_load("start")
        bench_version(sides, args.version_runs, s)
        note_load("after VERSION")
        bench_chain(lab, sides, args.iterations, s)
        note_load("after the chain")
        bench_trip(lab, [side for side in sides if "no daemon" not in side.name],
                   args.trip_runs, trip)
        note_load("after the trip")
        daemon_kb = daemon.memory_kb()  # at rest: the chain one pod at a time
        for r in range(max(args.rounds, args.rounds_no_daemon)):
            for side in rotated(sides, r):
                if r < (args.rounds_no_daemon if "no daemon" in side.name else args.rounds):
                    bench_concurrent(lab, side, args.pods, s)
        note_load("after 30 pods")
        burst_kb = daemon.memory_kb()  # the pool as the bursts left it
        bench_rss(lab, sides, s)
        if args.cri_pods or args.cri_pods_no_daemon:
            from cri_pods import bench_cri  # imports integration/'s helpers: only when asked

            bench_cri([side.name for side in sides if side.name != V19], args.cri_pods,
                      args.cri_pods_no_daemon,
                      s.add, s.errors.append)
            note_load("after CRI")
        if args.crio_pods and any(side.name == V19 for side in sides):
            from cri_pods import bench_crio

            bench_crio([V19, "pycni+daemon", *([FWD] if fwd_bin else [])], args.crio_pods,
                       s.add, s.errors.append)
            note_load("after CRI-O")
        if args.pod_cpu and any(side.name == V19 for side in sides):
            from pod_cpu import rows as pod_cpu_rows  # its own nodes, daemon, cgroups

            (tmp / "pod-cpu").mkdir()
            cpu_rows = pod_cpu_rows(tmp / "pod-cpu", ours, args.pod_cpu, fwd_bin)
            note_load("after CPU per pod")
        if not args.no_full_node:
            from fullnode import run_section  # its own nodes, daemon and cnitool

            (tmp / "fullnode").mkdir()
            full_node = run_section(tmp / "fullnode", ours, Daemon.start)
            note_load("after the full node")
    finally:
        daemon.stop()
    lines = ["# pycni vs the reference CNI plugins", "",
             "Generated by `make bench` (bench/run.py); ratios are ours / reference, medians.",
             "", *machine(), load_line(), f"- pycni executables: {ours_how}; {FWD}: {fwd_how}",
             f"- runs: {args.iterations} pods one at a time per side, {args.version_runs} "
             f"VERSION per plugin, {args.pods} concurrent pods x {args.rounds} rounds "
             f"({args.rounds_no_daemon} without the daemon), interleaved; "
             f"{args.cri_pods} pods through containerd's CRI per side "
             f"({args.cri_pods_no_daemon} without the daemon), one at a time, interleaved; "
             f"{args.crio_pods} pods through CRI-O 1.33 per side (pycni+daemon, {FWD}, {V19}), one "
             f"at a time, interleaved; trip rows: {args.trip_runs} pods per side; CPU per pod: "
             f"{args.pod_cpu} pods per side", ""]
    lines.append(table(s, sides, rss_lines(s, sides, daemon_kb, burst_kb)
                       + trip_lines(trip, sides) + cpu_rows))
    if full_node:
        lines += ["", *full_node]
    if s.error_lines() or trip.error_lines():
        lines += ["", "## Errors and leftovers", "",
                  *[f"- {e}" for e in (s.error_lines() + trip.error_lines())[:40]]]
    if BREAKDOWN.exists():
        lines += ["", BREAKDOWN.read_text().rstrip()]
    write_report("\n".join(lines))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
