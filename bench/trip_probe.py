"""Where one daemon call's trip goes (issue 38): loopback CHECK through the daemon, step by step.

Read-only and outside the product: the kernel's own tracepoints, recorded system-wide by `perf
record` (Debian's linux-perf) while this script runs loopback CHECKs through a daemon started for
it, in bench/run.py's throwaway host netns. Nothing is added to cni/.

- scheduling: sched_waking / sched_wakeup / sched_switch (who woke whom, when it got a CPU),
  exec and exit;
- the shim: its connect and sendmsg (syscalls:*, system-wide, picked by pid afterwards);
- the daemon's parent and its children (spares, zygote): every syscall (raw_syscalls, filtered
  to their pids): the spare's ACK (a one-byte sendto), its reply (a sendto on the ACK's fd),
  its READY home (its next send on another fd) and the syscalls between.

Each round: `python -IS -c pass` (the floor), loopback VERSION (the shim alone), loopback CHECK
(the spare home and waiting: 100 ms since the last call), and a second CHECK 1 ms after the
first returned (as CRI-O's next exec: the spare may still be going home). Per step, medians over
the rounds; one CHECK's spare and parent syscalls listed as they came. perf costs each event
~1-2 us (the steps are longer than that, but the sum runs a little slow). Root:

    .venv/bin/python bench/trip_probe.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from driver import LIBCNI_VERSION_STDIN, Side, plugin_config, run_plugin  # noqa: E402
from world import VENV_PY, Daemon, Lab, enter_private_mounts, our_bin  # noqa: E402

# x86_64 syscall numbers seen on the path (raw_syscalls gives numbers)
SYSCALLS = {0: "read", 1: "write", 3: "close", 5: "fstat", 7: "poll", 8: "lseek", 9: "mmap",
            10: "mprotect", 11: "munmap", 12: "brk", 13: "rt_sigaction", 14: "rt_sigprocmask",
            16: "ioctl", 20: "writev", 28: "madvise", 37: "alarm", 39: "getpid", 41: "socket",
            42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg",
            47: "recvmsg", 49: "bind", 51: "getsockname", 52: "getpeername", 53: "socketpair",
            54: "setsockopt", 55: "getsockopt", 107: "geteuid", 247: "waitid",
            291: "epoll_create1",
            56: "clone", 61: "wait4", 62: "kill", 72: "fcntl", 80: "chdir", 81: "fchdir",
            89: "readlink", 95: "umask", 109: "setpgid", 144: "sched_setscheduler",
            145: "sched_getscheduler", 157: "prctl", 202: "futex", 217: "getdents64",
            228: "clock_gettime", 232: "epoll_wait", 233: "epoll_ctl", 257: "openat",
            262: "newfstatat", 267: "readlinkat", 281: "epoll_pwait", 288: "accept4",
            308: "setns", 318: "getrandom", 332: "statx", 435: "clone3", 441: "epoll_pwait2"}
NR_SENDTO, NR_SENDMSG, NR_RECVMSG, NR_SETNS, NR_UMASK, NR_PRCTL = 44, 46, 47, 308, 95, 157
LINE = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


@dataclass
class Ev:
    t: float  # seconds (perf's clock)
    tid: int
    name: str
    trace: str

    def field(self, key: str) -> str:
        m = re.search(rf"\b{key}=(\S+)", self.trace)
        return m.group(1) if m else ""


@dataclass
class Trace:
    events: list[Ev]
    by_tid: dict[int, list[Ev]] = field(default_factory=lambda: defaultdict(list))
    runs: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        on: dict[int, float] = {}  # cpu-less: a tid runs on one CPU at a time
        for e in self.events:
            self.by_tid[e.tid].append(e)
            if e.name == "sched:sched_switch":
                prev, nxt = int(e.field("prev_pid")), int(e.field("next_pid"))
                if prev in on:
                    self.runs[prev].append((on.pop(prev), e.t))
                on[nxt] = e.t

    def last_enter(self, tid: int, before: float) -> Ev | None:
        """The syscall `tid` was in at `before` (its last raw sys_enter up to then)."""
        return next((e for e in reversed(self.by_tid[tid]) if e.t <= before
                     and e.name == "raw_syscalls:sys_enter"), None)

    def first(self, pred, after: float, tid: int | None = None) -> Ev | None:
        pool = self.by_tid[tid] if tid is not None else self.events
        i = bisect.bisect_left([e.t for e in pool], after) if tid is not None else \
            bisect.bisect_left(self.times, after)
        return next((e for e in pool[i:] if pred(e)), None)

    @property
    def times(self) -> list[float]:
        if not hasattr(self, "_times"):
            self._times = [e.t for e in self.events]
        return self._times

    def cpu(self, tid: int, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.runs.get(tid, []))

    def switched_in(self, tid: int, after: float) -> float | None:
        e = self.first(lambda e: e.name == "sched:sched_switch"
                       and e.field("next_pid") == str(tid), after)
        return e.t if e else None

    def woken(self, target: int, after: float, by: int | None = None) -> Ev | None:
        return self.first(lambda e: e.name == "sched:sched_wakeup" and e.field("pid") == str(target)
                          and (by is None or e.tid == by), after)


def nr_args(e: Ev) -> tuple[int, list[int]]:
    m = re.match(r"NR (\d+) \(([^)]*)\)", e.trace)
    if not m:
        return -1, []
    return int(m.group(1)), [int(a, 16) for a in m.group(2).split(",") if a.strip()]


def syscall(e: Ev, enter: bool = True) -> tuple[int, list[int]] | None:
    want = "raw_syscalls:sys_enter" if enter else "raw_syscalls:sys_exit"
    return nr_args(e) if e.name == want else None


def check_steps(tr: Trace, shim: int, t0: float, daemon: int,
                children: list[int]) -> dict[str, float] | None:
    """One CHECK's step times (ms) and CPU, from its shim's exec at t0; None if unreadable
    (e.g. a spare forked for it: no raw syscalls of it were recorded). The spare is the one
    the parent's sendmsg woke after the shim's request; its ACK, its first sendto then."""
    def nr(e: Ev) -> int:
        return (syscall(e) or (-1,))[0]

    def is_ack(e: Ev) -> bool:  # protocol.ACK: a sendto of one byte (READY is longer)
        return nr(e) == NR_SENDTO and nr_args(e)[1][2:3] == [1]

    exit_ev = tr.first(lambda e: e.name == "sched:sched_process_exit", t0, shim)
    connect = tr.first(lambda e: e.name == "syscalls:sys_enter_connect", t0, shim)
    if not exit_ev or not connect:
        return None
    sent = tr.first(lambda e: e.name == "syscalls:sys_exit_sendmsg", connect.t, shim)
    d_in = tr.first(lambda e: e.name.startswith("raw_syscalls"), connect.t, daemon)
    if not sent or not d_in:
        return None
    # the handover: the parent's sendmsg of the request to a spare, waking it
    # (sched_waking: in the waker's context; sched_wakeup may be on the target's CPU.) The
    # woken one must answer the shim before it exits: not the zygote asked for a spare.
    wake_s = next((e for e in tr.by_tid[daemon] if sent.t <= e.t <= exit_ev.t
                   and e.name == "sched:sched_waking"
                   and nr(tr.last_enter(daemon, e.t) or e) == NR_SENDMSG
                   and (a := tr.first(is_ack, e.t, int(e.field("pid"))))
                   and a.t <= exit_ev.t), None)
    awake = wake_s is None
    if awake:  # the spare was not asleep in take_job (still on its way): no wake-up to see
        wake_s = tr.first(lambda e: nr(e) == NR_SENDMSG, sent.t, daemon)
        acks = [a for tid in children if (a := tr.first(is_ack, wake_s.t, tid)) is not None] \
            if wake_s else []
        if not acks or min(a.t for a in acks) > exit_ev.t:
            return None
        spare = min(acks, key=lambda a: a.t).tid
        s_in = wake_s.t
    else:
        spare = int(wake_s.field("pid"))
        s_in = tr.switched_in(spare, wake_s.t)
        first_ack = tr.first(is_ack, wake_s.t, spare)
        if s_in is None or (first_ack and s_in > first_ack.t):
            s_in = wake_s.t  # it was on a CPU already (on its way to take_job)
    ack = tr.first(is_ack, s_in or 0, spare)
    if not (ack and s_in):
        return None
    conn_fd = nr_args(ack)[1][0]
    reply = tr.first(lambda e: nr(e) == NR_SENDTO and nr_args(e)[1][0] == conn_fd,
                     ack.t + 1e-6, spare)
    if not reply:
        return None
    # READY: its first send after the reply on another fd (the control socket); the one
    # before, for the request before (did this one wait for it?)
    ready = tr.first(lambda e: nr(e) in (NR_SENDTO, NR_SENDMSG) and nr_args(e)[1][0] != conn_fd,
                     reply.t, spare)
    ctl_fd = nr_args(ready)[1][0] if ready else -2
    back_before = next((e for e in reversed(tr.by_tid[spare]) if e.t < s_in
                        and nr(e) in (NR_SENDTO, NR_SENDMSG) and nr_args(e)[1][0] == ctl_fd),
                       None)
    shim_in = tr.switched_in(shim, reply.t)
    end = ready.t if ready else reply.t
    entered = tr.first(lambda e: nr(e) == NR_UMASK, ack.t, spare)  # enter_caller's last call
    done = next((e for e in reversed(tr.by_tid[spare]) if e.t < reply.t and nr(e) == NR_PRCTL),
                None)  # set_name(DONE), right before the reply
    if not (entered and done and entered.t < done.t):
        entered = done = None
    count = lambda a, b: sum(1 for e in tr.by_tid[spare]  # noqa: E731
                             if a <= e.t <= b and nr(e) == NR_SETNS)
    ms = lambda a, b: (b - a) * 1000 if a is not None and b is not None else float("nan")  # noqa: E731
    return {
        "shim: exec -> connect (interpreter, shim imports, fds, request)": ms(t0, connect.t),
        "shim: connect -> sendmsg returned": ms(connect.t, sent.t),
        "parent: connect -> its first syscall (woken, on a CPU)": ms(connect.t, d_in.t),
        "parent ran before the request was sent (1 yes)": float(d_in.t < sent.t),
        "spare came home after this connect (waited for it: 1 yes)": float(
            back_before is not None and back_before.t > connect.t),
        "parent: request sent -> spare woken (read, queue, wait for a spare, hand over)": ms(
            sent.t, wake_s.t),
        "spare was not asleep at the handover (1 yes)": float(awake),
        "spare: woken -> on a CPU": ms(wake_s.t, s_in),
        "spare: on a CPU -> ACK sent (take_job)": ms(s_in, ack.t),
        "spare: ACK -> reply sent (enter the caller, skel.run, encode)": ms(ack.t, reply.t),
        "  of which: ACK -> the caller entered (same_ns x2, fchdir, environ, umask)": ms(
            ack.t, entered.t if entered else None),
        "  of which: skel.run (umask -> set_name DONE)": ms(entered.t if entered else None,
                                                           done.t if done else None),
        "  of which: DONE -> reply sent (encode)": ms(done.t if done else None, reply.t),
        "shim: reply sent -> shim on a CPU": ms(reply.t, shim_in),
        "shim: on a CPU -> exit (relay, _exit)": ms(shim_in, exit_ev.t),
        "exec -> exit (whole exec)": ms(t0, exit_ev.t),
        "hop: connect -> reply on a CPU (the daemon's part)": ms(connect.t, shim_in),
        "off the path: spare reply -> READY to the parent (home)": ms(reply.t, end),
        "setns calls in ACK -> reply (count)": count(ack.t, reply.t),
        "setns calls going home (count)": count(reply.t, end),
        "CPU: shim": tr.cpu(shim, t0, exit_ev.t) * 1000,
        "CPU: parent (connect -> READY)": tr.cpu(daemon, connect.t, end) * 1000,
        "CPU: spare (woken -> READY)": tr.cpu(spare, wake_s.t, end) * 1000,
        "CPU: spare (ACK -> reply)": tr.cpu(spare, ack.t, reply.t) * 1000,
        "_spare": spare, "_t_in": s_in, "_t_end": end, "_t_connect": connect.t,
    }


def exec_span(tr: Trace, pid: int, t0: float) -> tuple[float, float] | None:
    exit_ev = tr.first(lambda e: e.name == "sched:sched_process_exit", t0, pid)
    return ((exit_ev.t - t0) * 1000, tr.cpu(pid, t0, exit_ev.t) * 1000) if exit_ev else None


def timeline(tr: Trace, tid: int, start: float, end: float,
             label: str) -> list[tuple[float, str]]:
    """The syscalls of `tid` in [start, end]: offset (us from start), name, first arg, time in."""
    out: list[tuple[float, str]] = []
    entered = {}
    for e in tr.by_tid[tid]:
        if not start <= e.t <= end:
            continue
        if e.name == "raw_syscalls:sys_enter":
            entered[tid] = (e.t, nr_args(e))
        elif e.name == "raw_syscalls:sys_exit" and tid in entered:
            t, (nr, args) = entered.pop(tid)
            out.append((t, f"| {label} | {(t - start) * 1e6:.0f} | {SYSCALLS.get(nr, nr)}"
                           f"({args[0] if args else ''}) | {(e.t - t) * 1e6:.0f} |"))
        elif e.name == "sched:sched_switch" and e.field("prev_pid") == str(tid):
            out.append((e.t, f"| {label} | {(e.t - start) * 1e6:.0f} | (off CPU: "
                             f"{e.field('prev_state')}) | |"))
    for e in tr.events[bisect.bisect_left(tr.times, start):bisect.bisect_right(tr.times, end)]:
        if e.name == "sched:sched_switch" and e.field("next_pid") == str(tid):
            out.append((e.t, f"| {label} | {(e.t - start) * 1e6:.0f} | (on CPU) | |"))
    return out


def skel_in_process(side: Side, cid: str, netns: str, stdin: bytes, runs: int = 50) -> str:
    """loopback CHECK through skel.run in this (warm) process, as a spare runs it after entering
    the caller: what the request itself costs, without any hop (wall and CPU ms, medians)."""
    import gc

    from cni import skel

    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid,
           "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": str(side.bin_dir)}
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    walls, cpus = [], []
    gc.disable()  # as in a spare
    try:
        for i in range(runs + 5):
            w, c = time.perf_counter(), time.process_time()
            reply = skel.run("loopback", env, stdin, fd)
            if reply.code:
                return f"skel.run failed: {reply.stdout!r} {reply.stderr!r}"
            if i >= 5:
                walls.append((time.perf_counter() - w) * 1000)
                cpus.append((time.process_time() - c) * 1000)
    finally:
        gc.enable()
        os.close(fd)
    return (f"skel.run('loopback', CHECK) in a warm process ({runs} runs): wall "
            f"{statistics.median(walls):.2f} ms, CPU {statistics.median(cpus):.2f} ms (medians)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    enter_private_mounts()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-trip-probe-"))
    lab = Lab()
    ours, _ = our_bin(tmp)
    daemon = Daemon.start(tmp)
    side = Side("pycni+daemon", ours, "bprobe0", "10.95.0.0/16", tmp / "ipam",
                env={"PYCNI_SOCKET": str(daemon.socket), "PYCNI_SHIM_FALLBACK": "0"})
    cid, netns = secrets.token_hex(32), lab.pod()
    conf = {"type": "loopback"}
    add = run_plugin(side, "loopback", "ADD", plugin_config(side, conf, None),
                     container_id=cid, netns=netns)
    check_in = plugin_config(side, conf, add.result())

    def check() -> None:
        ex = run_plugin(side, "loopback", "CHECK", check_in, container_id=cid, netns=netns)
        if not ex.ok:
            raise SystemExit(ex.describe())

    for _ in range(5):
        check()
        time.sleep(0.1)
    d = daemon.proc.pid
    kids = [int(p) for p in Path(f"/proc/{d}/task/{d}/children").read_text().split()]
    policies = {p: os.sched_getscheduler(p) for p in kids}
    pids = " || ".join(f"common_pid == {p}" for p in [d, *kids])
    data = tmp / "perf.data"
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-o", str(data),
         "-e", "raw_syscalls:sys_enter", "--filter", pids,
         "-e", "raw_syscalls:sys_exit", "--filter", pids,
         "-e", "sched:sched_switch", "-e", "sched:sched_wakeup", "-e", "sched:sched_waking",
         "-e", "sched:sched_wakeup_new",
         "-e", "sched:sched_process_exec", "-e", "sched:sched_process_exit",
         "-e", "syscalls:sys_enter_connect", "-e", "syscalls:sys_exit_sendmsg"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    order = []
    load = os.getloadavg()[0]
    try:
        for _ in range(args.rounds):
            subprocess.run([str(VENV_PY), "-IS", "-c", "pass"], check=True)
            order.append("floor")
            time.sleep(0.05)
            run_plugin(side, "loopback", "VERSION", LIBCNI_VERSION_STDIN)
            order.append("VERSION")
            time.sleep(0.1)
            check()
            order.append("CHECK")
            time.sleep(0.001)
            check()
            order.append("CHECK 1 ms after")
            time.sleep(0.1)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait()
        daemon.stop()
    in_process = skel_in_process(side, cid, netns, check_in)
    lab.drop(netns)
    text = subprocess.run(["perf", "script", "-i", str(data), "-F",
                           "comm,pid,tid,cpu,time,event,trace"],
                          capture_output=True, text=True).stdout
    events = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            events.append(Ev(float(m.group(5)), int(m.group(3)), m.group(6).rstrip(":"),
                             m.group(7)))
    tr = Trace(events)
    execs = [e for e in events if e.name == "sched:sched_process_exec"
             and e.field("filename") in (str(ours / "loopback"), str(VENV_PY))]  # not others'
    if len(execs) != len(order):
        print(f"warning: {len(execs)} execs traced for {len(order)} run")
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    sample = None
    for what, e in zip(order, execs, strict=False):
        pid = int(e.field("pid"))
        if what in ("floor", "VERSION"):
            span = exec_span(tr, pid, e.t)
            if span:
                rows[what]["exec -> exit (whole exec)"].append(span[0])
                rows[what]["CPU: the process"].append(span[1])
            continue
        steps = check_steps(tr, pid, e.t, d, kids)
        if steps is None:
            rows[what]["unreadable"].append(1)
            continue
        if sample is None and what == "CHECK":
            sample = (steps, e.t)
        for k, v in steps.items():
            if not k.startswith("_"):
                rows[what][k].append(v)
    print(f"load (1-min) {load:.1f} on {os.cpu_count()} CPUs; {args.rounds} rounds; spares' "
          f"policy at rest: {sorted(set(policies.values()))} (0 OTHER, 5 IDLE)\n{in_process}\n")
    cols = ["floor", "VERSION", "CHECK", "CHECK 1 ms after"]
    print("| step (ms or count: median / mean / max) | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    keys = list(dict.fromkeys(k for c in cols for k in rows[c]))
    for k in keys:
        cells = [f"{statistics.median(v):.2f} / {statistics.fmean(v):.2f} / {max(v):.1f}"
                 if (v := [x for x in rows[c].get(k, []) if x == x]) else "" for c in cols]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if sample:
        steps, _ = sample
        print("\nOne CHECK's parent and spare syscalls (us from the shim's connect; duration):\n")
        print("| who | at us | syscall(first arg) | us |\n| --- | --- | --- | --- |")
        start = steps["_t_connect"]
        for _, line in sorted(timeline(tr, d, start, steps["_t_end"], "parent")
                              + timeline(tr, steps["_spare"], start, steps["_t_end"], "spare")):
            print(line)
    if os.environ.get("PYCNI_PROBE_KEEP"):
        print(f"perf data kept: {data}")
    else:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
