"""The CRI pod in `make bench`: what kubelet waits for, side by side.

One throwaway node per side (integration/clients.py: its own netns and mount ns, a private
containerd 1.6 with CRI on, the pause image imported), the same chain (bridge + host-local,
portmap, bandwidth; containerd adds loopback), and pods that carry a hostPort and the bandwidth
annotations. Per pod: RunPodSandbox (netns, pause container, CNI ADD), then
StopPodSandbox + RemovePodSandbox (CNI DEL, and 1.6's second DEL with an empty netns), timed
from the client, the sides interleaved. Afterwards each node must hold nothing of any pod.

The same through CRI-O 1.33 (integration/crionode.py; bench_crio): pycni with its daemon, pycni's
forwarder (`pycni install --forwarder`, a daemon too) and the reference v1.9.1
(../shared/reference/bin), all on the nftables backends. CRI-O runs ADD
then CHECK over the chain at RunPodSandbox and one DEL at StopPodSandbox. Run alone:
`.venv/bin/python bench/cri_pods.py --crio-pods N` (root).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "integration"), str(ROOT / "tests")]

from clients import (  # noqa: E402
    PAUSE_CMD,
    PAUSE_IMAGE,
    CRIContainerd,
    Node,
    PycniDaemon,
    build_image,
    cgroup_parent,
    cri_conflist,
    install,
    leftovers,
    missing_tools,
)

REFERENCE = Path("/usr/lib/cni")
TOOLS = ("containerd", "ctr", "runc", "buildah", "nsenter", "unshare", "iptables")
ANNOTATIONS = {"kubernetes.io/ingress-bandwidth": "100M", "kubernetes.io/egress-bandwidth": "100M"}
RUN, STOP = "CRI RunPodSandbox", "CRI StopPodSandbox+RemovePodSandbox"
CRIO_RUN, CRIO_STOP = "CRI-O RunPodSandbox", "CRI-O StopPodSandbox+RemovePodSandbox"
V19 = "reference v1.9.1"  # bench/run.py's names of the sides
FWD = "pycni+forwarder"  # pycni's forwarder in the bin dir, a daemon behind it
Add = Callable[[str, str, float], None]


@dataclass
class CRINode:
    """One side: a node netns, containerd with CRI, its client; pycni's daemon if asked."""

    name: str
    netns: str
    node: Node
    ctrd: Any  # CRIContainerd, or crionode.CRIO
    state: Path
    network: str
    daemon: PycniDaemon | None = None
    client: Any = None
    pods: list[str] = field(default_factory=list)

    def stop(self) -> None:
        for stop in (getattr(self.client, "close", None), getattr(self.ctrd, "stop", None),
                     self.daemon.stop if self.daemon else None, self.node.stop):
            try:
                if stop:
                    stop()
            except Exception as e:  # noqa: BLE001 - tear every side down
                print(f"bench cri: stopping {self.name}: {e}", file=sys.stderr)
        subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)


def start_node(name: str, tmp: Path, pause: Path, daemon: bool, no_daemon_socket: bool) -> \
        CRINode:
    reference = name == "reference"
    conf = cri_conflist(reference=reference)

    def runtime(node: Node, work: Path, bin_dir: Path, conf_dir: Path,
                env: dict[str, str] | None) -> Any:
        ctrd = CRIContainerd(node, work / "containerd", cni_bin=bin_dir, cni_conf=conf_dir,
                             sandbox_image=PAUSE_IMAGE, env=env)
        ctrd.ctr("images", "import", str(pause))
        return ctrd

    return _start(name, tmp, conf, REFERENCE if reference else None, runtime, daemon,
                  no_daemon_socket)


def start_crio_node(name: str, tmp: Path, pause: Path) -> CRINode:
    """A CRI-O node: pycni with its daemon (and its forwarder: name FWD), or the reference
    v1.9.1 (name V19)."""
    from crionode import CRIO, SHARED_BIN

    conf = cri_conflist()
    conf["plugins"][0]["ipMasqBackend"] = "nftables"  # v1.9.1 and pycni alike

    def runtime(node: Node, work: Path, bin_dir: Path, conf_dir: Path,
                env: dict[str, str] | None) -> Any:
        crio = CRIO(node, work / "crio", cni_bin=bin_dir, cni_conf=conf_dir, env=env)
        try:
            crio.load_images([pause])
        except Exception:
            crio.stop()
            raise
        return crio

    return _start(f"crio {name}", tmp, conf, SHARED_BIN if name == V19 else None, runtime,
                  daemon=name != V19, no_daemon_socket=False, shown=name)


def _start(name: str, tmp: Path, conf: dict[str, Any], reference: Path | None, runtime,
           daemon: bool, no_daemon_socket: bool, shown: str | None = None) -> CRINode:
    """The node of one side: its netns, the plugins (`reference`'s dir, or pycni installed:
    with --forwarder for the FWD side), pycni's daemon if asked, the CRI runtime `runtime`
    starts, the client ready."""
    from cri.client import CRIClient

    work = tmp / name.replace(" ", "_").replace("(", "").replace(")", "").replace("+", "_")
    if reference is not None:
        bin_dir, conf_dir = reference, work / "net.d"
        conf_dir.mkdir(parents=True)
        (conf_dir / "10-pycni.conflist").write_text(json.dumps(conf))
    else:
        bin_dir, conf_dir = install(work / "cni", conf, forwarder=(shown or name) == FWD)
    netns = f"bench-cri-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    state = work / "var-lib-cni"
    node = Node(netns, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    d = PycniDaemon(node, work / "daemon") if daemon else None
    env = d.env if d else ({"PYCNI_SOCKET": str(work / "no-daemon.sock")}
                           if no_daemon_socket else None)
    side = CRINode(shown or name, netns, node, None, state, conf["name"], d)
    try:
        side.ctrd = runtime(node, work, bin_dir, conf_dir, env)
        side.client = CRIClient(str(side.ctrd.sock))
        side.client.wait_ready()
        side.client.wait_image(PAUSE_IMAGE)
    except Exception:
        side.stop()
        raise
    return side


def one_pod(side: CRINode, index: int, cgroup: str, add: Add | None,
            error: Callable[[str], None], rows: tuple[str, str] = (RUN, STOP)) -> None:
    """RunPodSandbox, then StopPodSandbox + RemovePodSandbox; add=None is a warm-up; rows are
    the two metrics' names (containerd's by default)."""
    from cri.client import PortMap

    client = side.client
    start = time.perf_counter()
    try:
        pod = client.run_pod(f"bench-{index}", port_mappings=[PortMap(8080, 80)],
                             annotations=ANNOTATIONS, cgroup_parent=cgroup)
    except Exception as e:  # noqa: BLE001 - a failure is a figure too
        error(f"[{side.name}] RunPodSandbox: {e}")
        return
    run_ms = (time.perf_counter() - start) * 1000
    side.pods.append(pod.id)
    ip, _ = client.pod_ip(pod.id)  # untimed: kubelet asks once the sandbox is up
    if not ip:
        error(f"[{side.name}] pod {pod.id[:12]} has no IP")
    start = time.perf_counter()
    try:
        client.stop_remove(pod.id)
    except Exception as e:  # noqa: BLE001
        error(f"[{side.name}] StopPodSandbox/RemovePodSandbox: {e}")
        return
    stop_ms = (time.perf_counter() - start) * 1000
    if add:
        add(rows[0], side.name, run_ms)
        add(rows[1], side.name, stop_ms)


def count_leftovers(side: CRINode, metric: str, add: Add, error: Callable[[str], None]) -> None:
    """The node's leftovers of every pod: veths, ifbs, reservations, cache files, rules naming
    a pod."""
    ip_json = lambda *a, n=side.node: json.loads(  # noqa: E731
        n.run("ip", "-j", *a).stdout or "[]")
    left = leftovers(ip_json, side.state, side.network, side.pods)
    rules = side.node.run("nft", "list", "ruleset").stdout + side.node.run(
        "iptables-save", check=False).stdout
    left += [f"rule naming {p[:12]}" for p in side.pods if p in rules]
    add(metric, side.name, len(left))
    for item in left[:10]:
        error(f"[{side.name}] {metric}: {item}")


def bench_cri(names: list[str], pods: int, pods_no_daemon: int, add: Add,
              error: Callable[[str], None]) -> None:
    """`pods` pods one at a time per side (pods_no_daemon for the side without the daemon),
    rotating which side goes first; then each node's leftovers (veths, ifbs, reservations,
    cache files, and rules naming a pod)."""
    if missing := missing_tools(*TOOLS):
        error(f"CRI pods skipped: {', '.join(missing)} not installed")
        return
    _bench_sides(
        "CRI pods", names,
        lambda name, tmp, pause: start_node(name, tmp, pause,
                                            daemon=name in ("pycni+daemon", FWD),
                                            no_daemon_socket="no daemon" in name),
        lambda name: pods_no_daemon if "no daemon" in name else pods, (RUN, STOP), add, error)


def bench_crio(names: list[str], pods: int, add: Add, error: Callable[[str], None]) -> None:
    """`pods` pods one at a time per side through CRI-O, the sides interleaved (rotating which
    goes first), after a warm-up pod each; then each node's leftovers."""
    from crionode import TOOLS as CRIO_TOOLS
    from crionode import missing_crio

    if missing := missing_tools(*CRIO_TOOLS) + missing_crio():
        error(f"CRI-O pods skipped: {', '.join(missing)} missing")
        return
    _bench_sides("CRI-O pods", names, start_crio_node, lambda name: pods,
                 (CRIO_RUN, CRIO_STOP), add, error)


def _bench_sides(what: str, names: list[str], start: Callable[[str, Path, Path], CRINode],
                 pods_of: Callable[[str], int], rows: tuple[str, str], add: Add,
                 error: Callable[[str], None]) -> None:
    """A node per side (start(name, tmp, pause image)), a warm-up pod each, pods_of(side) pods
    one at a time, the sides interleaved (rotating which goes first); then the leftovers."""
    tmp = Path(tempfile.mkdtemp(prefix="pycni-bench-cri-"))
    with cgroup_parent() as cgroup:  # removed once the pods are gone
        sides: list[CRINode] = []
        try:
            pause = build_image(tmp / "pause", PAUSE_IMAGE, cmd=PAUSE_CMD)
            for name in names:
                sides.append(start(name, tmp, pause))
            for side in sides:
                one_pod(side, 0, cgroup, None, error)
            for i in range(max(pods_of(side.name) for side in sides)):
                k = i % len(sides)
                for side in sides[k:] + sides[:k]:
                    if i < pods_of(side.name):
                        one_pod(side, i + 1, cgroup, add, error, rows)
            for side in sides:
                count_leftovers(side, f"{what} leftovers after remove", add, error)
        except Exception as e:  # noqa: BLE001 - the rest of the bench goes on
            error(f"{what}: {type(e).__name__}: {e}")
        finally:
            for side in sides:
                side.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """The CRI-O part alone: medians and pycni's ratio to v1.9.1."""
    import argparse
    import statistics

    from world import enter_private_mounts

    parser = argparse.ArgumentParser(description="CRI-O pods, pycni vs the reference v1.9.1")
    parser.add_argument("--forwarder", action="store_true", help=f"a {FWD} side too")
    parser.add_argument("--crio-pods", type=int, default=5)
    args = parser.parse_args()
    enter_private_mounts()
    values: dict[str, dict[str, list[float]]] = {}
    errors: list[str] = []
    bench_crio([V19, "pycni+daemon", *([FWD] if args.forwarder else [])], args.crio_pods,
               lambda m, side, v: values.setdefault(m, {}).setdefault(side, []).append(v),
               errors.append)
    for metric, by in values.items():
        med = {side: statistics.median(v) for side, v in by.items()}
        shown = ", ".join(f"{side} {m:.1f}" for side, m in med.items())
        ratio = "".join(f"; {side} ratio {med[side] / med[V19]:.2f}x"
                        for side in ("pycni+daemon", FWD) if med.get(V19) and side in med)
        print(f"{metric}: {shown}{ratio}")
    for e in errors:
        print(f"error: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
