"""One driver for both sides: execs CNI plugins the way a runtime (libcni) does.

Each plugin gets CNI_* in its environment and its config on stdin: the plugin object plus the
network's name and cniVersion, runtimeConfig for its capabilities, and prevResult threaded from
the plugin before it. ADD and CHECK walk the chain in order, DEL in reverse. The driver measures
each exec's wall time and peak RSS (wait4), and nothing else differs between the sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from world import Cgroup, born_in

CNI_VERSION = "1.0.0"  # the highest the reference (v1.1.1) speaks
LIBCNI_VERSION_STDIN = b'{"cniVersion":"1.1.0"}'


@dataclass
class Side:
    """One implementation under test and its own network (bridge, subnet, store)."""

    name: str
    bin_dir: Path
    bridge: str
    subnet: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)  # PYCNI_SOCKET for ours
    network: str = "benchnet"
    nftables: bool = False  # ask for the nftables backends (the reference v1.9's ipMasqBackend,
    # portmap's backend; ours only has them, v1.1.1 knows neither key)
    cgroup: Cgroup | None = None  # a world.Cgroup each plugin exec is born in (Cgroup.holding)

    def chain(self, index: int) -> list[dict[str, Any]]:
        """The pod chain: loopback, then bridge + host-local, portmap (two ports), bandwidth.

        hostPorts differ per pod so concurrent pods never compete for one."""
        port = 20000 + 2 * index
        backends = ({"ipMasqBackend": "nftables"}, {"backend": "nftables"}) if self.nftables \
            else ({}, {})
        return [
            {"type": "loopback"},
            {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True,
             "hairpinMode": True, **backends[0],
             "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.data_dir)}},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True,
             **backends[1],
             "runtimeConfig": {"portMappings": [
                 {"hostPort": port, "containerPort": 80, "protocol": "tcp"},
                 {"hostPort": port + 1, "containerPort": 53, "protocol": "udp"}]}},
            {"type": "bandwidth", "capabilities": {"bandwidth": True},
             "runtimeConfig": {"bandwidth": {"ingressRate": 100_000_000,
                                             "ingressBurst": 1_000_000,
                                             "egressRate": 100_000_000,
                                             "egressBurst": 1_000_000}}},
        ]


@dataclass
class Exec:
    plugin: str
    command: str
    code: int
    stdout: bytes
    stderr: bytes
    seconds: float
    maxrss_kb: int

    @property
    def ok(self) -> bool:
        return self.code == 0

    def result(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None

    def describe(self) -> str:
        return (f"{self.plugin} {self.command} exit {self.code}: "
                f"{self.stdout.decode(errors='replace')[:300]} "
                f"{self.stderr.decode(errors='replace')[-300:]}")


def run_plugin(side: Side, plugin: str, command: str, stdin: bytes, *, container_id: str = "",
               netns: str = "", ifname: str = "eth0", rss: bool = False) -> Exec:
    """Exec one plugin as libcni does (VERSION: NETNS/IFNAME/PATH are "dummy", as libcni's).

    rss=True runs it under /usr/bin/time for its peak RSS (not timed then): a child forked from
    this big Python process would report this process's RSS as its own peak."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": command, **side.env}
    if command == "VERSION":
        env |= {"CNI_CONTAINERID": "dummy", "CNI_NETNS": "dummy", "CNI_IFNAME": "dummy",
                "CNI_PATH": "dummy"}
    else:
        env |= {"CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
                "CNI_PATH": str(side.bin_dir)}
    argv = [str(side.bin_dir / plugin)]
    with tempfile.NamedTemporaryFile("r") as report:
        if rss:
            argv = ["/usr/bin/time", "-f", "%M", "-o", report.name, *argv]
        start = time.perf_counter()
        with born_in(side.cgroup):
            proc = subprocess.Popen(argv, env=env, bufsize=0, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = _exchange(proc, stdin)
            code = proc.wait()
        seconds = time.perf_counter() - start
        maxrss = int(report.read().split()[-1]) if rss else 0
    return Exec(plugin, command, code, out, err, seconds, maxrss)


def _exchange(proc: subprocess.Popen, stdin: bytes) -> tuple[bytes, bytes]:
    """Write stdin, read both pipes; outputs are small (< a pipe buffer), so no threads."""
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except BrokenPipeError:  # it answered without reading all of it (the reference's VERSION)
        pass
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return out, err


def plugin_config(side: Side, plugin: dict[str, Any], prev: Any) -> bytes:
    conf = {"cniVersion": CNI_VERSION, "name": side.network, **plugin}
    if prev is not None:
        conf["prevResult"] = prev
    return json.dumps(conf).encode()


@dataclass
class Pod:
    container_id: str
    netns: str
    index: int
    result: Any = None


def chain_add(side: Side, pod: Pod, rss: bool = False) -> list[Exec]:
    """ADD in order, threading prevResult; stops at the first failure (as libcni)."""
    execs, prev = [], None
    for plugin in side.chain(pod.index):
        ex = run_plugin(side, plugin["type"], "ADD", plugin_config(side, plugin, prev),
                        container_id=pod.container_id, netns=pod.netns, rss=rss)
        execs.append(ex)
        if not ex.ok:
            return execs
        prev = ex.result()
    pod.result = prev
    return execs


def chain_check(side: Side, pod: Pod, rss: bool = False) -> list[Exec]:
    """CHECK in order. Unlike libcni it goes on after a failure, so every plugin is measured
    (the reference v1.1.1 portmap fails CHECK on IPv4-only pods: it looks for an IPv6 chain)."""
    return [run_plugin(side, plugin["type"], "CHECK", plugin_config(side, plugin, pod.result),
                       container_id=pod.container_id, netns=pod.netns, rss=rss)
            for plugin in side.chain(pod.index)]


def chain_del(side: Side, pod: Pod, rss: bool = False) -> list[Exec]:
    """DEL in reverse order with the cached result as prevResult; libcni stops at an error."""
    execs = []
    for plugin in reversed(side.chain(pod.index)):
        ex = run_plugin(side, plugin["type"], "DEL", plugin_config(side, plugin, pod.result),
                        container_id=pod.container_id, netns=pod.netns, rss=rss)
        execs.append(ex)
        if not ex.ok:
            break
    return execs


def addresses(result: Any) -> list[str]:
    if not isinstance(result, dict):
        return []
    return [ip["address"].split("/")[0] for ip in result.get("ips", [])]
