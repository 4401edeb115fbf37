"""A spare's own CPU per request, two trees side by side (issue 38): finer than hop_cpu.py.

No daemon and no shim: for each tree a server process (that tree's .venv and cni/, in a
throwaway network namespace of its own, lo up) imports and warms what the daemon does, forks a
spare (child.spare_main, as the zygote's) and plays the parent's part itself: each request is a
fresh connection handed over with the four fds a shim sends (CNI_NETNS, the caller's network and
mount namespaces, its cwd), then the ACK and reply are read, then the spare's READY. Per request
the spare's CPU (/proc/PID/schedstat, kernel time included) from the handover to a moment after
its READY. The trees alternate request by request (the order swapped each round). The spare
serves every request of the run (child.MAX_SERVED raised for it), so its fixed part, not the
warm-up of the next, is measured. Cases: loopback STATUS, loopback CHECK, and "none" (a runner
that does nothing: the spare's path alone). Medians (p25-p75) after the first 10. Root:

    .venv/bin/python bench/spare_cpu.py OTHER_TREE [--requests 1000] [--cases status,none]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = b'{"cniVersion":"1.1.0","name":"n","type":"loopback"}'
CRIO_ARGS = ("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-1;"
             f"K8S_POD_INFRA_CONTAINER_ID={'0' * 64};K8S_POD_UID=bench")
DAEMON_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "LANG": "C.UTF-8", "INVOCATION_ID": "0" * 32, "JOURNAL_STREAM": "8:12345"}
GAP = 0.003  # s after a READY before the spare's CPU is read (it renames itself, then waits)


def nothing(plugin: str, env: dict, stdin: bytes, netns: int | None) -> object:
    """A runner that does nothing: the spare's own path alone."""
    from cni import skel

    return skel.Reply(b"{}", b"", 0)


def serve(tree: str, case: str, requests: int) -> None:
    """The server of one tree: its lines on stdout ("ready", then one CPU ms per request), one
    request per line read on stdin."""
    sys.path.insert(0, tree)
    import gc

    from cni.fast import child, preload
    from cni.fast import protocol as proto
    from cni.host import nsfd

    if nsfd.libc().unshare(nsfd.CLONE_NEWNET) != 0:
        raise SystemExit("unshare(CLONE_NEWNET) failed: run as root")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.chdir("/")
    preload.preimport()  # as the daemon before it forks (daemon.py)
    preload.warm_up()
    gc.collect()
    gc.freeze()
    warm = preload.private_netns()
    runner = nothing if case == "none" else None
    child.MAX_SERVED = requests + 1
    ctl, end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ctl.close()
        child.spare_main(end, 30.0, runner, warm)  # never returns
    end.close()
    env = {"PATH": DAEMON_ENV["PATH"], "CNI_COMMAND": "CHECK" if case == "check" else "STATUS",
           "CNI_CONTAINERID": f"spare-cpu-{os.getpid()}", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "lo", "CNI_PATH": f"{tree}/bin", "PYCNI_SOCKET": "/nonexistent",
           "PYCNI_SHIM_FALLBACK": "0", "CNI_ARGS": CRIO_ARGS}
    block = proto.encode_env({k.encode(): v.encode() for k, v in env.items()})
    roles = proto.ROLE_NETNS | proto.ROLE_CALLER_NET | proto.ROLE_CALLER_MNT | proto.ROLE_CWD
    request = proto.encode_request("loopback", block, CONFIG, roles, 0o022)
    flags = os.O_RDONLY | os.O_CLOEXEC

    def spare_ms() -> float:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6

    def ready() -> None:
        if child.ready_pid(ctl.recv(64)) != pid:
            raise SystemExit(f"{tree}: the spare did not say READY")

    ready()
    print("ready", flush=True)
    for _ in range(requests):
        sys.stdin.readline()
        fds = [os.open("/proc/self/ns/net", flags), os.open("/proc/thread-self/ns/net", flags),
               os.open("/proc/thread-self/ns/mnt", flags),
               os.open(".", flags | os.O_PATH | os.O_DIRECTORY)]
        shim, conn = socket.socketpair()
        conn.setblocking(False)  # as the parent's accepted connection
        before = spare_ms()
        if not child.hand_over(ctl, conn, request, fds):
            raise SystemExit(f"{tree}: the spare is gone")
        conn.close()
        for fd in fds:
            os.close(fd)
        got = b""
        while chunk := shim.recv(1 << 16):
            got += chunk
        shim.close()
        if got[:1] != proto.ACK or proto.reply_sizes(got[1:1 + proto.REPLY_PREFIX])[0] != 0:
            raise SystemExit(f"{tree}: {got!r}")
        ready()
        time.sleep(GAP)
        print(spare_ms() - before, flush=True)
    ctl.close()
    os.waitpid(pid, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the tree to compare with (B)")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--cases", default="status,none")
    parser.add_argument("--serve", nargs=2, metavar=("TREE", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], args.requests)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from world import enter_private_mounts

    enter_private_mounts(also=(("/run/pycni", "0755"),))  # CHECK's attachment locks
    trees = {"A": ROOT, "B": args.other.resolve()}
    print(f"A={trees['A']} B={trees['B']} requests={args.requests} per case and tree")
    print("| spare CPU ms per request, median (p25-p75) | A | B | A - B |")
    print("| --- | --- | --- | --- |")
    for case in args.cases.split(","):
        servers = {name: subprocess.Popen(
            [str(tree / ".venv/bin/python"), __file__, str(tree), "--serve", str(tree), case,
             "--requests", str(args.requests)], env=DAEMON_ENV, cwd="/", text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE) for name, tree in trees.items()}
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        try:
            for proc in servers.values():
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit(f"{case}: a server did not start")
            for i in range(args.requests):
                for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
                    servers[name].stdin.write("\n")
                    servers[name].stdin.flush()
                    cpu[name].append(float(servers[name].stdout.readline()))
        finally:
            for proc in servers.values():
                proc.stdin.close()
                proc.wait(60)
        cells = []
        for name in ("A", "B"):
            got = cpu[name][10:]
            q = statistics.quantiles(got, n=4)
            cells.append(f"{statistics.median(got):.3f} ({q[0]:.3f}-{q[2]:.3f})")
        delta = statistics.median(cpu["A"][10:]) - statistics.median(cpu["B"][10:])
        print(f"| {case} | {cells[0]} | {cells[1]} | {delta:+.3f} |", flush=True)
    print(f"load (1-min) at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
