"""A kubelet-like CRI-O node for the CRI-O tests (test_crio.py, bench/cri_pods.py): CRI-O 1.33
from ../shared/reference/bin on the throwaway node of clients.Node (its own netns and mount ns),
set up as that dir's README says it runs on these machines: cgroupfs with conmon in the pod's
cgroup, a local pause image (nothing can be pulled), runc behind an oomScoreAdj clamp, every path
CRI-O writes (storage, sockets, state, logs, pod namespaces) a private dir of the test's.

crio_conf() is the whole crio.conf: the VM's CRI-O reads the same keys. The CNI part is only
[crio.network] network_dir / plugin_dirs; CRI-O passes its own environment to the plugins, so
PYCNI_SOCKET (the daemon's socket) reaches pycni's shims through CRI-O's environment.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from clients import (
    PAUSE_IMAGE,
    ROOT,
    Node,
    kill_processes_mentioning,
    terminate,
    wait_for,
)
from cnitest import Netns
from crinode import CRINode, runtime_node

SHARED_BIN = (ROOT / ".." / "shared" / "reference" / "bin").resolve()  # as bench/fullnode.py
CRIO_BIN = SHARED_BIN / "crio"
PINNS = SHARED_BIN / "pinns"
OOM_CLAMP = ROOT / "integration" / "runc-oom-clamp"
CONMON = Path("/usr/bin/conmon")
TOOLS = ("conmon", "runc", "buildah", "nsenter", "unshare", "curl", "tc", "nft")
PLUGINS = ("bridge", "host-local", "loopback", "portmap", "bandwidth")  # what a swap replaces


def missing_crio() -> list[str]:
    """What of ../shared/reference/bin the CRI-O tests need and is not there (a failure under
    `make test`, never a skip: CI has shared/ beside the checkout)."""
    return [str(p) for p in (CRIO_BIN, PINNS, *(SHARED_BIN / p for p in PLUGINS)) if not p.exists()]


def crio_conf(*, work: Path, short: Path, cni_bin: Path, cni_conf: Path,
              pause_image: str = PAUSE_IMAGE, runtime_path: Path = OOM_CLAMP,
              pinns: Path = PINNS, log_level: str = "info") -> str:
    """crio.conf for a node of CRI-O's own: `work` holds storage and state, `short` (a short
    path: unix sockets are 108 bytes at most) the sockets; CNI from cni_bin and cni_conf."""
    storage, run = work / "storage", short / "run"
    return f"""\
[crio]
root = "{storage / "root"}"
runroot = "{storage / "runroot"}"
storage_driver = "overlay"
log_dir = "{work / "pod-logs"}"
version_file = "{run / "version"}"
version_file_persist = "{work / "version"}"
clean_shutdown_file = "{work / "clean.shutdown"}"

[crio.api]
listen = "{short / "crio.sock"}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
selinux = false
apparmor_profile = "unconfined"
decryption_keys_path = "{work / "keys"}"
irqbalance_config_file = "{work / "irqbalance"}"
irqbalance_config_restore_file = ""
hooks_dir = ["{work / "hooks.d"}"]
cdi_spec_dirs = ["{work / "cdi"}"]
container_exits_dir = "{run / "exits"}"
container_attach_socket_dir = "{run}"
namespaces_dir = "{run / "ns"}"
pinns_path = "{pinns}"
drop_infra_ctr = true
log_level = "{log_level}"

[crio.runtime.runtimes.runc]
runtime_path = "{runtime_path}"
runtime_type = "oci"
runtime_root = "{run / "runc"}"
monitor_path = "{CONMON}"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{pause_image}"
pause_command = ""
signature_policy = "{work / "policy.json"}"
signature_policy_dir = "{work / "policies"}"

[crio.network]
network_dir = "{cni_conf}"
plugin_dirs = ["{cni_bin}"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""


class CRIO:
    """CRI-O on the node, on crio_conf(); env (e.g. the pycni daemon's) reaches the plugins."""

    def __init__(self, node: Node, work: Path, *, cni_bin: Path, cni_conf: Path,
                 env: dict[str, str] | None = None) -> None:
        self.node, self.work = node, work
        for d in ("hooks.d", "cdi", "keys", "policies", "pod-logs", "config.d"):
            (work / d).mkdir(parents=True, exist_ok=True)
        self.short = Path(tempfile.mkdtemp(prefix="pycni-crio-", dir="/tmp"))
        self.sock = self.short / "crio.sock"
        self.config = work / "crio.conf"
        self.config.write_text(crio_conf(work=work, short=self.short, cni_bin=cni_bin,
                                         cni_conf=cni_conf))
        (work / "policy.json").write_text(
            '{"default": [{"type": "insecureAcceptAnything"}]}\n')
        (work / "registries.conf").write_text("unqualified-search-registries = []\n")
        (work / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\nrunroot = "{work / "storage" / "runroot"}"\n'
            f'graphroot = "{work / "storage" / "root"}"\n')
        self.env = {**(env or {}),
                    "CONTAINERS_STORAGE_CONF": str(work / "storage.conf"),
                    "CONTAINERS_REGISTRIES_CONF": str(work / "registries.conf")}
        self.log = work / "crio.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def netns_dir(self) -> Path:
        """Where CRI-O (pinns) pins pod network namespaces."""
        return self.short / "run" / "ns" / "netns"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = self.node.popen(str(CRIO_BIN), "--config", str(self.config), "--config-dir",
                                        str(self.work / "config.d"), stdout=log,
                                        stderr=subprocess.STDOUT, env=self.env)
        wait_for("CRI-O's socket", self._up, timeout=60, interval=0.2)

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"crio exited:\n{self.log.read_text()[-3000:]}")
        return self.sock.exists()

    def restart(self) -> None:
        """SIGTERM and start again, as `systemctl restart crio`: pods and conmons live on."""
        assert self.proc is not None
        terminate(self.proc, grace=30)
        self.sock.unlink(missing_ok=True)
        self.start()

    def load_images(self, archives: list[Path]) -> None:
        """The OCI archives (clients.build_image's) into CRI-O's storage, with buildah on the
        node (its overlay mounts stay in the node's mount namespace)."""
        store = ["--root", str(self.work / "storage" / "root"), "--runroot",
                 str(self.work / "storage" / "runroot"), "--storage-driver", "overlay"]
        for archive in archives:
            self.node.run("buildah", *store, "pull", "--quiet", f"oci-archive:{archive}",
                          env={**self.env, "BUILDAH_ISOLATION": "chroot"}, timeout=300)

    def stop(self) -> None:
        """Any pod a failed test left removed through CRI (runs the CNI DEL), then CRI-O and
        every conmon and container process of this node gone."""
        from cri.client import CRIClient

        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception), CRIClient(str(self.sock), timeout=60) as client:
                for pod_id in client.pod_ids():
                    with contextlib.suppress(Exception):
                        client.stop_remove(pod_id)
            terminate(self.proc, grace=30)
        kill_processes_mentioning(str(self.short))  # conmon and runc carry our paths
        kill_processes_mentioning(str(self.work))
        shutil.rmtree(self.short, ignore_errors=True)


@contextlib.contextmanager
def crio_node(node_netns: Netns, tmp_path: Path, *, bin_dir: Path, conf_dir: Path,
              images: list[Path], daemon: bool) -> Iterator[CRINode]:
    """crinode.cri_node's node with CRI-O instead of containerd: CRI-O on bin_dir and conf_dir
    (with `pycni daemon` on and in CRI-O's environment if asked), the images in its storage."""
    def crio(node: Node, env: dict[str, str] | None) -> CRIO:
        return CRIO(node, tmp_path / "crio", cni_bin=bin_dir, cni_conf=conf_dir, env=env)

    with runtime_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir, daemon=daemon,
                      start=crio, load=lambda runtime: runtime.load_images(images),
                      runtime_name="cri-o") as n:
        yield n
