"""Real CNI clients for the integration tests: a throwaway "node", a private containerd, podman
with the CNI backend, an offline busybox image, and `pycni install` into temp dirs.

A node is a long-lived process (`integration/node.sh ... -- sleep infinity`) holding a network
namespace (the test's throwaway host netns) and a private mount namespace in which /opt/cni/bin,
/etc/cni/net.d and /var/lib/cni are the test's temp dirs. Every client command joins it with
`nsenter -t PID -m -n`, so bridges and rules land in the throwaway netns, network namespaces that
podman bind-mounts survive between its invocations, and nothing reaches the machine's own dirs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE_SH = ROOT / "integration" / "node.sh"
VENV_PY = ROOT / ".venv" / "bin" / "python"
BUSYBOX = Path("/bin/busybox")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
       "PYCNI_SYSTEMD": "0"}  # scratch installs never touch the host's systemd units
# The busybox applets the test containers use (a static busybox needs nothing else).
APPLETS = ("sh", "ip", "ping", "httpd", "sleep", "cat", "ls", "nc", "wget", "hostname", "true")


def missing_tools(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t, path=ENV["PATH"]) is None]


@functools.cache
def _netns_ok() -> bool:
    from cnitest import can_use_netns

    return can_use_netns()


def need(*tools: str) -> None:
    """Skip unless root with netns support and the tools are installed (a missing tool fails
    under make test: rootskips). (Lives here, not in conftest.py: test modules must never
    import a "conftest", tests/ has several.)"""
    import pytest
    from rootskips import missing

    if os.geteuid() != 0 or not _netns_ok():
        pytest.skip("needs root and network namespaces (run via make test)")
    if absent := missing_tools(*tools):
        missing(f"{', '.join(absent)} (scripts/setup.sh's APT_TEST installs them)")


def wait_for(what: str, probe, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll probe() until it returns something truthy; bounded, names what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---- pycni install -------------------------------------------------------------------------


def pycni(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(VENV_PY), "-m", "cni.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"pycni {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc


def install(dest: Path, conflist: dict[str, Any], cni_version: str | None = None,
            forwarder: bool = False) -> tuple[Path, Path]:
    """`pycni install` into dest/bin and dest/net.d, as a node admin would (with --forwarder:
    the plugin names linked to `make forwarder`'s binary); returns both dirs."""
    src = dest / f"{conflist['name']}.conflist"
    dest.mkdir(parents=True, exist_ok=True)
    src.write_text(json.dumps(conflist, indent=2))
    bin_dir, conf_dir = dest / "bin", dest / "net.d"
    args = ["install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
            "--conflist", str(src)]
    if cni_version:
        args += ["--cni-version", cni_version]
    if forwarder:
        args.append("--forwarder")
    pycni(*args)
    src.unlink()
    return bin_dir, conf_dir


# ---- the node -------------------------------------------------------------------------------


class Node:
    """A process holding the throwaway host netns and a mount namespace with our CNI dirs."""

    def __init__(self, netns: str, *, bin_dir: Path, conf_dir: Path, state_dir: Path) -> None:
        self.netns, self.state_dir = netns, state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(NODE_SH), "--netns", netns, "--cni-bin", str(bin_dir), "--cni-conf",
             str(conf_dir), "--cni-state", str(state_dir), "--", "sleep", "infinity"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for("the node's namespaces", self._ready, timeout=20)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"node.sh exited: {self.proc.stderr.read().decode()}")
        try:
            return Path(f"/proc/{self.proc.pid}/comm").read_text().strip() == "sleep"
        except OSError:
            return False

    def argv(self, *cmd: str) -> list[str]:
        return ["nsenter", "-t", str(self.proc.pid), "-m", "-n", "--", *cmd]

    def run(self, *cmd: str, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(*cmd), capture_output=True, text=True, timeout=timeout,
                              env={**ENV, **(env or {})}, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *cmd: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*cmd), env={**ENV, **(env or {})}, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()


def terminate(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def kill_processes_mentioning(marker: str) -> None:
    """SIGKILL processes whose command line holds marker (a temp path only our test used:
    containerd shims, conmon), so nothing of a test outlives it."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


# ---- images ---------------------------------------------------------------------------------


def busybox_rootfs(dest: Path, www: str = "hello from pycni\n") -> Path:
    """A root filesystem of Debian's busybox-static: the binary, applet links, /www."""
    for d in ("bin", "www", "etc", "proc", "sys", "dev", "tmp"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    for applet in APPLETS:
        (dest / "bin" / applet).symlink_to("busybox")
    (dest / "www" / "index.html").write_text(www)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (dest / "etc" / "group").write_text("root:x:0:\n")
    return dest


def build_image(work: Path, ref: str = "localhost/pycni-busybox:test",
                cmd: tuple[str, ...] = ("/bin/sh",)) -> Path:
    """An OCI archive built offline with `buildah from scratch` (storage in work/, no pulls);
    cmd is the image's default command (a "pause" image is busybox sleeping forever)."""
    rootfs = busybox_rootfs(work / "rootfs")
    store = ["--root", str(work / "storage"), "--runroot", str(work / "runroot"),
             "--storage-driver", "vfs"]

    def buildah(*args: str) -> str:
        proc = subprocess.run(["buildah", *store, *args], capture_output=True, text=True,
                              timeout=300, env={**ENV, "BUILDAH_ISOLATION": "chroot"})
        if proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {proc.stderr}")
        return proc.stdout.strip()

    ctr = buildah("from", "scratch")
    try:
        buildah("copy", ctr, f"{rootfs}/", "/")
        buildah("config", "--cmd", json.dumps(list(cmd)), "--workingdir", "/", ctr)
        archive = work / "busybox.oci.tar"
        buildah("commit", "--format", "oci", "--quiet", ctr, f"oci-archive:{archive}:{ref}")
    finally:
        subprocess.run(["buildah", *store, "rm", ctr], capture_output=True, timeout=60)
    return archive


# ---- containerd -----------------------------------------------------------------------------


class Containerd:
    """A private containerd (own root, state, sockets; CRI off) running on the node."""

    namespace = "default"  # where ctr imports images

    def __init__(self, node: Node, work: Path, env: dict[str, str] | None = None) -> None:
        self.node, self.work = node, work
        work.mkdir(parents=True, exist_ok=True)
        # Unix socket paths are short (108 bytes): a short dir of its own, not under tmp_path.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="pycni-ctrd-", dir="/tmp"))
        self.sock = self.sock_dir / "containerd.sock"
        self.log = work / "containerd.log"
        config = work / "config.toml"
        config.write_text(self.config_toml())
        with open(self.log, "wb") as log:
            self.proc = node.popen("containerd", "--config", str(config), stdout=log,
                                   stderr=subprocess.STDOUT, env=env)
        wait_for("containerd's socket", self._up, timeout=30, interval=0.2)

    def config_toml(self) -> str:
        return (
            "version = 2\n"
            f'root = "{self.work / "root"}"\nstate = "{self.work / "state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.sock}"\n'
            f'[ttrpc]\n  address = "{self.sock}.ttrpc"\n'
            # containerd's "opt" plugin would make /opt/containerd otherwise.
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{self.work / "opt"}"\n')

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"containerd exited:\n{self.log.read_text()[-3000:]}")
        return self.sock.exists() and self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> \
            subprocess.CompletedProcess:
        return self.node.run("ctr", "--address", str(self.sock), "--namespace",
                             self.namespace, *args, check=check, timeout=timeout)

    def stop(self) -> None:
        self.before_stop()
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
            self.ctr("tasks", "rm", "-f", task, check=False, timeout=30)
        terminate(self.proc, grace=15)
        kill_processes_mentioning(str(self.sock))  # shims outlive containerd by design
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    def before_stop(self) -> None:
        """What a subclass tears down while containerd still runs."""


PAUSE_IMAGE = "localhost/pycni-pause:test"  # CRI's sandbox_image: busybox sleeping forever
# The sandbox image exits on SIGTERM as the real pause does (as PID 1, `sleep` alone ignores it:
# a node's shutdown waits out systemd's 90 s stop timeout of the pod's scope).
PAUSE_CMD = ("/bin/sh", "-c", 'trap "exit 0" TERM INT; sleep 2147483647 & wait')


def cri_conflist(reference: bool = False, name: str = "10-pycni.conflist") -> dict[str, Any]:
    """The pod chain a CRI node runs: conf/NAME at 1.0.0 (containerd 1.6's libcni knows no
    later), without loopback (CRI adds its own). The shipped conflists list no default routes in
    ipam: isDefaultGateway adds them, and the reference bridge fails ADD on a duplicate ("failed
    to add route ... file exists"). For the reference, without `backend`: theirs is iptables."""
    conf = json.loads((ROOT / "conf" / name).read_text())
    conf["cniVersion"] = "1.0.0"
    conf["plugins"] = [p for p in conf["plugins"] if p["type"] != "loopback"]
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["isDefaultGateway"], bridge
    assert "routes" not in bridge["ipam"], bridge  # a drop-in for the reference: see above
    if reference:
        for p in conf["plugins"]:
            p.pop("backend", None)
            p.pop("ipMasqBackend", None)
    return conf


class CRIContainerd(Containerd):
    """A private containerd with its CRI plugin on, as a kubelet node runs it: CNI from bin_dir
    and conf_dir (the runtime execs the plugins with its own environment, so env reaches them:
    PYCNI_SOCKET), the pod netns under its own state dir, no pulls (sandbox_image must be
    imported), cgroupfs driver, no AppArmor profile loaded into the machine's kernel, the
    OOM score never below containerd's own; with conf_template, CRI's CNI conf_template
    (rendered into conf_dir once UpdateRuntimeConfig brings the pod CIDRs)."""

    namespace = "k8s.io"  # CRI's images and containers live there

    def __init__(self, node: Node, work: Path, *, cni_bin: Path, cni_conf: Path,
                 sandbox_image: str, env: dict[str, str] | None = None,
                 conf_template: Path | None = None) -> None:
        self.cni_bin, self.cni_conf, self.sandbox_image = cni_bin, cni_conf, sandbox_image
        self.conf_template = conf_template
        super().__init__(node, work, env)

    def config_toml(self) -> str:
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        return (
            "version = 2\n"
            f'root = "{self.work / "root"}"\nstate = "{self.work / "state"}"\n'
            f'[grpc]\n  address = "{self.sock}"\n'
            f'[ttrpc]\n  address = "{self.sock}.ttrpc"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{self.work / "opt"}"\n'
            f"{cri}\n"
            f'  sandbox_image = "{self.sandbox_image}"\n'
            "  netns_mounts_under_state_dir = true\n"
            "  disable_apparmor = true\n"
            # the sandbox asks for oom_score_adj -998; a container host may forbid going below
            # containerd's own (EACCES kills runc create): clamp to it, as rootless nodes do
            "  restrict_oom_score_adj = true\n"
            '  stream_server_address = "127.0.0.1"\n'
            '  stream_server_port = "0"\n'
            f"  [{cri[1:-1]}.cni]\n"
            f'    bin_dir = "{self.cni_bin}"\n'
            f'    conf_dir = "{self.cni_conf}"\n'
            "    max_conf_num = 1\n"
            + (f'    conf_template = "{self.conf_template}"\n' if self.conf_template else "")
            + f"  [{cri[1:-1]}.containerd]\n"
            '    snapshotter = "overlayfs"\n'
            '    default_runtime_name = "runc"\n'
            f"    [{cri[1:-1]}.containerd.runtimes.runc]\n"
            '      runtime_type = "io.containerd.runc.v2"\n'
            f"      [{cri[1:-1]}.containerd.runtimes.runc.options]\n"
            "        SystemdCgroup = false\n")

    @property
    def netns_dir(self) -> Path:
        """Where CRI pins pod network namespaces (netns_mounts_under_state_dir)."""
        return self.work / "state" / "io.containerd.grpc.v1.cri" / "netns"

    def before_stop(self) -> None:
        """Any pod a failed test left: stopped and removed through CRI (runs the CNI DEL)."""
        from cri.client import CRIClient

        with contextlib.suppress(Exception), CRIClient(str(self.sock), timeout=60) as client:
            for pod_id in client.pod_ids():
                with contextlib.suppress(Exception):
                    client.stop_remove(pod_id)


@contextlib.contextmanager
def cgroup_parent() -> Iterator[str]:
    """A pod cgroup parent of our own, as kubelet passes one (without one CRI puts pods under
    /k8s.io in every hierarchy); removed, once empty, afterwards."""
    name = f"pycni-cri-{secrets.token_hex(4)}"
    try:
        yield f"/{name}"
    finally:
        base = Path("/sys/fs/cgroup")  # v2: base/name; v1 and hybrid: base/<hierarchy>/name
        for d in [base / name] + [top / name for top in base.iterdir() if top.is_dir()]:
            if d.is_dir():
                for sub, _, _ in sorted(os.walk(d), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(sub)


class PycniDaemon:
    """`pycni daemon` on the node, on a socket of its own (-v: it logs each request served):
    the checkout's, or the `pycni` executable given (an installed wheel's)."""

    def __init__(self, node: Node, work: Path, pycni: Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pycni-d-", dir="/tmp"))  # short socket path
        self.socket = self.dir / "run" / "pycni.sock"
        self.log = work / "daemon.log"
        work.mkdir(parents=True, exist_ok=True)
        argv = [str(pycni), "daemon"] if pycni else [str(VENV_PY), "-m", "cni.fast.daemon"]
        with open(self.log, "wb") as log:
            self.proc = node.popen(*argv, "--socket", str(self.socket), "-v", stdout=log,
                                   stderr=subprocess.STDOUT, cwd=work if pycni else ROOT)
        wait_for("the pycni daemon to listen", self._up, timeout=120, interval=0.1)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"pycni daemon exited:\n{self.log.read_text()[-3000:]}")
        return "listening" in self.log.read_text()

    @property
    def env(self) -> dict[str, str]:
        """For the runtime's environment (libcni passes it on to the plugins): its requests
        go through this daemon only, the shims' in-process fallback is off."""
        return {"PYCNI_SOCKET": str(self.socket), "PYCNI_SHIM_FALLBACK": "0"}

    def served(self) -> int:
        return self.log.read_text().count(" served ")

    def answered(self) -> int:
        """The daemon's own count of the requests it answered (cni.fast.status)."""
        from cni.fast import status

        figures = status.query(str(self.socket), timeout=30)
        assert figures is not None, f"the daemon does not answer:\n{self.log.read_text()}"
        return figures["answered"]

    def stop(self) -> None:
        terminate(self.proc, grace=30)
        kill_processes_mentioning(str(self.socket))  # forked children carry its argv
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- podman ---------------------------------------------------------------------------------


class Podman:
    """podman with the CNI backend, its storage and config in work/, on the node."""

    def __init__(self, node: Node, work: Path, bin_dir: Path, conf_dir: Path) -> None:
        self.node, self.work = node, work
        work.mkdir(parents=True, exist_ok=True)
        # podman wants runroot under 50 chars (it holds sockets): a short dir of its own.
        self.short = Path(tempfile.mkdtemp(prefix="pycni-pm-", dir="/tmp"))
        runroot = self.short / "run"
        nofile = _ulimit(resource.RLIMIT_NOFILE, 1024)
        nproc = _ulimit(resource.RLIMIT_NPROC, 1024)
        self.conf = work / "containers.conf"
        self.conf.write_text(
            "[containers]\n"
            # podman's defaults ask for more than this machine allows (runc: EPERM on rlimits).
            f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
            "[network]\n"
            'network_backend = "cni"\n'
            f'cni_plugin_dirs = ["{bin_dir}"]\n'
            f'network_config_dir = "{conf_dir}"\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{work / "events.log"}"\n'
            f'tmp_dir = "{self.short / "tmp"}"\n'
            f'static_dir = "{work / "static"}"\n'
            f'volume_path = "{work / "volumes"}"\n')
        self.storage = ["--root", str(work / "storage"), "--runroot", str(runroot),
                        "--storage-driver", "vfs"]
        self.env = {"CONTAINERS_CONF": str(self.conf),
                    "CONTAINERS_STORAGE_CONF": str(work / "storage.conf"),
                    "CONTAINERS_REGISTRIES_CONF": str(work / "registries.conf")}
        (work / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\nrunroot = "{runroot}"\n'
            f'graphroot = "{work / "storage"}"\n')
        (work / "registries.conf").write_text("unqualified-search-registries = []\n")

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> \
            subprocess.CompletedProcess:
        return self.node.run("podman", *self.storage, *args, check=check, timeout=timeout,
                             env=self.env)

    def stop(self) -> None:
        self.run("rm", "--all", "--force", "--time", "0", check=False, timeout=60)
        kill_processes_mentioning(str(self.work))
        kill_processes_mentioning(str(self.short))
        shutil.rmtree(self.short, ignore_errors=True)


def _ulimit(which: int, want: int) -> int:
    soft, hard = resource.getrlimit(which)
    limits = [x for x in (soft, hard, want) if x != resource.RLIM_INFINITY]
    return min(limits)


# ---- leftovers ------------------------------------------------------------------------------


def leftovers(host_ip_json, state_dir: Path, network: str, ids: list[str]) -> list[str]:
    """What an attachment may leave behind on the node: veths, reservations, cached results,
    nft rules naming the container. Empty means clean."""
    out = []
    links = host_ip_json("-d", "link", "show")
    out += [f"link {link['ifname']}" for link in links
            if link.get("linkinfo", {}).get("info_kind") in ("veth", "ifb")
            and not link["ifname"].startswith("ifb")]
    store = state_dir / "networks" / network
    if store.is_dir():
        out += [f"reservation {p.name}: {p.read_text()!r}" for p in store.iterdir()
                if p.name != "lock" and not p.name.startswith("last_reserved_ip")]
    results = state_dir / "results"
    if results.is_dir():
        out += [f"cache {p.name}" for p in results.iterdir()]
    return out


@contextlib.contextmanager
def cleanup(*stoppers) -> Iterator[None]:
    """Run every stopper at exit, in order, even when one fails."""
    try:
        yield
    finally:
        errors = []
        for stop in stoppers:
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - teardown must go on
                errors.append(e)
        if errors:
            raise errors[0]
