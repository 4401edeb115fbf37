"""Reliability harness: run sizes, which pieces exist, configs, the runtime CLI, killing on cue.

Short runs (`make test`) and long runs (`make reliability`, PYCNI_LONG=1) execute the same code;
only the counts differ. A test whose plugin or runtime module is missing names it as it skips,
and fails instead under scripts/test.sh (`make test`, `make reliability`: tests/rootskips.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnitest import BIN, ROOT, VENV_PY, Netns
from rootskips import missing

LONG = os.environ.get("PYCNI_LONG", "") not in ("", "0")
CNI_VERSION = "1.1.0"
# Every bounded wait in the harness: long enough for a loaded 2-core box, never a pass criterion.
TIMEOUT = 120.0

PLUGIN_MODULES = {
    "loopback": "cni.plugins.loopback",
    "host-local": "cni.plugins.host_local",
    "bridge": "cni.plugins.bridge",
    "portmap": "cni.plugins.portmap",
    "bandwidth": "cni.plugins.bandwidth",
}
RUNTIME_MODULES = ("cni.cli", "cni.runtime")
DAEMON_MODULE = "cni.fast.daemon"


def count(short: int, long: int) -> int:
    """How many times to try something: PYCNI_RELIABILITY_COUNT overrides both (for bisecting)."""
    forced = os.environ.get("PYCNI_RELIABILITY_COUNT")
    if forced:
        return int(forced)
    return long if LONG else short


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def need(*modules: str) -> None:
    absent = [m for m in modules if not have(m)]
    if absent:
        missing(f"pycni's {', '.join(absent)} (not landed yet?)")


# What a plugin cannot run without (bridge's IPAM in our test configs).
PLUGIN_DEPS = {"bridge": ("host-local",)}


def need_plugins(*plugins: str) -> None:
    wanted = [d for p in plugins for d in (p, *PLUGIN_DEPS.get(p, ()))]
    need(*dict.fromkeys(PLUGIN_MODULES[p] for p in wanted))


def need_runtime() -> None:
    need("cni.cli")
    if not _cli_has("gc"):
        missing("the gc command in cni.cli (not landed yet?)")


def _cli_has(verb: str) -> bool:
    """Whether `pycni` has the command (asked of its click group: reading a file by name
    skipped these tests unseen once the CLI became a package)."""
    from cni.cli import main

    return verb in main.commands


def token() -> str:
    """A short per-test tag; container IDs carry it, so stray state is traceable to its test."""
    return "rl" + secrets.token_hex(3)


# ---- configs ---------------------------------------------------------------------------------

@dataclass
class Net:
    """One test network: name, subnet, and where host-local and the runtime keep state."""

    name: str
    data_dir: Path
    cache_dir: Path
    subnet: str = "10.77.0.0/24"
    range_start: str = ""
    range_end: str = ""
    bridge: str = "rlbr0"
    extra_ipam: dict[str, Any] = field(default_factory=dict)

    def ipam(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"subnet": self.subnet}
        if self.range_start:
            rng["rangeStart"] = self.range_start
        if self.range_end:
            rng["rangeEnd"] = self.range_end
        return {"type": "host-local", "ranges": [[rng]], "dataDir": str(self.data_dir),
                "routes": [{"dst": "0.0.0.0/0"}], **self.extra_ipam}

    def host_local(self) -> dict[str, Any]:
        return {"cniVersion": CNI_VERSION, "name": self.name, "type": "host-local",
                "ipam": self.ipam()}

    def bridge_conf(self) -> dict[str, Any]:
        return {"cniVersion": CNI_VERSION, "name": self.name, "type": "bridge",
                "bridge": self.bridge, "isGateway": True, "ipMasq": True,
                "ipMasqBackend": "nftables", "ipam": self.ipam()}

    def portmap_conf(self, prev: dict[str, Any], mappings: list[dict[str, Any]]) -> dict[str, Any]:
        return {"cniVersion": CNI_VERSION, "name": self.name, "type": "portmap",
                "backend": "nftables", "snat": True, "capabilities": {"portMappings": True},
                "runtimeConfig": {"portMappings": mappings}, "prevResult": prev}

    def bandwidth_conf(self, prev: dict[str, Any], rate: int = 8_000_000) -> dict[str, Any]:
        return {"cniVersion": CNI_VERSION, "name": self.name, "type": "bandwidth",
                "capabilities": {"bandwidth": True},
                "runtimeConfig": {"bandwidth": {
                    "ingressRate": rate, "ingressBurst": rate, "egressRate": rate,
                    "egressBurst": rate}},
                "prevResult": prev}

    def conflist(self) -> dict[str, Any]:
        """The whole chain, as conf/10-pycni.conflist has it, but with test-private state."""
        return {
            "cniVersion": CNI_VERSION, "name": self.name,
            "plugins": [
                {"type": "loopback"},
                {k: v for k, v in self.bridge_conf().items() if k not in ("cniVersion", "name")},
                {"type": "portmap", "backend": "nftables", "snat": True,
                 "capabilities": {"portMappings": True}},
                {"type": "bandwidth", "capabilities": {"bandwidth": True}},
            ],
        }


def mappings(port: int) -> list[dict[str, Any]]:
    return [{"hostPort": port, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": port, "containerPort": 53, "protocol": "udp"}]


def bandwidth_caps(rate: int = 8_000_000) -> dict[str, Any]:
    return {"ingressRate": rate, "ingressBurst": rate, "egressRate": rate, "egressBurst": rate}


# Unless a test starts its own daemon, the shims must not find one (someone else's, say):
# the exec path alone is what those tests are about.
NO_DAEMON = "/run/pycni-reliability-no-daemon/none.sock"


def plugin_env(command: str, cid: str, netns: str, ifname: str = "eth0",
               extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_PATH": str(BIN), "PYCNI_SOCKET": NO_DAEMON}
    env.update(extra or {})
    return env


# ---- the runtime CLI -------------------------------------------------------------------------

@dataclass
class Runtime:
    """`pycni add|check|del|gc|status` exec'd inside the host namespace, like cnitool."""

    host: Netns
    net: Net
    conf_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def write_conflist(self, conflist: dict[str, Any] | None = None) -> Path:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        path = self.conf_dir / "10-rel.conflist"
        path.write_text(json.dumps(conflist or self.net.conflist()))
        return path

    def argv(self, verb: str, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.host.name, str(VENV_PY), "-m", "cni.cli", verb,
                self.net.name, *args]

    def env(self, cid: str = "", caps: dict[str, Any] | None = None,
            cni_args: str = "") -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "NETCONFPATH": str(self.conf_dir), "CNI_PATH": str(BIN),
               "PYCNI_CACHE_DIR": str(self.net.cache_dir), "PYTHONPATH": str(ROOT),
               "PYCNI_SOCKET": NO_DAEMON}
        if cid:
            env["CNI_CONTAINERID"] = cid
        if caps:
            env["CAP_ARGS"] = json.dumps(caps)
        if cni_args:
            env["CNI_ARGS"] = cni_args
        env.update(self.extra_env)
        return env

    def run(self, verb: str, netns: str, cid: str = "", caps: dict[str, Any] | None = None,
            timeout: float = TIMEOUT) -> tuple[int, Any, str]:
        proc = subprocess.run(self.argv(verb, netns), env=self.env(cid, caps),
                              capture_output=True, timeout=timeout, cwd=ROOT)
        return proc.returncode, parse(proc.stdout), proc.stderr.decode("utf-8", "replace")

    def run_gc(self, valid: list[dict[str, str]] | None = None) -> tuple[int, Any, str]:
        """`pycni gc <net>`; valid=[] passes an explicit empty valid-attachments list."""
        extra = ["--valid-attachments", json.dumps(valid)] if valid is not None else []
        proc = subprocess.run(self.argv("gc", *extra), env=self.env(), capture_output=True,
                              timeout=TIMEOUT, cwd=ROOT)
        return proc.returncode, parse(proc.stdout), proc.stderr.decode("utf-8", "replace")

    def ok(self, verb: str, netns: str, cid: str = "", caps: dict[str, Any] | None = None) -> Any:
        code, out, err = self.run(verb, netns, cid, caps)
        assert code == 0, f"pycni {verb} {cid} failed ({code}): {out} {err[-2000:]}"
        return out

    def popen(self, verb: str, netns: str, cid: str,
              caps: dict[str, Any] | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.argv(verb, netns), env=self.env(cid, caps), cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)


def parse(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text


def pod_caps(port: int) -> dict[str, Any]:
    return {"portMappings": mappings(port), "bandwidth": bandwidth_caps()}


# ---- plugins exec'd directly ------------------------------------------------------------------

def plugin_argv(host: Netns, plugin: str) -> list[str]:
    return ["ip", "netns", "exec", host.name, str(BIN / plugin)]


def spawn_add(host: Netns, plugin: str, cid: str, netns: str, ifname: str,
              extra: dict[str, str] | None) -> subprocess.Popen:
    """An ADD exec'd as a runtime would, in its own session so a kill takes it all down."""
    return subprocess.Popen(plugin_argv(host, plugin), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=plugin_env("ADD", cid, netns, ifname, extra),
                            start_new_session=True)


def exec_plugin(host: Netns, plugin: str, command: str, conf: dict[str, Any] | bytes, cid: str,
                netns: str, ifname: str = "eth0", extra: dict[str, str] | None = None,
                timeout: float = TIMEOUT) -> tuple[int, Any, str]:
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    proc = subprocess.run(plugin_argv(host, plugin), input=stdin,
                          env=plugin_env(command, cid, netns, ifname, extra),
                          capture_output=True, timeout=timeout)
    return proc.returncode, parse(proc.stdout), proc.stderr.decode("utf-8", "replace")


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a daemon outlives no killed test run (it survives exec)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ---- the daemon --------------------------------------------------------------------------------

@dataclass
class Daemon:
    """A private `python -m cni.fast.daemon` in the host namespace, on a socket in a tmp dir."""

    host: Netns
    socket: Path
    log: Path
    proc: subprocess.Popen | None = None
    spares: int | None = None  # --spares N, where the daemon has warm spare children

    def _args(self) -> list[str]:
        src = (ROOT / "cni" / "fast" / "daemon.py").read_text()
        return ["--spares", str(self.spares)] if self.spares is not None and \
            '"--spares"' in src else []

    def start(self) -> Daemon:
        self.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "PYTHONPATH": str(ROOT)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.host.name, str(VENV_PY), "-m", "cni.fast.daemon",
                 "--socket", str(self.socket), *self._args()], cwd=ROOT, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + TIMEOUT
        while not self.accepting():
            assert self.proc.poll() is None, f"daemon exited: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "daemon never listened"
            time.sleep(0.05)
        return self

    def accepting(self) -> bool:
        import socket as socketlib

        s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        try:
            s.connect(str(self.socket))
            return True
        except OSError:
            return False
        finally:
            s.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid  # `ip netns exec` execs python: the same pid

    def env(self, fallback: bool = False) -> dict[str, str]:
        """Requests to this daemon; unless `fallback`, only through it: a shim that finds no
        daemon answers error 11 instead of running the plugin in-process."""
        return {"PYCNI_SOCKET": str(self.socket)} | ({} if fallback else
                                                     {"PYCNI_SHIM_FALLBACK": "0"})

    def status(self) -> dict[str, Any]:
        """The daemon's own figures (cni.fast.status): what it answered, forked, its spares."""
        from cni.fast import status

        figures = status.query(str(self.socket), timeout=TIMEOUT)
        assert figures is not None, f"the daemon does not answer: {self.log.read_text()[-2000:]}"
        return figures

    def stop(self) -> None:
        """SIGKILL the daemon and every child it forked (each runs in its own group)."""
        if self.proc is None:
            return
        kids = descendants(self.proc.pid) if self.proc.poll() is None else []
        _killpg(self.proc.pid)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=TIMEOUT)
        self.proc = None


# ---- killing on cue ----------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """All live descendants of pid (by /proc ppid), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class KillOutcome:
    landed: bool  # the kill hit a live process before the ADD completed
    code: int | None
    stdout: bytes
    phase: str = ""  # where a landed kill hit: STARTUP or VERB (what a Phase said just before)

    @property
    def after_start(self) -> bool:
        return self.landed and self.phase == VERB


STARTUP, VERB = "startup", "verb"  # before the plugin's verb ran, and once it has started
# Whether a request had started its verb when a kill came, asked just before the kill.
Phase = Callable[[subprocess.Popen, Sequence[int]], str]
# Mapped into a plugin process once skel dispatches to a plugin with config models; the others
# show it by what they open (a netlink socket, the pod's namespace, the IPAM store).
VERB_MARK = "pydantic_core"


def exec_phase(proc: subprocess.Popen, targets: Sequence[int]) -> str:
    """VERB if a process about to be killed (the session leader when none is named) runs its
    plugin's verb: it has the config models mapped, or has opened what a verb opens (a socket,
    a namespace, a file or directory other than the interpreter's own source); interpreter
    start-up and the shim open none of these."""
    return VERB if any(_in_verb(pid) for pid in targets or [proc.pid]) else STARTUP


def _in_verb(pid: int) -> bool:
    try:
        fds = [int(fd) for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if fd > 2 and (link.startswith(("socket:", "net:", "mnt:")) or link.startswith("/")
                       and not link.startswith((str(BIN), "/dev/"))
                       and not link.endswith((".py", ".pyc"))):
            return True
    try:
        with open(f"/proc/{pid}/maps") as f:
            return VERB_MARK in f.read()
    except OSError:
        return False


def wait_for_verb(proc: subprocess.Popen, phase: Phase = exec_phase,
                  limit: float = TIMEOUT) -> float:
    """For a kill that must land after the verb started: the delay until `phase` says so (or
    the process ended first); -> the seconds waited."""
    start = time.monotonic()
    while proc.poll() is None and phase(proc, []) != VERB:
        if time.monotonic() - start > limit:
            break
        time.sleep(0.001)
    return time.monotonic() - start


def tally_phases(outcomes: Sequence[KillOutcome]) -> dict[str, int]:
    """Landed kills per phase, for figures: {"startup": n, "verb": n}."""
    landed = [o for o in outcomes if o.landed]
    return {STARTUP: sum(o.phase == STARTUP for o in landed),
            VERB: sum(o.phase == VERB for o in landed)}


def kill_after(proc: subprocess.Popen, delay: float,
               targets: Callable[[subprocess.Popen], Sequence[int]] | None = None,
               stdin: bytes | None = None, phase: Phase = exec_phase,
               until_verb: bool = False,
               after_kill: Callable[[], None] | None = None) -> KillOutcome:
    """Let proc run for `delay` s (or, with until_verb, until `phase` says its verb started),
    then SIGKILL the chosen pids (default: its whole session); then `after_kill` (what
    `targets` held where the kill must land goes on).

    `landed` is whether something was still running and got killed: a kill that comes after
    the ADD finished tests nothing and is counted apart; `phase` where it landed.
    """
    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        proc.stdin = None  # communicate() below must not flush it again
    held, stopped = _hold_in_verb(proc, phase, targets) if until_verb else (None, False)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
    landed = False
    where = ""
    if proc.poll() is None:
        chosen = held if stopped else None if targets is None else targets(proc)
        where = phase(proc, chosen or [])
        if chosen is None:
            landed = _killpg(proc.pid)
        else:
            for pid in chosen:
                try:
                    os.kill(pid, signal.SIGKILL)
                    landed = True
                except ProcessLookupError:
                    pass
    if stopped:
        _signal_group(proc.pid, signal.SIGCONT)  # what was not killed goes on
    if after_kill is not None:
        after_kill()
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        out, _ = proc.communicate(timeout=TIMEOUT)
    return KillOutcome(landed=landed, code=proc.returncode, stdout=out or b"", phase=where)


def _hold_in_verb(proc: subprocess.Popen, phase: Phase,
                  targets: Callable[[subprocess.Popen], Sequence[int]] | None
                  ) -> tuple[list[int] | None, bool]:
    """Stop the session (SIGSTOP) while its verb runs, so that the kill lands there however
    short the verb: wait for the verb, stop, and look again while stopped (the verb may have
    ended in between, or the pid chosen to kill may not be the one in it): if so, let it go on
    and wait again. -> (the pids to kill, chosen while stopped; whether it is stopped)."""
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        wait_for_verb(proc, phase, deadline - time.monotonic())
        if proc.poll() is not None or not _signal_group(proc.pid, signal.SIGSTOP):
            break
        chosen = None if targets is None else list(targets(proc))
        if (targets is None or chosen) and phase(proc, chosen or []) == VERB:
            return chosen, True
        _signal_group(proc.pid, signal.SIGCONT)
        time.sleep(0.001)
    return None, False


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _killpg(pid: int) -> bool:
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def random_delay(rng: random.Random, typical: float) -> float:
    """Mostly inside a typical ADD's duration, some right at the start, a few just after."""
    return rng.choice((0.0, rng.uniform(0, typical * 0.3), rng.uniform(0, typical),
                       rng.uniform(0, typical), rng.uniform(0, typical * 1.1)))


def timed(fn: Callable[[], Any]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


# ---- in-process plugin calls ---------------------------------------------------------------

def _ns_inode(path: str) -> int:
    return os.stat(path).st_ino


@contextmanager
def inside(host: Netns) -> Iterator[None]:
    """Run in-process plugin code with this thread in `host`, never in the machine's netns."""
    from cni.host import netns as hostns

    real = _ns_inode("/proc/thread-self/ns/net")
    with hostns.entered(host.path):
        assert _ns_inode("/proc/thread-self/ns/net") == _ns_inode(host.path)
        yield
    assert _ns_inode("/proc/thread-self/ns/net") == real
