"""A Kubernetes-style cluster in namespaces (issue 46; docs/CLUSTER.md): nodes, each a network +
mount namespace (clients.Node) with its own CRI runtime (containerd 1.6 or CRI-O 1.33), pycni
installed from the wheel and its own `pycni daemon`, joined by one L2 segment (a bridge in a
throwaway "underlay" namespace), routes between nodes from BIRD 2 (conf/bird-node.conf.in: iBGP full
mesh, each node announcing its pod CIDRs), and a router to an "outside" namespace that knows no
pod CIDR.

containerd nodes get their conflist as kubelet gives it: CRI's conf_template is
conf/pycni-containerd.conflist.tmpl (its placeholder cluster CIDRs replaced with ours, as an
operator edits it) and the node's podCIDRs arrive through CRI UpdateRuntimeConfig. The CRI-O node
gets its conflist from `pycni install --pod-cidr ... --cluster-cidr ...`.

Addresses (all on veths and bridges the test made): node N is 192.168.100.N/24 and
fd00:100::N/64, its pods 10.100.N.0/24 and fd00:10:100:N::/64 of the cluster's 10.100.0.0/16 and
fd00:10:100::/56; the router is .254 / ::fe, the outside namespace 198.51.100.2 / 2001:db8:ff::2.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients import (
    PAUSE_IMAGE,
    ROOT,
    CRIContainerd,
    Node,
    kill_processes_mentioning,
    terminate,
    wait_for,
)
from cnitest import Netns, delete_netns, new_netns
from crinode import HTTPD, CRINode, runtime_node
from crionode import CRIO

TEMPLATE = ROOT / "conf" / "pycni-containerd.conflist.tmpl"
BIRD_CONF = ROOT / "conf" / "bird-node.conf.in"
TEMPLATE_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")  # the template's placeholders
CLUSTER4, CLUSTER6 = "10.100.0.0/16", "fd00:10:100::/56"
ROUTER4, ROUTER6 = "192.168.100.254", "fd00:100::fe"
OUTSIDE4, OUTSIDE6 = "198.51.100.2", "2001:db8:ff::2"
CONTAINERD_CONFLIST = "10-containerd-net.conflist"  # where containerd renders conf_template
WEB_PORT = 80  # busybox httpd in every pod
HOST_PORT = 8080
BODY = "hello from pycni\n"


def addr4(i: int) -> str:
    return f"192.168.100.{i}"


def addr6(i: int) -> str:
    return f"fd00:100::{i}"


def pod_cidrs(i: int) -> tuple[str, str]:
    return f"10.100.{i}.0/24", f"fd00:10:100:{i}::/64"


def render_bird(i: int, peers: list[int]) -> str:
    """conf/bird-node.conf.in for node i, as docs/CLUSTER.md tells an operator to fill it in."""
    v4, v6 = pod_cidrs(i)
    out = []
    for line in BIRD_CONF.read_text().splitlines():
        if "@PEER_" in line and not line.lstrip().startswith("#"):
            out += [line.replace("@PEER_NAME@", f"node{p}").replace("@PEER_ADDR4@", addr4(p))
                    .replace("@PEER_ADDR6@", addr6(p)) for p in peers]
            continue
        out.append(line.replace("@NODE_ADDR4@", addr4(i)).replace("@NODE_ADDR6@", addr6(i))
                   .replace("@POD_CIDR4@", v4).replace("@POD_CIDR6@", v6))
    text = "\n".join(out) + "\n"
    body = "\n".join(x for x in out if not x.lstrip().startswith("#"))
    assert "@" not in body, body  # every placeholder filled
    return text


def render_template() -> str:
    """The shipped conf_template with its placeholder cluster CIDRs replaced by ours."""
    text = TEMPLATE.read_text()
    for old, new in zip(TEMPLATE_CIDRS, (CLUSTER4, CLUSTER6), strict=True):
        assert old in text, f"{TEMPLATE} has no placeholder {old}"
        text = text.replace(old, new)
    return text


class Bird:
    """BIRD 2 in the node's namespaces, in the foreground, on its own config, control socket
    and pid file (never the machine's bird service)."""

    def __init__(self, node: Node, work: Path, config: str) -> None:
        self.node, self.work = node, work
        work.mkdir(parents=True, exist_ok=True)
        self.conf, self.sock, self.pid = work / "bird.conf", work / "bird.ctl", work / "bird.pid"
        self.log = work / "bird.log"
        self.conf.write_text(config)
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = self.node.popen("bird", "-f", "-c", str(self.conf), "-s", str(self.sock),
                                        "-P", str(self.pid), stdout=log,
                                        stderr=subprocess.STDOUT)
        wait_for("bird's control socket", self._up, timeout=30, interval=0.2)

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"bird exited:\n{self.log.read_text()[-3000:]}")
        return self.sock.exists() and self.birdc("show", "status").returncode == 0

    def birdc(self, *cmd: str) -> subprocess.CompletedProcess:
        return self.node.run("birdc", "-s", str(self.sock), *cmd, check=False, timeout=30)

    def established(self) -> list[str]:
        """The BGP sessions in state Established (birdc `show protocols`)."""
        out = self.birdc("show", "protocols").stdout
        return [line.split()[0] for line in out.splitlines()
                if " BGP " in line and "Established" in line]

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, grace=15)
            self.proc = None
        self.sock.unlink(missing_ok=True)


class TemplatedContainerd(CRIContainerd):
    """containerd's CRI with conf_template set: the conflist comes from UpdateRuntimeConfig."""

    def __init__(self, *args: Any, conf_template: Path, **kw: Any) -> None:
        self.env = kw.get("env")
        super().__init__(*args, conf_template=conf_template, **kw)

    def restart(self) -> None:
        """SIGTERM and start again on the same config and state, as `systemctl restart
        containerd`: the shims, and so the pods, live on."""
        terminate(self.proc, grace=30)
        with open(self.log, "ab") as log:
            self.proc = self.node.popen("containerd", "--config", str(self.work / "config.toml"),
                                        stdout=log, stderr=subprocess.STDOUT, env=self.env)
        wait_for("containerd's socket", self._up, timeout=60, interval=0.2)


@dataclass
class Pod:
    """A pod made through CRI: its id, IPs (v4 first) and network namespace's path."""

    name: str
    id: str
    ips: list[str]
    netns: str
    containers: list[str] = field(default_factory=list)

    @property
    def ip4(self) -> str:
        return self.ips[0]

    @property
    def ip6(self) -> str:
        return self.ips[1]


@dataclass
class Member:
    """One node of the cluster."""

    i: int
    runtime: str  # "containerd" or "cri-o"
    netns: Netns
    cri: CRINode | None = None
    bird: Bird | None = None
    bin_dir: Path = Path()
    conf_dir: Path = Path()
    work: Path = Path()
    pods: list[Pod] = field(default_factory=list)

    @property
    def node(self) -> Node:
        assert self.cri is not None
        return self.cri.node

    @property
    def addr4(self) -> str:
        return addr4(self.i)

    @property
    def addr6(self) -> str:
        return addr6(self.i)

    @property
    def pod_cidrs(self) -> tuple[str, str]:
        return pod_cidrs(self.i)

    def conflist(self) -> dict[str, Any]:
        [path] = sorted(self.conf_dir.glob("*.conflist"))
        return json.loads(path.read_text())

    def in_pod(self, pod: Pod, *cmd: str, **kw: Any) -> subprocess.CompletedProcess:
        """cmd (a tool of the node's) in the pod's network namespace."""
        return self.node.run("nsenter", f"--net={pod.netns}", "--", *cmd, **kw)

    def pod_popen(self, pod: Pod, *cmd: str, **kw: Any) -> subprocess.Popen:
        return self.node.popen("nsenter", f"--net={pod.netns}", "--", *cmd, **kw)

    def run_pod(self, name: str, *, host_port: int | None = None,
                annotations: dict[str, str] | None = None) -> Pod:
        """What kubelet does for a pod running busybox httpd (with a hostPort if asked)."""
        from cri.client import PortMap

        assert self.cri is not None
        logs = self.work / "pod-logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        ports = [PortMap(host_port, WEB_PORT)] if host_port else []
        sandbox = self.cri.cri.run_pod(name, port_mappings=ports, annotations=annotations,
                                       log_directory=str(logs), cgroup_parent=self.cri.cgroup)
        self.cri.cri.create_start(sandbox, "httpd", HTTPD,
                                  ["/bin/httpd", "-f", "-p", str(WEB_PORT), "-h", "/www"])
        ip, more = self.cri.cri.pod_ip(sandbox.id)
        pod = Pod(name, sandbox.id, [ip, *more], self.pod_netns(ip), sandbox.containers)
        nets = [ipaddress.ip_network(c) for c in self.pod_cidrs]
        assert [ipaddress.ip_address(a) in n for a, n in zip(pod.ips, nets, strict=True)] == \
            [True, True], (pod.ips, nets)
        self.pods.append(pod)
        return pod

    def remove_pod(self, pod: Pod) -> None:
        assert self.cri is not None
        self.cri.cri.stop_remove(pod.id, pod.containers)
        self.pods.remove(pod)

    def pod_netns(self, ip: str) -> str:
        """The pinned network namespace (under the runtime's netns dir) holding ip."""
        assert self.cri is not None
        for path in sorted(self.cri.ctrd.netns_dir.iterdir()):
            out = self.node.run("nsenter", f"--net={path}", "--", "ip", "-j", "addr", "show",
                                check=False).stdout
            if any(a.get("local") == ip for link in json.loads(out or "[]")
                   for a in link.get("addr_info", [])):
                return str(path)
        raise AssertionError(f"no pod netns holds {ip}")

    def routes(self, family: str = "-4") -> list[dict[str, Any]]:
        return self.netns.ip(family, "route", "show")


def kill_netns_processes(m: Member, pod: Pod) -> None:
    """SIGKILL every process in the pod's network namespace (found by the namespace's inode,
    its pin seen through the node's mount namespace)."""
    inode = os.stat(f"/proc/{m.node.proc.pid}/root{pod.netns}").st_ino
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino == inode:
                    os.kill(int(entry.name), signal.SIGKILL)


def link(a: Netns, a_name: str, b: Netns, b_name: str) -> None:
    """A veth pair between two namespaces, both ends up."""
    a.run("ip", "link", "add", a_name, "type", "veth", "peer", "name", b_name, "netns", b.name)
    a.run("ip", "link", "set", a_name, "up")
    b.run("ip", "link", "set", b_name, "up")


def addrs(ns: Netns, dev: str, *cidrs: str) -> None:
    for cidr in cidrs:
        extra = ("nodad",) if ":" in cidr else ()
        ns.run("ip", "addr", "add", cidr, "dev", dev, *extra)


def forwarding(ns: Netns) -> None:
    ns.run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")


@dataclass
class Cluster:
    members: list[Member]
    underlay: Netns
    router: Netns
    outside: Netns
    venv: Any  # wheels.Venv: pycni from the wheel
    images: list[Path] = field(default_factory=list)
    stack: contextlib.ExitStack | None = None  # what tears the cluster down

    def start_node(self, m: Member) -> None:
        """m's runtime (with its pycni daemon) and BIRD, their stops on the cluster's stack."""
        assert self.stack is not None
        m.cri = self.stack.enter_context(_runtime(m, self.venv, self.images))
        m.bird = Bird(m.node, m.work / "bird", render_bird(m.i, [o.i for o in self.other(m)]))
        self.stack.callback(m.bird.stop)

    def reboot(self, m: Member) -> None:
        """Node m rebooted, its disk kept: BIRD, the runtime (its shims, every pod process),
        the pycni daemon and the node's namespaces gone; the network namespace made again,
        and the node's own network, runtime, daemon and BIRD started on the same dirs (the
        runtime's root and state, /var/lib/cni, the conflist)."""
        assert m.cri is not None and m.bird is not None and m.cri.daemon is not None
        m.bird.stop()
        terminate(m.cri.ctrd.proc, grace=30)
        kill_processes_mentioning(str(m.cri.ctrd.sock))  # the shims
        for pod in m.pods:
            kill_netns_processes(m, pod)
        m.cri.daemon.stop()
        m.node.stop()
        subprocess.run(["ip", "netns", "del", m.netns.name], check=True)
        wait_for(f"node {m.i}'s namespace to go", lambda: f"n{m.i}" not in {
            x["ifname"] for x in self.underlay.ip("link", "show")}, timeout=60)
        subprocess.run(["ip", "netns", "add", m.netns.name], check=True)
        m.netns.run("ip", "link", "set", "lo", "up")
        _node_network(self.underlay, m)
        self.start_node(m)

    def other(self, m: Member) -> list[Member]:
        return [o for o in self.members if o is not m]

    def wait_routes(self, timeout: float = 90) -> None:
        """Every node has BIRD's route (`ip route show proto bird`) to every other node's pod
        CIDRs, via that node."""
        def complete() -> bool:
            for m in self.members:
                have = {(r["dst"], r.get("gateway")) for fam in ("-4", "-6")
                        for r in m.routes(fam) if r.get("protocol") == "bird"}
                want = {(c, o.addr4 if "." in c else o.addr6) for o in self.other(m)
                        for c in o.pod_cidrs}
                if not want <= have:
                    return False
            return True
        wait_for("BIRD's routes on every node", complete, timeout=timeout, interval=0.5)


def _underlay(stack: contextlib.ExitStack) -> tuple[Netns, Netns, Netns]:
    """The segment between the nodes (a bridge in its own namespace), the router on it and the
    outside namespace behind the router."""
    underlay, router, outside = (new_netns(p) for p in ("pycni-ul", "pycni-rt", "pycni-out"))
    for ns in (underlay, router, outside):
        stack.callback(delete_netns, ns)
    underlay.run("ip", "link", "add", "br0", "type", "bridge")
    underlay.run("ip", "link", "set", "br0", "up")
    link(underlay, "rt", router, "eth0")
    underlay.run("ip", "link", "set", "rt", "master", "br0")
    addrs(router, "eth0", f"{ROUTER4}/24", f"{ROUTER6}/64")
    link(router, "eth1", outside, "eth0")
    addrs(router, "eth1", "198.51.100.1/24", "2001:db8:ff::1/64")
    addrs(outside, "eth0", f"{OUTSIDE4}/24", f"{OUTSIDE6}/64")
    outside.run("ip", "route", "add", "default", "via", "198.51.100.1")
    outside.run("ip", "-6", "route", "add", "default", "via", "2001:db8:ff::1")
    forwarding(router)
    return underlay, router, outside


def _node_network(underlay: Netns, m: Member) -> None:
    """Node i's eth0 on the segment, its default route via the router, forwarding on."""
    link(underlay, f"n{m.i}", m.netns, "eth0")
    underlay.run("ip", "link", "set", f"n{m.i}", "master", "br0")
    addrs(m.netns, "eth0", f"{m.addr4}/24", f"{m.addr6}/64")
    m.netns.run("ip", "route", "add", "default", "via", ROUTER4)
    m.netns.run("ip", "-6", "route", "add", "default", "via", ROUTER6)
    forwarding(m.netns)


def _install(m: Member, venv: Any) -> None:
    """pycni from the wheel into the node's bin dir; the CRI-O node's conflist from
    `pycni install --pod-cidr --cluster-cidr`, the containerd nodes' from conf_template later."""
    m.bin_dir, m.conf_dir = m.work / "cni" / "bin", m.work / "cni" / "net.d"
    m.conf_dir.mkdir(parents=True)
    args = ["install", "--bin-dir", str(m.bin_dir), "--conf-dir", str(m.conf_dir)]
    if m.runtime == "containerd":
        args += ["--conflist", ""]
    else:
        args += ["--cni-version", "1.1.0"]
        for cidr in m.pod_cidrs:
            args += ["--pod-cidr", cidr]
        for cidr in (CLUSTER4, CLUSTER6):
            args += ["--cluster-cidr", cidr]
    venv.run(venv.pycni, *args, cwd=m.work,
             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "PYCNI_SYSTEMD": "0"})


@contextlib.contextmanager
def _runtime(m: Member, venv: Any, images: list[Path]) -> Iterator[CRINode]:
    work = m.work
    if m.runtime == "containerd":
        template = work / "pycni.conflist.tmpl"
        template.write_text(render_template())

        def start(node: Node, env: dict[str, str] | None) -> TemplatedContainerd:
            return TemplatedContainerd(node, work / "containerd", cni_bin=m.bin_dir,
                                       cni_conf=m.conf_dir, sandbox_image=PAUSE_IMAGE, env=env,
                                       conf_template=template)

        def load(ctrd: TemplatedContainerd) -> None:
            for image in images:
                ctrd.ctr("images", "import", str(image))
    else:
        def start(node: Node, env: dict[str, str] | None) -> CRIO:  # type: ignore[misc]
            return CRIO(node, work / "crio", cni_bin=m.bin_dir, cni_conf=m.conf_dir, env=env)

        def load(crio: CRIO) -> None:  # type: ignore[misc]
            crio.load_images(images)

    with runtime_node(m.netns, work, bin_dir=m.bin_dir, conf_dir=m.conf_dir, daemon=True,
                      start=start, load=load, runtime_name=m.runtime, pycni=venv.pycni) as n:
        if m.runtime == "containerd":  # kubelet, once the node has its podCIDRs
            n.cri.update_runtime_config(",".join(m.pod_cidrs))
            wait_for("containerd's rendered conflist",
                     lambda: (m.conf_dir / CONTAINERD_CONFLIST).exists(), timeout=30)
        wait_for(f"node {m.i}'s runtime NetworkReady", n.cri.network_ready, timeout=60,
                 interval=0.3)
        yield n


RUNTIMES = ("containerd", "containerd", "cri-o")


@contextlib.contextmanager
def cluster(tmp: Path, venv: Any, images: list[Path],
            runtimes: tuple[str, ...] = RUNTIMES) -> Iterator[Cluster]:
    """The whole cluster, up with every BGP route in place; torn down whatever happens."""
    with contextlib.ExitStack() as stack:
        underlay, router, outside = _underlay(stack)
        members = []
        for i, runtime in enumerate(runtimes, start=1):
            m = Member(i, runtime, new_netns(f"pycni-n{i}"), work=tmp / f"node{i}")
            stack.callback(delete_netns, m.netns)
            m.work.mkdir(parents=True)
            _node_network(underlay, m)
            _install(m, venv)
            members.append(m)
        c = Cluster(members, underlay, router, outside, venv, images, stack)
        for m in members:
            c.start_node(m)
        c.wait_routes()
        yield c


# ---- traffic -------------------------------------------------------------------------------

# ncat -v's first line about a peer: "Ncat: Connection from ADDR." (TCP adds one with ADDR:PORT)
CONNECTION_FROM = re.compile(r"Ncat: Connection from (\S+)\.$", re.M)


def seen_by_server(server: Member, server_pod: Pod, dst: str, port: int, *, udp: bool = False,
                   client: Any) -> str:
    """The source address the server's own socket saw (ncat -v, listening in the server pod's
    network namespace) for one connection (TCP) or datagram (UDP) that client() sends to dst."""
    proto = ["-u"] if udp else []
    cmd = ["timeout", "30", "ncat", *proto, "-v", "-l", "--recv-only", "-i", "3", str(port)]
    proc = server.pod_popen(server_pod, *cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        table = "-lun" if udp else "-ltn"
        wait_for(f"ncat on port {port}", lambda: f":{port} " in server.in_pod(
            server_pod, "ss", "-H", table).stdout, timeout=20, interval=0.1)
        client()
        out, err = proc.communicate(timeout=40)
    finally:
        terminate(proc, grace=2)
    found = CONNECTION_FROM.search(err)
    assert found, f"ncat saw no connection to {dst} port {port}:\n{err}\n{out}"
    return found.group(1)


def send(node: Node, prefix: tuple[str, ...], dst: str, port: int, udp: bool = False) -> None:
    """One TCP connection (retried until it connects) or UDP datagram to dst:port."""
    proto = ["-u"] if udp else []
    argv = [*prefix, "ncat", *proto, "--send-only", "-w", "3", dst, str(port)]

    def once() -> bool:
        return node.run(*argv, input="hello\n", check=False).returncode == 0
    wait_for(f"a connection to {dst}:{port}", once, timeout=20, interval=0.5)
    if udp:  # a datagram may meet a neighbour entry still resolving: send a few more
        for _ in range(2):
            time.sleep(0.2)
            once()


def conntrack_sources(m: Member, dst: str, port: int, udp: bool = False) -> set[str]:
    """The original source of each conntrack entry on node m to dst:port."""
    fam = "ipv6" if ":" in dst else "ipv4"
    out = m.node.run("conntrack", "-L", "-f", fam, "-p", "udp" if udp else "tcp",
                     "-d", dst, "--dport", str(port), check=False).stdout
    return {line.split("src=")[1].split()[0] for line in out.splitlines() if "src=" in line}


def in_pod(pod: Pod) -> tuple[str, ...]:
    """The prefix that runs a node's tool in the pod's network namespace."""
    return ("nsenter", f"--net={pod.netns}", "--")


def http_get(node: Node, prefix: tuple[str, ...], addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    proc = node.run(*prefix, "curl", "-sS", "--max-time", "3", f"http://{host}:{port}/",
                    check=False)
    return proc.stdout if proc.returncode == 0 else ""


def wait_body(node: Node, prefix: tuple[str, ...], addr: str, port: int) -> str:
    """The body http://addr:port/ answers within 30 s, or "" (the caller's assert says who)."""
    try:
        return wait_for(f"http {addr}:{port}", lambda: http_get(node, prefix, addr, port),
                        timeout=30, interval=0.5)
    except TimeoutError:
        return ""

