"""The bench's throwaway world, shared by run.py, fullnode.py and netlink_profile.py: a private
mount namespace, pycni's executables as `pycni install` writes them, a daemon started for the
run and its memory, a cgroup v2 whose CPU is every process ever in it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The newest reference (v1.9.1, nftables backends), built beside every checkout (README there)
REFERENCE_V19 = (ROOT / ".." / "shared" / "reference" / "bin").resolve()
CLONE_NEWNET = 0x40000000
VENV_PY = ROOT / ".venv" / "bin" / "python"


def enter_private_mounts(also: tuple[tuple[str, str], ...] = ()) -> None:
    """Re-exec in a private mount namespace with its own /run/netns (nothing can leak), and a
    fresh tmpfs on each (path, mode) of `also`."""
    if os.environ.get("PYCNI_BENCH_NS") != "1":
        if os.geteuid() != 0:
            raise SystemExit("bench: needs root (network namespaces)")
        os.environ["PYCNI_BENCH_NS"] = "1"
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                              sys.executable, *sys.argv])
    os.makedirs("/run/netns", exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "pycni-bench-netns", "/run/netns"], check=True)
    for path, mode in also:
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode={mode}", "pycni-bench", path],
                       check=True)


def become_spare_like() -> None:
    """This process as a daemon's spare is when a request comes (for in-process profiles of the
    verbs): in a throwaway network namespace of its own (lo up), everything a spare has imported
    and warmed, what that made frozen and collection off."""
    import gc

    from cni.fast import preload
    from cni.host import nsfd

    if nsfd.libc().unshare(nsfd.CLONE_NEWNET) != 0:
        raise SystemExit("unshare(CLONE_NEWNET) failed: run as root")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    preload.preimport()
    preload.warm_up()
    gc.collect()
    gc.freeze()
    gc.disable()


def install_steps(steps: dict[str, tuple[str, ...]], kept_socket: bool = False) -> dict[str, list]:
    """Each function of `steps` (module -> names) wrapped in place, for the in-process profiles:
    returns what they add up per request, label -> [CPU ms, calls, user ms], labels indented by
    nesting depth (clear it between requests). `kept_socket`: the spare's kept IPRoute's
    request methods too (netns.keep_home_socket first)."""
    import importlib
    import resource

    acc: dict[str, list] = {}
    depth = [0]

    def wrap(label, fn):
        def timed(*a, **k):
            depth[0] += 1
            t = time.process_time()
            u = resource.getrusage(resource.RUSAGE_SELF).ru_utime
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                slot = acc.setdefault("  " * depth[0] + label, [0.0, 0, 0.0])
                slot[0] += (time.process_time() - t) * 1e3
                slot[1] += 1
                slot[2] += (resource.getrusage(resource.RUSAGE_SELF).ru_utime - u) * 1e3
        return timed

    if kept_socket:
        from cni.host import netns

        kept = netns._kept[1] if netns._kept else None
        for n in ("get_netnsid", "nlm_request_batch", "nlm_request"):
            if kept is not None:
                setattr(kept, n, wrap(f"ipr.{n}", getattr(kept, n)))
    for mod, names in steps.items():
        m = importlib.import_module(mod)
        for n in names:
            if hasattr(m, n):
                setattr(m, n, wrap(f"{mod.split('.')[-1]}.{n}", getattr(m, n)))
    return acc


def our_bin(tmp: Path, forwarder: bool = False) -> tuple[Path, str]:
    """What `pycni install` writes (direct #! to the venv python), else the repo's bin/.
    forwarder: `pycni install --forwarder` into a dir of its own (the plugin names linked to
    the checkout's build/forwarder/pycni-forwarder, `make forwarder`'s)."""
    if forwarder:
        return forwarder_bin(tmp), "`pycni install --forwarder` (build/forwarder/pycni-forwarder)"
    try:
        from cni import install, registry

        d = tmp / "pycni-bin"
        d.mkdir()
        exe = d / "pycni-plugin"
        exe.write_bytes(install.render_multicall(install.venv_python(), install.ROOT))
        exe.chmod(0o755)
        for name in registry.NAMES:
            (d / name).symlink_to("pycni-plugin")
        return d, "installed copy (`#!<venv python> -IS`, as `pycni install` writes it)"
    except Exception as e:  # install's API moved: measure the repo's executables instead
        return ROOT / "bin", f"repo bin/ (sh trampoline; install copy failed: {e})"


def forwarder_bin(tmp: Path) -> Path:
    """tmp/pycni-fwd-bin as `pycni install --forwarder --bin-dir` writes it (no conflist, no
    units; PYCNI_SOCKET pointed nowhere meanwhile, so no daemon on the machine is asked to
    take up new code)."""
    from cni import install
    from cni.fast import protocol

    d = tmp / "pycni-fwd-bin"
    saved = os.environ.get(protocol.SOCKET_ENV)
    os.environ[protocol.SOCKET_ENV] = str(tmp / "install-asks-no-daemon.sock")
    try:
        install.install(d, None, None, compile_bytecode=False, use_forwarder=True)
    finally:
        if saved is None:
            del os.environ[protocol.SOCKET_ENV]
        else:
            os.environ[protocol.SOCKET_ENV] = saved
    return d


def _cgroup2_root() -> Path:
    """Where the cgroup v2 (unified) hierarchy is mounted."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    root = next((ln.split()[1] for ln in mounts if ln.split()[2] == "cgroup2"), None)
    if root is None:
        raise SystemExit("bench: no cgroup v2 mount (CPU is read from cpu.stat)")
    return Path(root)


class Cgroup:
    """A fresh cgroup v2 (on the unified mount, wherever it is): cpu.stat's usage_usec counts
    every process that ran in it, exited ones included, which a /proc walk misses."""

    def __init__(self, name: str) -> None:
        self.root = _cgroup2_root()
        self.path = self.root / f"pycni-bench-{name}-{secrets.token_hex(3)}"
        self.path.mkdir()

    def join(self) -> None:
        """Move the calling process here (a Popen preexec_fn: the child, before it execs)."""
        (self.path / "cgroup.procs").write_text("0")

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """This process in here meanwhile, so that a child it spawns is born here. Not a
        preexec_fn's join: with one, subprocess forks (the child copies this process's address
        space and tears it down at exec, ~1.1 ms of CPU an exec counted as the child's) where
        it otherwise vforks, as a runtime's exec does (Go's os/exec: clone with CLONE_VFORK).
        This process's own part of the spawn and the wait is counted here too, a few tenths of
        a ms an exec."""
        own = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines()
                   if ln.startswith("0::"))
        home = self.root / own[3:].lstrip("/")
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (home / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_ms(self) -> float:
        stat = (self.path / "cpu.stat").read_text().split()
        return int(stat[stat.index("usage_usec") + 1]) / 1000

    def remove(self) -> None:
        """Its processes must have exited (the daemon stopped first)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def born_in(cgroup: Cgroup | None) -> contextlib.AbstractContextManager[None]:
    """cgroup.holding(), or nothing when no cgroup counts the execs."""
    return cgroup.holding() if cgroup is not None else contextlib.nullcontext()


@dataclass
class Daemon:
    proc: subprocess.Popen
    socket: Path
    log: Path

    @classmethod
    def start(cls, tmp: Path, cgroup: Cgroup | None = None) -> Daemon:
        """A daemon for the run; in `cgroup` from its birth (its spares with it) when given."""
        run = tmp / "run"
        sock, log = run / "pycni.sock", tmp / "daemon.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(VENV_PY), "-m", "cni.fast.daemon", "--socket",
                                     str(sock)], stdout=out, stderr=subprocess.STDOUT,
                                    cwd=ROOT, preexec_fn=cgroup.join if cgroup else None)
        deadline = time.monotonic() + 120
        while "listening" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: the daemon did not start:\n{log.read_text()}")
            time.sleep(0.05)
        return cls(proc, sock, log)

    def memory_kb(self) -> dict[str, int]:
        """The parent's VmHWM and VmRSS; the PSS of the parent and its children (spares, which
        now live on across requests, and the zygote) summed: what the daemon holds."""
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0])
        pids = [self.proc.pid, *map(int, Path(
            f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split())]
        fields["Pss"] = fields["processes"] = 0
        for pid in pids:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue  # gone meanwhile
            fields["Pss"] += int(rollup.split("\nPss:")[1].split()[0])
            fields["processes"] += 1
        return fields

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Lab:
    """A host netns this process lives in, and pod namespaces made on demand."""

    def __init__(self) -> None:
        self.host = f"bench-host-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", self.host], check=True)
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(f"/run/netns/{self.host}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the bench host netns")
        os.close(fd)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        self.track_a_flow()

    @staticmethod
    def track_a_flow() -> None:
        """A node's conntrack table is never empty: with one entry here, portmap's UDP flush
        (both sides) walks the kernel's conntrack hash, as on a node, instead of skipping an
        empty namespace. A TCP entry, renewed for the whole run: the flush keeps it."""
        subprocess.run(["conntrack", "-I", "-p", "tcp", "-s", "192.0.2.10", "-d", "192.0.2.1",
                        "-r", "192.0.2.1", "-q", "192.0.2.10", "--sport", "40000", "--dport",
                        "80", "--reply-port-src", "80", "--reply-port-dst", "40000", "-t",
                        "86400", "--state", "ESTABLISHED"], check=True, capture_output=True)

    def pod(self) -> str:
        name = f"bench-pod-{secrets.token_hex(4)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        return f"/run/netns/{name}"

    @staticmethod
    def drop(path: str) -> None:
        subprocess.run(["ip", "netns", "del", os.path.basename(path)], check=False,
                       capture_output=True)
