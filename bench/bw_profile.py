"""bandwidth ADD, CHECK, DEL in-process, as a daemon's spare runs them: CPU per verb.

Runs skel.run("bandwidth", env, stdin, netns_fd) in a warm process (preimport, warm_up, gc
frozen, the spare's kept home sockets) whose "host" is a throwaway netns (unshare), on a veth
pair to a pod netns (ip netns add, in a private /run/netns) with prevResult as a main plugin
would return it. Config: CRI-O's (bench/crio_requests.py: runtimeConfig bandwidth 100M, its
"no burst" sentinel), or --explicit (top-level rates and bursts, as the docs' configs).

    .venv/bin/python bench/bw_profile.py [--rounds N] [--bridge] [--explicit] [--steps]
        [--profile VERB] [--toggle MODULE:ATTR:VALUE] [--mark]

PYCNI_BWPROF_ROOT: another checkout's code (a before/after: run both, alternately).
Prints per verb the median CPU ms (time.process_time) of skel.run, and of skel.run plus the
wait for linkgone's helper thread (DEL's ifb delete finishes there).
--bridge: the host veth on a bridge listed first in prevResult, as bridge's result lists it.
--steps: CPU per step (functions of the host modules and the kept socket's requests, patched).
--profile VERB: cProfile of that verb (SORT, TOP: pstats order and length).
--toggle: an in-process A/B, a module attribute set on odd rounds only.
--mark writes "MARK <verb>" to fd 2 before each verb, for `strace -f` counts.
POOL=1: the kept socket's pyroute2 sequence number allocation cost at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(os.environ.get("PYCNI_BWPROF_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from world import become_spare_like, install_steps  # noqa: E402

CRIO_RUNTIME = {
    "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 34359738359,
                  "egressRate": 100_000_000, "egressBurst": 34359738359},
    "io.kubernetes.cri.pod-annotations": {"kubernetes.io/ingress-bandwidth": "100M",
                                          "kubernetes.io/egress-bandwidth": "100M"}}


def main() -> None:
    from world import enter_private_mounts

    enter_private_mounts(also=(("/run/pycni", "0700"), ("/var/lib/cni", "0755")))
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--profile", default="")
    parser.add_argument("--explicit", action="store_true")
    parser.add_argument("--mark", action="store_true")
    parser.add_argument("--bridge", action="store_true",
                        help="the host veth on a bridge cni0, listed first in prevResult (as "
                        "bridge's result is)")
    parser.add_argument("--toggle", default="",
                        help="MODULE:ATTR:PYTHON-VALUE set on odd rounds (B), restored on even "
                        "ones (A): an in-process A/B, medians per side")
    parser.add_argument("--steps", action="store_true",
                        help="CPU per step (patched functions), medians per verb")
    opts = parser.parse_args()

    become_spare_like()
    from cni.fast import preload

    preload.keep_home_sockets()
    from cni import skel

    steps = install_steps(STEPS, kept_socket=True) if opts.steps else None

    pod = f"pycni-bwprof-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", pod], check=True)
    subprocess.run(["ip", "link", "add", "vbwprof", "type", "veth", "peer", "name", "eth0",
                    "netns", pod], check=True)
    subprocess.run(["ip", "link", "set", "vbwprof", "up"], check=True)
    if opts.bridge:
        subprocess.run(["ip", "link", "add", "cni0", "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", "vbwprof", "master", "cni0"], check=True)
        subprocess.run(["ip", "link", "set", "cni0", "up"], check=True)
    fd = os.open(f"/run/netns/{pod}", os.O_RDONLY)
    prev = {"cniVersion": "1.0.0",
            "interfaces": [{"name": "vbwprof"}, {"name": "eth0", "sandbox": f"/run/netns/{pod}"}],
            "ips": [{"interface": 1, "address": "10.77.0.2/24"}]}
    if opts.bridge:
        prev["interfaces"].insert(0, {"name": "cni0", "mac": "00:00:00:00:00:01"})
        prev["ips"][0]["interface"] = 2
    conf = {"cniVersion": "1.0.0", "name": "pycni", "type": "bandwidth",
            "capabilities": {"bandwidth": True, "io.kubernetes.cri.pod-annotations": True}}
    if opts.explicit:
        conf |= {"ingressRate": 8_000_000, "ingressBurst": 80_000,
                 "egressRate": 8_000_000, "egressBurst": 80_000}
    else:
        conf["runtimeConfig"] = CRIO_RUNTIME
    cpu: dict[str, list[float]] = {v: [] for v in ("ADD", "CHECK", "DEL")}
    cpu_all: dict[str, list[float]] = {v: [] for v in ("ADD", "CHECK", "DEL")}
    sys_ms: dict[str, list[float]] = {v: [] for v in ("ADD", "CHECK", "DEL")}
    per_step: dict[str, dict[str, list[float]]] = {}
    sides: dict[tuple[str, str], list[float]] = {}
    prof = None
    if opts.profile:
        import cProfile

        prof = cProfile.Profile()
    try:
        toggle = None
        if opts.toggle:
            import ast
            import importlib

            mod, attr, value = opts.toggle.split(":", 2)
            toggle = (importlib.import_module(mod), attr, ast.literal_eval(value))
            original = getattr(toggle[0], attr)
        for i in range(opts.rounds + 2):
            side = "B" if i % 2 else "A"
            if toggle is not None:
                setattr(toggle[0], toggle[1], toggle[2] if side == "B" else original)
            env = {"CNI_CONTAINERID": f"{i:064x}", "CNI_NETNS": f"/run/netns/{pod}",
                   "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent",
                   "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            result = None
            for verb in ("ADD", "CHECK", "DEL"):
                stdin = dict(conf)
                if verb != "ADD":
                    stdin["prevResult"] = result
                else:
                    stdin["prevResult"] = prev
                data = json.dumps(stdin).encode()
                if opts.mark:
                    os.write(2, f"MARK {verb}\n".encode())
                if steps is not None:
                    steps.clear()
                on = prof is not None and verb == opts.profile and i >= 2
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                start = time.process_time()
                if on:
                    prof.enable()
                reply = skel.run("bandwidth", env | {"CNI_COMMAND": verb}, data, fd)
                if on:
                    prof.disable()
                mid = time.process_time()
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                for t in threading.enumerate():
                    if t is not threading.current_thread():
                        t.join()
                end = time.process_time()
                if reply.code != 0:
                    raise SystemExit(f"{verb}: {reply.stdout!r} {reply.stderr!r}")
                if verb == "ADD":
                    result = json.loads(reply.stdout)
                if i >= 2 and toggle is not None:
                    sides.setdefault((side, verb), []).append((mid - start) * 1e3)
                if i >= 2:
                    cpu[verb].append((mid - start) * 1e3)
                    cpu_all[verb].append((end - start) * 1e3)
                    sys_ms[verb].append((ru1.ru_stime - ru0.ru_stime) * 1e3)
                    if steps is not None:
                        for k, v in steps.items():
                            per_step.setdefault(verb, {}).setdefault(k, []).append(v)
                time.sleep(0.002)
    finally:
        subprocess.run(["ip", "netns", "del", pod], check=False)
    if os.environ.get("POOL"):
        from cni.host import netns as _ns

        pool = _ns._kept[1].asyncore.addr_pool
        xs = []
        for _ in range(50):
            t = time.perf_counter()
            seq = pool.alloc()
            xs.append(time.perf_counter() - t)
            pool.free(seq)
        print(f"kept socket: addr_pool.alloc {statistics.median(xs) * 1e6:.1f} us, "
              f"ban list {len(pool.ban)}, map cells {len(pool.addr_map)}")
    for verb in cpu:
        print(f"{verb}: {statistics.median(cpu[verb]):.3f} ms "
              f"(+helper {statistics.median(cpu_all[verb]):.3f}; "
              f"sys {statistics.mean(sys_ms[verb]):.3f} mean)")
    for (side, verb), values in sorted(sides.items()):
        print(f"side {side} {verb}: {statistics.median(values):.3f} ms")
    for verb, table in per_step.items():
        print(f"-- {verb} steps (median CPU us, count per call)")
        for k, v in table.items():
            n = statistics.median(x[1] for x in v)
            user = statistics.mean(x[2] for x in v) * 1e3
            print(f"   {k:40s} {statistics.median(x[0] for x in v) * 1e3:8.0f}  x{n:.0f}"
                  f"  (user mean {user:.0f})")
    if prof is not None:
        import pstats

        stats = pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative"))
        stats.print_stats(int(os.environ.get("TOP", "45")))


STEPS = {
    "cni.plugins.bandwidth": ("limits", "_tbf", "_host_veth", "_host_veth_reading",
                              "_peer_reading", "_host_veth_if_any", "_apply", "_container_veth"),
    "cni.plugins.shaped": ("remember", "recall", "forget"),
    "cni.host.peer": ("container_veth", "host_end"),
    "cni.host.netns": ("new_socket", "ns_key", "open_ns", "entered", "_new_iproute"),
    "cni.host.links": ("get", "by_index", "_one", "from_message", "get_request"),
    "cni.host.nsfd": ("setns", "is_netns"),
    "cni.host.tc": ("tbf_add_message", "read_tbf", "root_kind", "delete_qdiscs",
                    "redirect_targets", "ingress_is_for", "delete_root", "delete_ingress",
                    "tick_in_usec", "root_request", "filters_request"),
    "cni.host.ifb": ("add_message", "made", "lookup", "delete"),
    "cni.host.linkgone": ("remove", "_sockets", "_announced"),
    "cni.host.dumps": ("together", "writes"),
    "cni.spec.result": ("to_current",),
    "cni.skel": ("require_printable", "decode_config"),
    "copy": ("deepcopy",),
}


if __name__ == "__main__":
    main()
