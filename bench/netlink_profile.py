"""A bridge ADD (and DEL) request by request: every pyroute2 call the verb makes, timed.

Runs the bridge plugin in-process, as the daemon's child does (pyroute2 and the plugins imported
and warmed first), in throwaway namespaces: a "host" made with unshare (this process's only),
and a pod namespace bound under /run/netns for the request. Each IPRoute the verb builds is
wrapped: its construction (socket, asyncio loop) and each call are timed. Prints one table per
verb, the calls in order, and the totals; run as root:

    .venv/bin/python bench/netlink_profile.py [--rounds N]

It re-runs itself in a private mount namespace with fresh tmpfs on /run/netns, /run/pycni and
/var/lib/cni (as scripts/test.sh does): nothing it makes can outlive it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# PYCNI_NLPROF_ROOT: another checkout's code (a before/after of the whole verbs' times; the
# per-call table needs this one's netns.new_socket).
ROOT = Path(os.environ.get("PYCNI_NLPROF_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from world import become_spare_like  # noqa: E402

Call = tuple[str, float]  # what, milliseconds
_calls: list[Call] = []


class Timed:
    """An IPRoute whose every method call is timed into _calls."""

    def __init__(self, ipr: Any, label: str) -> None:
        self._ipr = ipr
        self._label = label

    def __enter__(self) -> Timed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.__getattr__("close")()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ipr, name)
        if not callable(attr) or name in ("fileno",):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                what = f"{self._label}.{name}({_describe(args, kwargs)})"
                _record(what, (time.perf_counter() - start) * 1e3)
        return timed


def _record(what: str, ms: float) -> None:
    """linkgone's helper thread finishes the kernel's clean-up wait after the verb returned:
    its calls are kept apart (they are off the request's path)."""
    if threading.current_thread().name == "pycni-linkdel":
        _helper.append((what, ms))
    else:
        _calls.append((what, ms))


_helper: list[Call] = []


def _describe(args: tuple, kwargs: dict) -> str:
    first = repr(args[0]) if args and isinstance(args[0], str) else ""
    keys = ",".join(k for k in kwargs if k not in ("index",))
    return ",".join(x for x in (first, keys) if x)


def _install() -> None:
    from cni.host import netns

    real = getattr(netns, "new_socket", None)
    if real is None:
        print("(no netns.new_socket in this checkout: whole verbs only)")
        return

    def new_socket() -> Any:
        start = time.perf_counter()
        ipr = real()
        _record(f"IPRoute() [{_ns_name()}]", (time.perf_counter() - start) * 1e3)
        return Timed(ipr, "ipr")

    netns.new_socket = new_socket


_HOME: tuple[int, int] | None = None


def _ns_name() -> str:
    st = os.stat("/proc/thread-self/ns/net")
    return "host" if (st.st_dev, st.st_ino) == _HOME else "pod"


def _run(plugin: str, env: dict[str, str], config: dict) -> tuple[float, list[Call]]:
    from cni import skel

    _calls.clear()
    start = time.perf_counter()
    reply = skel.run(plugin, env, json.dumps(config).encode())
    total = (time.perf_counter() - start) * 1e3
    if reply.code != 0:
        raise SystemExit(f"{env['CNI_COMMAND']} failed: {reply.stdout!r} {reply.stderr!r}")
    return total, list(_calls)


def main() -> None:
    global _HOME
    from world import enter_private_mounts  # bench/world.py: this script's folder is on sys.path

    enter_private_mounts(also=(("/run/pycni", "0700"), ("/var/lib/cni", "0755")))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chain", action="store_true",
                        help="bandwidth (on bridge's result) and loopback too, each verb; bridge as"
                        " in make bench's chain (ipMasq on nftables, hairpin, a default route)")
    parser.add_argument("--kept", action="store_true",
                        help="as a daemon's spare: one IPRoute (and NFTSockets) kept for the host"
                        " namespace")
    opts = parser.parse_args()

    become_spare_like()  # (as the daemon before it forks, and its spares: gc.disable)
    st = os.stat("/proc/thread-self/ns/net")
    _HOME = (st.st_dev, st.st_ino)
    _install()
    if opts.kept:
        from cni.host import netns, nftrecord

        netns.keep_home_socket()
        keep_nft = getattr(nftrecord, "keep_home_sockets", None)  # absent in older checkouts
        if keep_nft is not None:
            keep_nft()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-nlprof-"))
    config = {"cniVersion": "1.0.0", "name": "profnet", "type": "bridge", "bridge": "cni0",
              "isGateway": True, "ipam": {"type": "host-local", "subnet": "10.77.0.0/16",
                                          "dataDir": str(tmp / "ipam")}}
    if opts.chain:  # the bridge of make bench's chain (bench/driver.py)
        config |= {"ipMasq": True, "ipMasqBackend": "nftables", "hairpinMode": True}
        config["ipam"] = config["ipam"] | {"routes": [{"dst": "0.0.0.0/0"}]}
    _configs.update(bridge=config, loopback={"cniVersion": "1.0.0", "name": "lo",
                                             "type": "loopback"},
                    bandwidth={"cniVersion": "1.0.0", "name": "profnet", "type": "bandwidth",
                               "ingressRate": 8_000_000, "ingressBurst": 80_000,
                               "egressRate": 8_000_000, "egressBurst": 80_000})
    per_verb: dict[str, list[tuple[float, list[Call]]]] = defaultdict(list)
    try:
        for i in range(opts.rounds + 1):  # the first round (bridge creation) is left out
            pod = f"pycni-nlprof-{os.getpid()}-{i}"
            subprocess.run(["ip", "netns", "add", pod], check=True)
            env = {"CNI_CONTAINERID": f"prof{i}", "CNI_NETNS": f"/run/netns/{pod}",
                   "CNI_IFNAME": "eth0", "CNI_PATH": str(ROOT / "bin"),
                   "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            try:
                for plugin, verb in _steps(opts.chain):
                    step_env = env | {"CNI_COMMAND": verb}
                    if plugin == "loopback":
                        step_env["CNI_IFNAME"] = "lo"
                    conf = _configs[plugin]
                    if plugin == "bandwidth" or (verb == "CHECK" and plugin == "bridge"):
                        conf = _with_prev(conf, tmp, env)
                    got = _run(plugin, step_env, conf)
                    if i:
                        per_verb[f"{plugin} {verb}"].append(got)
                    if verb == "ADD" and plugin == "bridge":
                        (tmp / "prev.json").write_text(json.dumps(_last_result))
            finally:
                subprocess.run(["ip", "netns", "del", pod], check=False)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    for verb, runs in per_verb.items():
        _table(verb if " " in verb else f"bridge {verb}", runs)
    if not _helper:
        return
    print("\nlinkgone's helper thread (DEL's link delete, off the request's path once the link"
          " is announced gone), median ms:")
    by_what: dict[str, list[float]] = defaultdict(list)
    for what, ms in _helper:
        by_what[what].append(ms)
    for what, values in by_what.items():
        print(f"- `{what}`: {statistics.median(values):.3f}")


_last_result: dict = {}
_configs: dict[str, dict] = {}


def _steps(chain: bool) -> list[tuple[str, str]]:
    """bridge ADD, CHECK, DEL; with --chain, bridge + bandwidth (on bridge's result) and
    loopback: the ADDs, the CHECKs, the DELs (bandwidth's and loopback's first)."""
    if not chain:
        return [("bridge", verb) for verb in ("ADD", "CHECK", "DEL")]
    plugins = ("bridge", "bandwidth", "loopback")
    return ([(p, "ADD") for p in plugins] + [(p, "CHECK") for p in plugins]
            + [(p, "DEL") for p in reversed(plugins)])


def _with_prev(config: dict, tmp: Path, env: dict) -> dict:
    return config | {"prevResult": json.loads((tmp / "prev.json").read_text())}


def _table(verb: str, runs: list[tuple[float, list[Call]]]) -> None:
    """Median of each call (by its position in the sequence) over the runs."""
    sequences = [calls for _, calls in runs]
    length = min(len(s) for s in sequences)
    print(f"\n### {verb}: {len(runs)} runs, median per call (ms)\n")
    print("| # | call | ms |\n| --- | --- | --- |")
    netlink = 0.0
    for n in range(length):
        what = sequences[0][n][0]
        ms = statistics.median(s[n][1] for s in sequences)
        netlink += ms
        print(f"| {n + 1} | `{what}` | {ms:.3f} |")
    total = statistics.median(t for t, _ in runs)
    print(f"| | **pyroute2 calls, summed** | **{netlink:.2f}** |")
    print(f"| | whole verb in-process (skel.run) | {total:.2f} |")


if __name__ == "__main__":
    from cni import skel

    _real_run = skel.run

    def _keep_result(plugin: str, env: Any, stdin: bytes, netns: int | None = None) -> Any:
        reply = _real_run(plugin, env, stdin, netns)
        if env.get("CNI_COMMAND") == "ADD" and reply.code == 0:
            _last_result.clear()
            _last_result.update(json.loads(reply.stdout))
        return reply

    skel.run = _keep_result
    main()
