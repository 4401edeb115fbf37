"""CRI-O's CHECKs in-process, as a daemon's spare runs them: CPU per CHECK, per plugin.

Runs skel.run(plugin, env, stdin, netns_fd) in a warm process (preimport, warm_up, gc frozen,
the spare's kept home sockets: bench/world.become_spare_like, preload.keep_home_sockets) whose
"host" is a throwaway netns (unshare), for bench/crio_requests.py's chain (bridge with ipMasq on
nftables, isGateway, isDefaultGateway, hairpin, host-local; portmap without runtimeConfig;
bandwidth with CRI-O's runtimeConfig). Per pod: the ADDs, then --checks rounds of the CHECKs
(bridge, portmap, bandwidth; prevResult the chain's result), then the DELs. --hostports:
portmap with two hostPorts (cnitool's CAP_ARGS in make bench); --routes N: N IPAM routes more.
Run as root:

    .venv/bin/python bench/check_profile.py [--pods N] [--checks N] [--hostports] [--routes N]
        [--profile PLUGIN] [--steps PLUGIN]

PYCNI_CHECKPROF_ROOT: another checkout's code (a before/after: run both, alternately).
Prints the median CPU ms (time.process_time) of each plugin's CHECK. --profile PLUGIN: cProfile
of that plugin's CHECKs (SORT, TOP: pstats order and length); --steps PLUGIN: CPU per step
(the STEPS functions wrapped), medians.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("PYCNI_CHECKPROF_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from world import become_spare_like, enter_private_mounts, install_steps  # noqa: E402

CRIO_ARGS = ("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench-1;"
             f"K8S_POD_INFRA_CONTAINER_ID={'0' * 64};K8S_POD_UID=bench")
BANDWIDTH_RUNTIME = {
    "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 34359738359,
                  "egressRate": 100_000_000, "egressBurst": 34359738359},
    "io.kubernetes.cri.pod-annotations": {"kubernetes.io/ingress-bandwidth": "100M",
                                          "kubernetes.io/egress-bandwidth": "100M"}}


def chain(data_dir: Path, hostports: bool = False, routes: int = 0) -> list[dict]:
    conf = json.loads((ROOT / "conf" / "10-pycni.conflist").read_text())
    plugins = [p for p in conf["plugins"] if p["type"] != "loopback"]
    for p in plugins:
        if p["type"] == "bridge":
            p |= {"bridge": "cni0", "ipMasqBackend": "nftables",
                  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/16"}]],
                           "dataDir": str(data_dir),
                           **({"routes": [{"dst": f"10.{100 + i}.0.0/16"} for i in range(routes)]}
                              if routes else {})}}
        elif p["type"] == "bandwidth":
            p["runtimeConfig"] = BANDWIDTH_RUNTIME
        elif p["type"] == "portmap" and hostports:  # as cnitool with CAP_ARGS (bench/driver.py)
            p["runtimeConfig"] = {"portMappings": [
                {"hostPort": 20000, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 20001, "containerPort": 53, "protocol": "udp"}]}
    return [{"cniVersion": "1.0.0", "name": "pycni", **p} for p in plugins]


def main() -> None:
    enter_private_mounts(also=(("/run/pycni", "0700"), ("/var/lib/cni", "0755")))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=6)
    parser.add_argument("--checks", type=int, default=10)
    parser.add_argument("--profile", default="")
    parser.add_argument("--steps", default="", help="PLUGIN: CPU per step of its CHECK")
    parser.add_argument("--routes", type=int, default=0,
                        help="IPAM routes besides the default route (cnitool configs' routes)")
    parser.add_argument("--hostports", action="store_true",
                        help="portmap with two hostPorts (cnitool's CAP_ARGS, as make bench)")
    opts = parser.parse_args()
    become_spare_like()
    from cni.fast import preload

    preload.keep_home_sockets()
    from cni import skel

    steps = install_steps(STEPS) if opts.steps else None
    per_step: dict[str, list[list]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="pycni-checkprof-"))
    plugins = chain(tmp / "ipam", opts.hostports, opts.routes)
    cpu: dict[str, list[float]] = {p["type"]: [] for p in plugins}
    prof = None
    if opts.profile:
        import cProfile

        prof = cProfile.Profile()

    def run(plugin: dict, verb: str, env: dict, prev, fd: int, timed: bool):
        conf = dict(plugin)
        if prev is not None:
            conf["prevResult"] = prev
        data = json.dumps(conf).encode()
        on = prof is not None and timed and plugin["type"] == opts.profile
        if steps is not None:
            steps.clear()
        start = time.process_time()
        if on:
            prof.enable()
        reply = skel.run(plugin["type"], env | {"CNI_COMMAND": verb}, data, fd)
        if on:
            prof.disable()
        spent = (time.process_time() - start) * 1e3
        if reply.code != 0:
            raise SystemExit(f"{verb} {plugin['type']}: {reply.stdout!r} {reply.stderr!r}")
        if timed:
            cpu[plugin["type"]].append(spent)
            if steps is not None and plugin["type"] == opts.steps:
                for k, v in steps.items():
                    per_step.setdefault(k, []).append(v)
        return json.loads(reply.stdout) if verb == "ADD" else None

    try:
        for i in range(opts.pods + 1):  # the first pod (bridge, tables) is left out
            pod = f"pycni-checkprof-{os.getpid()}-{i}"
            subprocess.run(["ip", "netns", "add", pod], check=True)
            fd = os.open(f"/run/netns/{pod}", os.O_RDONLY)
            env = {"CNI_CONTAINERID": secrets.token_hex(32), "CNI_NETNS": f"/run/netns/{pod}",
                   "CNI_IFNAME": "eth0", "CNI_PATH": str(ROOT / "bin"), "CNI_ARGS": CRIO_ARGS,
                   "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            try:
                prev = None
                for plugin in plugins:
                    prev = run(plugin, "ADD", env, prev, fd, False)
                for _ in range(opts.checks):
                    for plugin in plugins:
                        run(plugin, "CHECK", env, prev, fd, i > 0)
                        time.sleep(0.001)
                for plugin in reversed(plugins):
                    run(plugin, "DEL", env, prev, fd, False)
            finally:
                os.close(fd)
                subprocess.run(["ip", "netns", "del", pod], check=False)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    print(f"load (1-min) at the end: {os.getloadavg()[0]:.1f}; code: {ROOT}")
    for name, values in cpu.items():
        print(f"CHECK {name}: {statistics.median(values):.3f} ms CPU (median of {len(values)})")
    if per_step:
        print(f"-- {opts.steps} CHECK steps (median CPU us, count per call)")
        for k, v in per_step.items():
            n = statistics.median(x[1] for x in v)
            print(f"   {k:44s} {statistics.median(x[0] for x in v) * 1e3:8.0f}  x{n:.0f}")
    if prof is not None:
        import pstats

        stats = pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative"))
        stats.print_stats(int(os.environ.get("TOP", "60")))


STEPS = {
    "cni.plugins.bridge": ("load", "_check_links", "check_bridge", "_family_of"),
    "cni.plugins.bandwidth": ("limits", "_tbf", "_host_veth_reading", "_peer_reading",
                              "_compare"),
    "cni.plugins.portmap": ("parse_config", "parse_mappings", "container_ips",
                            "_checked_by_record", "_listed", "_ours"),
    "cni.host.hostport": ("container_rules", "read_record", "entry_rules_present",
                          "rules_digest"),
    "cni.ipam.delegate": ("check",),
    "cni.host.peer": ("container_veth", "points_back"),
    "cni.host.netns": ("new_socket", "ns_key", "open_ns", "entered", "_new_iproute",
                       "iproute"),
    "cni.host.links": ("get", "by_index", "from_message", "get_request"),
    "cni.host.addrs": ("has",),
    "cni.host.routes": ("find",),
    "cni.host.masq": ("present", "_record", "_rules"),
    "cni.host.nftrecord": ("read", "present", "comments"),
    "cni.host.nft": ("list_json", "rules"),
    "cni.host.tc": ("read_tbf", "redirect_targets", "tick_in_usec", "root_request",
                    "filters_request"),
    "cni.host.ifb": ("lookup",),
    "cni.host.dumps": ("together", "request", "address_request"),
    "cni.spec.result": ("to_current",),
    "cni.spec.config": ("parse",),
    "cni.skel": ("decode_config", "dispatch"),
}


if __name__ == "__main__":
    main()
