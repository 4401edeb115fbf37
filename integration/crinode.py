"""A kubelet-like CRI node for the CRI tests (test_cri.py, test_cri_swap.py): the throwaway node
running containerd 1.6 with its CRI plugin on given CNI dirs, the web pod kubelet would start
(a hostPort and the two bandwidth annotations, busybox httpd), and readers of the node's state.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients import (
    PAUSE_IMAGE,
    ROOT,
    VENV_PY,
    Containerd,
    CRIContainerd,
    Node,
    PycniDaemon,
    cgroup_parent,
    cleanup,
    leftovers,
    wait_for,
)
from cnitest import Netns, delete_netns, new_netns

HTTPD = "localhost/pycni-busybox:test"  # conftest's oci_image
NODE_ADDR = "192.0.2.30"  # the node's own addresses (on its lo); hostPort traffic goes to them
NODE_ADDR6 = "2001:db8::30"
HOST_PORT = 8080
RATE = 1_000_000  # "1M" in the annotations: bit/s
BODY = "hello from pycni\n"  # busybox_rootfs's /www/index.html

# The reference's per-pod iptables chains are named by a hash, not the pod: "CNI-" + 24 hex
# (bridge's masquerade) and "CNI-DN-" + 21 hex (portmap's DNAT), both cut at 28 characters.
POD_CHAIN = re.compile(r"\bCNI-(?:DN-[0-9a-f]{21}|[0-9a-f]{24})\b")


def cli(sock: Path, *args: str) -> Any:
    """`python -m integration.cri.client --socket SOCK ...`, its JSON answer."""
    proc = subprocess.run([str(VENV_PY), "-m", "integration.cri.client", "--socket", str(sock),
                           *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def http_get(node: Node, addr: str, port: int) -> str:
    proc = node.run("curl", "-sS", "--max-time", "3", f"http://{addr}:{port}/", check=False)
    return proc.stdout if proc.returncode == 0 else ""


def tbfs(node_netns: Netns, dev: str) -> list[dict[str, int]]:
    """The options of each tbf qdisc on dev (rate in bytes/s, burst in bytes)."""
    out = node_netns.run("tc", "-j", "qdisc", "show", "dev", dev).stdout
    return [q["options"] for q in json.loads(out or "[]") if q.get("kind") == "tbf"]


def tbf_rates(node_netns: Netns, dev: str) -> list[int]:
    return [q["rate"] for q in tbfs(node_netns, dev)]


def links_of_kind(node_netns: Netns, kind: str) -> list[dict[str, Any]]:
    return [link for link in node_netns.ip("-d", "link", "show")
            if link.get("linkinfo", {}).get("info_kind") == kind]


def firewall(node: Node) -> list[str]:
    """The node's nftables ruleset and iptables (v4, v6) dumps, line by line."""
    dumps = [node.run("nft", "list", "ruleset").stdout]
    dumps += [node.run(tool, check=False).stdout for tool in ("iptables-save", "ip6tables-save")]
    return [line for text in dumps for line in text.splitlines()]


def rules_naming(node: Node, *words: str) -> list[str]:
    return [line for line in firewall(node) if any(w in line for w in words)]


@dataclass
class CRINode:
    """A node whose runtime serves CRI on cni bin/conf dirs; state is its /var/lib/cni."""

    netns: Netns
    node: Node
    ctrd: Any  # clients.CRIContainerd or crionode.CRIO: its CRI .sock and pod .netns_dir
    cri: Any  # cri.client.CRIClient
    state: Path
    cgroup: str
    daemon: PycniDaemon | None


def node_addresses(node_netns: Netns) -> None:
    """The node's own addresses (NODE_ADDR, NODE_ADDR6), on its lo."""
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR}/32", "dev", "lo")
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR6}/128", "dev", "lo", "nodad")


# What containerd never writes once there: content blobs and the unpacked (committed) layers,
# only ever overlayfs lowerdirs. Its bolt databases, beside them, are written in place.
IMMUTABLE = ("io.containerd.content.v1.content/blobs",
             "io.containerd.snapshotter.v1.overlayfs/snapshots")


def imported_root(work: Path, images: list[Path]) -> Path:
    """A containerd root holding `images` (CRI's namespace, unpacked for overlayfs), imported
    once by a containerd of its own on a throwaway node, then stopped: cri_node(seed=) starts
    each node's containerd on a copy of it instead of importing them again (pycni's image, a
    200 MiB layer, takes minutes to digest and unpack under the VM's TCG)."""
    class SeedContainerd(Containerd):
        namespace = CRIContainerd.namespace

    for d in ("bin", "conf"):
        (work / d).mkdir(parents=True, exist_ok=True)
    ns = new_netns("pycni-seed")
    node = Node(ns.name, bin_dir=work / "bin", conf_dir=work / "conf", state_dir=work / "cni")
    with cleanup(node.stop, lambda: delete_netns(ns)):
        ctrd = SeedContainerd(node, work / "containerd")
        with cleanup(ctrd.stop):
            for image in images:
                ctrd.ctr("images", "import", str(image), timeout=900)
    return work / "containerd" / "root"


def seeded_root(seed: Path, root: Path) -> None:
    """root (a containerd's, not started yet) as a copy of imported_root's: hard links for
    what containerd never writes (IMMUTABLE), real copies of everything else, so that each
    node's containerd has its own databases."""
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--link", str(seed), str(root)], check=True, timeout=600)
    for top, dirs, files in os.walk(root):
        rel = Path(top).relative_to(root)
        dirs[:] = [d for d in dirs if str(rel / d) not in IMMUTABLE]
        for name in files:
            path = Path(top) / name
            if path.is_file() and not path.is_symlink():
                copy = path.with_name(f"{name}.copy")
                shutil.copy2(path, copy)
                copy.replace(path)


@contextlib.contextmanager
def cri_node(node_netns: Netns, tmp_path: Path, *, bin_dir: Path, conf_dir: Path,
             images: list[Path], daemon: bool, pycni: Path | None = None,
             env: dict[str, str] | None = None,
             conf_template: Path | None = None, seed: Path | None = None) -> Iterator[CRINode]:
    """The node (with NODE_ADDR, NODE_ADDR6 on its lo), containerd with CRI on bin_dir and
    conf_dir (with `pycni daemon` on and in containerd's environment if asked: the checkout's,
    or the given `pycni` executable's, an installed wheel's; else `env` there), the images
    imported (or, with a seed, imported_root's, its root starting as a copy of that one) and
    seen by CRI; everything stopped at exit, pods removed through CRI first."""
    def containerd(node: Node, env: dict[str, str] | None) -> CRIContainerd:
        if seed:
            seeded_root(seed, tmp_path / "containerd" / "root")
        return CRIContainerd(node, tmp_path / "containerd", cni_bin=bin_dir, cni_conf=conf_dir,
                             sandbox_image=PAUSE_IMAGE, env=env, conf_template=conf_template)

    def load(ctrd: CRIContainerd) -> None:
        for image in images:
            # pycni's image is a 200 MiB layer: digesting and unpacking it took over 2 min
            # under the VM's TCG (make vm-test's daemonset step)
            ctrd.ctr("images", "import", str(image), timeout=900)

    with runtime_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir, daemon=daemon,
                      start=containerd, load=load, runtime_name="containerd",
                      pycni=pycni, env=env) as n:
        yield n


@contextlib.contextmanager
def runtime_node(node_netns: Netns, tmp_path: Path, *, bin_dir: Path, conf_dir: Path,
                 daemon: bool, start: Callable[[Node, dict[str, str] | None], Any],
                 load: Callable[[Any], None], runtime_name: str,
                 pycni: Path | None = None,
                 env: dict[str, str] | None = None) -> Iterator[CRINode]:
    """The node with a CRI runtime that start(node, env) starts (env: the daemon's, for the
    runtime to pass on to the plugins) and load(runtime) gives its images, CRI's
    `runtime_name`; `pycni daemon` on if asked; everything stopped at exit (the runtime's stop
    removes its pods through CRI first)."""
    from cri.client import CRIClient

    node_addresses(node_netns)
    state = tmp_path / "var-lib-cni"  # the node's /var/lib/cni
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(node.stop), cgroup_parent() as cgroup:
        pycni_d = PycniDaemon(node, tmp_path / "daemon", pycni) if daemon else None
        with cleanup(*([pycni_d.stop] if pycni_d else [])):
            runtime = start(node, pycni_d.env if pycni_d else env)
            with cleanup(runtime.stop):
                load(runtime)
                with CRIClient(str(runtime.sock)) as cri:
                    info = cri.wait_ready()
                    assert info["runtime_name"] == runtime_name, info
                    cri.wait_image(PAUSE_IMAGE)
                    cri.wait_image(HTTPD)
                    yield CRINode(node_netns, node, runtime, cri, state, cgroup, pycni_d)


def run_web_pod(n: CRINode, conf: dict[str, Any], log_dir: Path) -> tuple[Any, list[str]]:
    """What kubelet does to start a pod with a hostPort and bandwidth limits: the pod and its
    IPs (one per range of the conflist, in its order: v4 first), each checked in its range."""
    from cri.client import PortMap

    log_dir.mkdir(parents=True, exist_ok=True)  # kubelet makes it (CRI-O's conmon needs it)
    pod = n.cri.run_pod(
        "web", port_mappings=[PortMap(HOST_PORT, 80)],
        annotations={"kubernetes.io/ingress-bandwidth": "1M",
                     "kubernetes.io/egress-bandwidth": "1M"},
        log_directory=str(log_dir), cgroup_parent=n.cgroup, dns_servers=["10.96.0.10"])
    n.cri.create_start(pod, "httpd", HTTPD, ["/bin/httpd", "-f", "-p", "80", "-h", "/www"])
    ip, more = n.cri.pod_ip(pod.id)
    ips = [ip, *more]
    subnets = [ipaddress.ip_network(r[0]["subnet"]) for r in conf["plugins"][0]["ipam"]["ranges"]]
    assert [ipaddress.ip_address(a) in net for a, net in zip(ips, subnets, strict=True)] == \
        [True] * len(subnets), (ips, subnets)
    return pod, ips


def host_port_addrs(ips: list[str]) -> tuple[str, ...]:
    """Where the hostPort answers from the node: its address(es) and 127.0.0.1."""
    return (NODE_ADDR, "127.0.0.1", *([f"[{NODE_ADDR6}]"] if len(ips) > 1 else []))


def wait_host_port(n: CRINode, ips: list[str]) -> None:
    for addr in host_port_addrs(ips):
        body = wait_for(f"{addr}:{HOST_PORT} to answer",
                        lambda addr=addr: http_get(n.node, addr, HOST_PORT),
                        timeout=30, interval=0.5)
        assert body == BODY


def cache_path(n: CRINode, network: str, pod_id: str) -> Path:
    """libcni's result cache entry of the pod's eth0, in the node's /var/lib/cni."""
    return n.state / "results" / f"{network}-{pod_id}-eth0"


def shared_leftovers(n: CRINode, network: str, pod_id: str) -> list[str]:
    """What a removed pod may leave of the names both pycni and the reference use: veths and
    `bwp` ifbs, host-local reservations, libcni cache entries, tc qdiscs, the pod netns.
    Empty means clean."""
    out = leftovers(n.netns.ip, n.state, network, [pod_id])
    qdiscs = json.loads(n.netns.run("tc", "-j", "qdisc", "show").stdout)
    out += [f"qdisc {q['kind']} {q['handle']} on {q['dev']}" for q in qdiscs
            if q["kind"] in ("tbf", "ingress")]
    if n.ctrd.netns_dir.exists():
        out += [f"netns {p.name}" for p in n.ctrd.netns_dir.iterdir()]
    return out


def node_runner(n: CRINode, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Our runner (`pycni ...`, cnitool's environment) on the node, its /var/lib/cni cache."""
    return n.node.run(str(VENV_PY), "-m", "cni.cli", *args, check=False, env=env, cwd=ROOT)


def runner_check(n: CRINode, network: str, pod_id: str, *, bin_dir: Path, conf_dir: Path,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """CHECK of the pod's attachment as libcni would (CRI has no CHECK call): the cached
    capability and CNI args, the pod's netns, the plugins now in bin_dir."""
    entry = json.loads(cache_path(n, network, pod_id).read_text())
    [netns] = n.ctrd.netns_dir.iterdir()  # libcni 1.1's cache has no netns; the node's pod
    env = {"NETCONFPATH": str(conf_dir), "CNI_PATH": str(bin_dir), "CNI_CONTAINERID": pod_id,
           "CAP_ARGS": json.dumps(entry["capabilityArgs"]),
           "CNI_ARGS": ";".join(f"{k}={v}" for k, v in entry.get("cniArgs", [])), **(env or {})}
    return node_runner(n, "check", network, str(netns), env=env)
