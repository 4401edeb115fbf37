"""Hostile input: fuzzed config, runtimeConfig, prevResult and env for every plugin.

Each call must end in a valid result or a CNI error JSON with a well-known code (never 999, which
means an exception nobody handled, never a traceback on stdout), and an error must leave the
host exactly as it was: links, addresses, nft ruleset, store and cache files. Most cases call
skel.run in-process (this thread setns'd into the throwaway host namespace); a sample goes
through the exec'd binary. Then the specific attacks: path tricks in names and IDs, symlinks in
the store, nft injection through portmap, a 100 MB stdin, non-UTF-8 bytes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import figures
import leakcheck
import pytest
from cnitest import BIN, Netns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relharness import (
    DAEMON_MODULE,
    NO_DAEMON,
    PLUGIN_MODULES,
    TIMEOUT,
    Daemon,
    Net,
    Runtime,
    count,
    inside,
    need,
    need_plugins,
    need_runtime,
    parse,
    plugin_argv,
)

pytestmark = pytest.mark.root

# Codes the spec names (and plugin-specific ones, 100+); 999 is our catch-all for a bug.
WELL_KNOWN = {1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 51}
COMMANDS = ["ADD", "ADD", "ADD", "DEL", "DEL", "CHECK", "GC", "STATUS", "VERSION"]
NASTY = ["../", "../../etc/passwd", "/", "a/b", "\x00", "a\x00b", "x" * 5000, "",
         ".", "..", " ", "eth0:1", "\udcff", "ü", "${HOME}", "$(id)", "`id`", "-rf",
         "1.2.3.4; flush ruleset", '"; flush ruleset; "', "\n", "10.77.0.300", "::ffff:1.2.3.4",
         "10.77.0.5/24", "0.0.0.0", "255.255.255.255", "fe80::1%eth0"]


def verdict(code: int, stdout: bytes, command: str, stderr: bytes = b"") -> str:
    """'' if (code, stdout) is a well-formed CNI answer, else what is wrong with it.

    999 alone is allowed: like the reference (every plain Go error becomes 999), a plugin uses
    it for runtime failures. An exception nobody handled is not: skel prints its traceback on
    stderr, and that is what marks a bug.
    """
    text = stdout.decode("utf-8", "replace")
    if "Traceback" in text:
        return "traceback on stdout"
    if b"Traceback (most recent call last)" in stderr:
        return "unhandled exception: " + stderr.decode("utf-8", "replace").strip()[-300:]
    if code == 0:
        if command in ("ADD", "VERSION"):
            try:
                out = json.loads(stdout)
            except ValueError:
                return f"success without JSON: {text[:200]!r}"
            return "" if isinstance(out, dict) and "cniVersion" in out else f"odd: {text[:200]}"
        return "" if not text.strip() else f"{command} printed {text[:200]!r}"
    if code != 1:
        return f"exit code {code}"
    try:
        err = json.loads(stdout)
    except ValueError:
        return f"error without JSON: {text[:200]!r}"
    if not isinstance(err, dict) or not isinstance(err.get("msg"), str):
        return f"malformed error: {text[:200]}"
    c = err.get("code")
    if not isinstance(c, int) or not (c in WELL_KNOWN or 100 <= c <= 999):
        return f"code {c}: {err.get('msg')}"
    return ""


# ---- strategies --------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64)
           | st.floats(allow_nan=False) | st.text(max_size=12) | st.sampled_from(NASTY))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)

PLUGIN_KEYS = {
    "loopback": [],
    "host-local": ["ipam"],
    "bridge": ["bridge", "isGateway", "isDefaultGateway", "forceAddress", "ipMasq",
               "ipMasqBackend", "mtu", "hairpinMode", "promiscMode", "vlan", "vlanTrunk",
               "preserveDefaultVlan", "macspoofchk", "enabledad", "disableContainerInterface",
               "portIsolation", "nonMasqueradeCIDRs", "ipam", "dns", "args"],
    "portmap": ["backend", "snat", "masqAll", "markMasqBit", "externalSetMarkChain",
                "conditionsV4", "conditionsV6"],
    "bandwidth": ["ingressRate", "ingressBurst", "egressRate", "egressBurst"],
}
COMMON_KEYS = ["cniVersion", "name", "type", "runtimeConfig", "prevResult", "capabilities",
               "cni.dev/valid-attachments", "cni.dev/attachments"]
IPAM_KEYS = ["type", "ranges", "subnet", "rangeStart", "rangeEnd", "gateway", "routes",
             "dataDir", "resolvConf"]
RUNTIME_KEYS = ["portMappings", "bandwidth", "ips", "mac", "ipRanges"]


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], plugin: str) -> dict[str, Any]:
    conf = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(0, 4))):
        where = draw(st.sampled_from(["top", "ipam", "runtime", "prev", "drop"]))
        value = draw(json_values)
        if where == "top":
            conf[draw(st.sampled_from(PLUGIN_KEYS[plugin] + COMMON_KEYS))] = value
        elif where == "ipam":
            if not isinstance(conf.get("ipam"), dict):
                conf["ipam"] = {}
            conf["ipam"][draw(st.sampled_from(IPAM_KEYS))] = value
        elif where == "runtime":
            rc = conf.setdefault("runtimeConfig", {})
            if isinstance(rc, dict):
                rc[draw(st.sampled_from(RUNTIME_KEYS))] = value
        elif where == "prev":
            prev = conf.get("prevResult")
            if isinstance(prev, dict) and draw(st.booleans()):
                prev[draw(st.sampled_from(["interfaces", "ips", "routes", "dns",
                                           "cniVersion"]))] = value
            else:
                conf["prevResult"] = value
        elif conf:
            conf.pop(draw(st.sampled_from(sorted(conf))), None)
    return conf


@st.composite
def envs(draw: st.DrawFn, netns_choices: list[str], ifname: str) -> dict[str, str]:
    env = {"CNI_COMMAND": draw(st.sampled_from(COMMANDS)),
           "CNI_CONTAINERID": draw(st.sampled_from(["rlfuzz-1", "rlfuzz-2"]) | st.sampled_from(
               NASTY) | st.text(max_size=30)),
           "CNI_NETNS": draw(st.sampled_from(netns_choices)),
           "CNI_IFNAME": draw(st.sampled_from([ifname, ifname, "lo"]) | st.sampled_from(NASTY)
                              | st.text(max_size=20)),
           "CNI_PATH": draw(st.sampled_from([str(BIN), str(BIN), "", "/nonexistent", "::"])),
           "PYCNI_SOCKET": NO_DAEMON}
    if draw(st.booleans()):
        env["CNI_ARGS"] = draw(st.sampled_from(["IgnoreUnknown=1", "IP=10.77.0.50",
                                                "IgnoreUnknown=1;IP=10.77.0.50;MAC=zz",
                                                "garbage", "K=V;;=;"]) | st.text(max_size=40))
    for key in draw(st.lists(st.sampled_from(sorted(env)), max_size=2)):
        env.pop(key, None)
    return env


# ---- the fuzzed plugins -----------------------------------------------------------------------

def _prev(pod: Netns, host_veth: str | None) -> dict[str, Any]:
    ifaces: list[dict[str, Any]] = [{"name": "eth0", "sandbox": pod.path}]
    if host_veth:
        ifaces.insert(0, {"name": host_veth})
    return {"cniVersion": "1.1.0", "interfaces": ifaces,
            "ips": [{"address": "10.77.0.9/24", "interface": len(ifaces) - 1,
                     "gateway": "10.77.0.1"}]}


def base_conf(plugin: str, net: Net, pod: Netns) -> dict[str, Any]:
    if plugin == "loopback":
        return {"cniVersion": "1.1.0", "name": net.name, "type": "loopback"}
    if plugin == "host-local":
        return net.host_local()
    if plugin == "bridge":
        return net.bridge_conf()
    if plugin == "portmap":
        return net.portmap_conf(_prev(pod, None),
                                [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}])
    return net.bandwidth_conf(_prev(pod, "vethrlfz0"))


def wire_pod(host: Netns, pod: Netns) -> None:
    """A veth host<->pod with addresses and a route, as bridge would leave it: so portmap and
    bandwidth get past their lookups and the fuzz reaches their deeper code."""
    host.run("ip", "link", "add", "vethrlfz0", "type", "veth", "peer", "name", "eth0",
             "netns", pod.name)
    host.run("ip", "addr", "add", "10.77.0.1/24", "dev", "vethrlfz0")
    host.run("ip", "link", "set", "vethrlfz0", "up")
    pod.run("ip", "addr", "add", "10.77.0.9/24", "dev", "eth0")
    pod.run("ip", "link", "set", "eth0", "up")


class Fuzz:
    """Runs one case, compares the host before and after, cleans up a success."""

    def __init__(self, host: Netns, net: Net, dirs: list[Path],
                 enter: Callable[[], AbstractContextManager[None]]) -> None:
        self.host, self.net, self.dirs, self.enter = host, net, dirs, enter
        self.cases = self.errors = self.successes = 0
        self.codes: dict[int, int] = {}
        self.problems: list[str] = []
        self.accepted: list[str] = []
        self.exec_env: dict[str, str] = {}  # over each exec'd case's env (a daemon's socket)

    def snapshot(self) -> leakcheck.HostSnapshot:
        return leakcheck.snapshot(self.host, *self.dirs)

    def in_process(self, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
        return self.run_in_process(plugin, env, stdin)[:2]

    def run_in_process(self, plugin: str, env: dict[str, str],
                       stdin: bytes) -> tuple[int, bytes, bytes]:
        from cni import skel

        with self.enter():
            reply = skel.run(plugin, env, stdin)
        return reply.code, reply.stdout, reply.stderr

    def exec(self, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes, bytes]:
        full = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env,
                **self.exec_env}
        proc = subprocess.run(plugin_argv(self.host, plugin), input=stdin, env=full,
                              capture_output=True, timeout=TIMEOUT)
        return proc.returncode, proc.stdout, proc.stderr

    def case(self, plugin: str, env: dict[str, str], conf: dict[str, Any] | bytes,
             via_exec: bool = False) -> None:
        stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
        before = self.snapshot()
        run = self.exec if via_exec else self.run_in_process
        code, out, err = run(plugin, env, stdin)
        self.cases += 1
        command = env.get("CNI_COMMAND", "")
        what = f"{plugin} {command} env={ {k: v[:60] for k, v in env.items()} } " \
               f"stdin={stdin[:400]!r}"
        problem = verdict(code, out, command, err)
        if problem:
            self.problems.append(f"{what}: {problem}")
            return
        if code != 0:
            self.errors += 1
            err_code = json.loads(out)["code"]
            self.codes[err_code] = self.codes.get(err_code, 0) + 1
            # a link-local address shows up whenever the kernel gets to it: not the plugin's doing
            diff = [d for d in before.diff(self.snapshot())
                    if not (d.startswith("addresses +") and d.split()[2].startswith("fe80:"))]
            if plugin == "bridge":
                diff = _without_new_bridges(diff)
            if diff:
                self.problems.append(f"{what}: error {out[:300]!r} changed the host: {diff}")
            return
        self.successes += 1
        self.accepted.append(what)
        if command == "ADD":  # undo it, so the next case starts from the same host
            self.in_process(plugin, {**env, "CNI_COMMAND": "DEL"}, stdin)


def _without_new_bridges(diff: list[str]) -> list[str]:
    """The one change an erroring bridge ADD may leave, as the reference does: the bridge
    device itself (made before IPAM runs, never deleted)."""
    bridges = {d.split("'")[1] for d in diff if d.startswith("links +(") and "'bridge')" in d}
    return [d for d in diff if not (d.startswith("links +(") and "'bridge')" in d)
            and not (d.startswith("addresses +") and d.split()[1] in bridges)]


FUZZ_PLUGINS = list(PLUGIN_MODULES)


@pytest.fixture
def fuzz_setup(host: Netns, pod: Netns, net: Net) -> Iterator[tuple[Fuzz, list[str]]]:
    wire_pod(host, pod)
    net.data_dir.mkdir(parents=True, exist_ok=True)
    dirs = [net.data_dir, net.cache_dir, Path("/var/lib/cni")]
    missing_file = str(net.data_dir.parent / "not-a-netns")
    Path(missing_file).write_text("")
    # Paths that fail to open with EACCES/ENOTDIR have their own test below
    # (test_unopenable_netns_path_is_a_cni_error) until cni/host/netns.py handles them.
    netns_choices = [pod.path, pod.path, "/run/netns/rl-does-not-exist", "", missing_file,
                     "/proc/self/ns/net", "../../../run/netns/x"]
    yield Fuzz(host, net, dirs, lambda: inside(host)), netns_choices


def _fuzz(plugin: str, fz: Fuzz, netns_choices: list[str], net: Net, pod: Netns,
          examples: int, via_exec: bool, name: str) -> None:
    need_plugins(plugin)
    base = base_conf(plugin, net, pod)

    # the pod's eth0 is the wired veth portmap and bandwidth look at; bridge makes its own
    ifname = "eth1" if plugin == "bridge" else "eth0"

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(conf=mutated(base, plugin), env=envs(netns_choices, ifname))
    def one(conf: dict[str, Any], env: dict[str, str]) -> None:
        if via_exec:  # execve cannot pass a NUL: such a variable is simply missing
            env = {k: v for k, v in env.items() if "\x00" not in v}
        fz.case(plugin, env, conf, via_exec)

    one()
    figures.record(name, plugin=plugin, via="exec" if via_exec else "in-process",
                   cases=fz.cases, errors=fz.errors, successes=fz.successes,
                   error_codes=dict(sorted(fz.codes.items())), problems=len(fz.problems))
    assert not fz.problems, f"{len(fz.problems)} problems:\n" + "\n".join(fz.problems[:8])


@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_in_process(plugin: str, fuzz_setup, net: Net, pod: Netns) -> None:
    fz, choices = fuzz_setup
    _fuzz(plugin, fz, choices, net, pod, count(60, 60), False, "fuzz")


@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_exec_sample(plugin: str, fuzz_setup, net: Net, pod: Netns) -> None:
    fz, choices = fuzz_setup
    _fuzz(plugin, fz, choices, net, pod, count(6, 6), True, "fuzz-exec")


@pytest.mark.slow
@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_in_process_long(plugin: str, fuzz_setup, net: Net, pod: Netns) -> None:
    fz, choices = fuzz_setup
    _fuzz(plugin, fz, choices, net, pod, count(60, 1500), False, "fuzz-long")


@pytest.mark.slow
@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_exec_sample_long(plugin: str, fuzz_setup, net: Net, pod: Netns) -> None:
    fz, choices = fuzz_setup
    _fuzz(plugin, fz, choices, net, pod, count(6, 150), True, "fuzz-exec-long")


# ---- the same, through the daemon's spares ---------------------------------------------------

@pytest.fixture
def spare_daemon(host: Netns, tmp_path: Path) -> Iterator[Daemon]:
    """One warm spare, serving request after request: each hostile case reaches it."""
    need(DAEMON_MODULE)
    d = Daemon(host, tmp_path / "run" / "pycni.sock", tmp_path / "daemon.log", spares=1).start()
    yield d
    d.stop()


class Probe:
    """The next valid pod after a hostile case: ADD, then DEL, of the plugin's valid config.
    Its answer and the kernel state it makes are compared with a fresh process's."""

    def __init__(self, fz: Fuzz, plugin: str, conf: dict[str, Any], ifname: str,
                 pod: Netns) -> None:
        self.fz, self.plugin, self.conf = fz, plugin, json.dumps(conf).encode()
        self.env = {"CNI_CONTAINERID": "rlprobe-1", "CNI_NETNS": pod.path,
                    "CNI_IFNAME": ifname, "CNI_PATH": str(BIN)}

    def run(self, via: dict[str, str], ready: Callable[[], object] = lambda: None
            ) -> tuple[str, list[str], list[str]]:
        """(its ADD's answer, what the ADD changed on the host, what ADD+DEL left: a plugin's
        lasting state, the bridge, the store's bookkeeping), masked of what differs by
        nature. `ready` waits before each request (for the daemon's spare to be back)."""
        before = self.fz.snapshot()
        env = {**self.env, **via}
        ready()
        code, out, err = self.call("ADD", env)
        assert code == 0, f"{self.plugin} probe ADD: {out[:500]!r} {err[-500:]!r}"
        made = before.diff(self.fz.snapshot())
        ready()
        code, out_del, err = self.call("DEL", env)
        assert code == 0, f"{self.plugin} probe DEL: {out_del[:500]!r} {err[-500:]!r}"
        left = before.diff(self.fz.snapshot())
        return (_masked(out.decode()), sorted(_masked(d) for d in made if not _link_local(d)),
                sorted(_masked(d) for d in left if not _link_local(d)))

    def call(self, command: str, env: dict[str, str]) -> tuple[int, bytes, bytes]:
        full = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "CNI_COMMAND": command, **env}
        proc = subprocess.run(plugin_argv(self.fz.host, self.plugin), input=self.conf,
                              env=full, capture_output=True, timeout=TIMEOUT)
        return proc.returncode, proc.stdout, proc.stderr


def _link_local(change: str) -> bool:
    return change.startswith("addresses +") and change.split()[2].startswith("fe80:")


def _masked(text: str) -> str:
    text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "<mac>", text)
    text = re.sub(r"veth[0-9a-f]{8}", "<veth>", text)
    return re.sub(r"10\.77\.0\.\d+", "10.77.0.<n>", text)  # host-local hands out the next


def _warm_spare(d: Daemon) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while (figures_now := d.status())["spares"]["warm"] < 1:
        assert time.monotonic() < deadline, "no warm spare"
        time.sleep(0.02)
    return figures_now


def _fuzz_through_a_spare(plugin: str, fz: Fuzz, netns_choices: list[str], net: Net,
                          pod: Netns, d: Daemon, examples: int, name: str) -> None:
    """Each hostile case through the daemon's spare, then a valid pod: it must answer and
    change the kernel exactly as through a fresh process, through the same spare unless the
    case made it retire (a spare retires rather than serve in doubt)."""
    need_plugins(plugin)
    ifname = "eth1" if plugin == "bridge" else "eth0"
    probe = Probe(fz, plugin, base_conf(plugin, net, pod), ifname, pod)
    probe.run({"PYCNI_SOCKET": NO_DAEMON})  # the first makes what lasts (store, bridge)
    fresh = probe.run({"PYCNI_SOCKET": NO_DAEMON})
    fz.exec_env = d.env()  # no fallback: what the daemon does not take fails
    tally = {"probes": 0, "spares_reused": 0, "spares_retired": 0, "cases_the_daemon_ran": 0}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(conf=mutated(base_conf(plugin, net, pod), plugin), env=envs(netns_choices, ifname))
    def one(conf: dict[str, Any], env: dict[str, str]) -> None:
        env = {k: v for k, v in env.items() if "\x00" not in v}  # execve cannot pass a NUL
        before = _warm_spare(d)
        fz.case(plugin, env, conf, via_exec=True)
        after_case = _warm_spare(d)
        tally["cases_the_daemon_ran"] += after_case["started"] - before["started"]
        assert probe.run(d.env(), lambda: _warm_spare(d)) == fresh, \
            f"after {env} {conf}: not as a fresh process"
        after = d.status()
        assert after["started"] == after_case["started"] + 2  # the probe's ADD and DEL
        assert after["forked"] == before["forked"], "a request forked: no spare served it"
        tally["probes"] += 1
        retired = after["spares"]["retired"] - before["spares"]["retired"]
        tally["spares_retired"] += retired
        tally["spares_reused"] += retired == 0

    one()
    leaks = leakcheck.find(fz.host, net.data_dir, net.cache_dir, ignore_links=("vethrlfz0",))
    why = re.findall(r"exits instead of serving again: ([^:\n]*)", d.log.read_text())
    figures.record(name, plugin=plugin, via="daemon", cases=fz.cases, errors=fz.errors,
                   successes=fz.successes, problems=len(fz.problems), leaks=leaks.total(),
                   spares=d.spares, **tally,
                   retired_because={w: why.count(w) for w in sorted(set(why))})
    assert not fz.problems, f"{len(fz.problems)} problems:\n" + "\n".join(fz.problems[:8])
    assert leaks.empty(), str(leaks)
    assert tally["spares_reused"] > 0, tally  # most cases leave the spare fit to serve again
    assert tally["cases_the_daemon_ran"] > 0, tally  # (VERSION, odd commands: the shim's)


@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_through_a_spare(plugin: str, fuzz_setup, net: Net, pod: Netns,
                              spare_daemon: Daemon) -> None:
    fz, choices = fuzz_setup
    _fuzz_through_a_spare(plugin, fz, choices, net, pod, spare_daemon, count(6, 6),
                          "fuzz-daemon")


@pytest.mark.slow
@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_fuzz_through_a_spare_long(plugin: str, fuzz_setup, net: Net, pod: Netns,
                                   spare_daemon: Daemon) -> None:
    fz, choices = fuzz_setup
    _fuzz_through_a_spare(plugin, fz, choices, net, pod, spare_daemon, count(6, 150),
                          "fuzz-daemon-long")


# ---- specific attacks ---------------------------------------------------------------------------

def _env(command: str, cid: str = "rlhost-1", netns: str = "", ifname: str = "eth0",
         **extra: str) -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": str(BIN), "PYCNI_SOCKET": NO_DAEMON, **extra}


BAD_IDS = ["../x", "../../../tmp/rlpwn", "/abs", "a/b", "a\x00b", "-x", ".x", "a b", "a\nb",
           "..", "x/../../rlpwn"]
BAD_IFNAMES = ["../x", "a/b", "a\x00b", "x" * 16, "..", ".", "a b", "a:b", ""]
LONG = "x" * 10000  # legal characters, absurd length: any clean answer will do


@pytest.mark.parametrize("plugin", FUZZ_PLUGINS)
def test_path_tricks_in_ids_and_names_are_refused(plugin: str, fuzz_setup, net: Net,
                                                  pod: Netns, tmp_path: Path) -> None:
    need_plugins(plugin)
    fz, _ = fuzz_setup
    base = base_conf(plugin, net, pod)
    ifname = "eth1" if plugin == "bridge" else "eth0"
    for command in ("ADD", "DEL", "CHECK"):
        for bad in BAD_IDS:
            fz.case(plugin, _env(command, cid=bad, netns=pod.path, ifname=ifname), base)
            fz.case(plugin, _env(command, netns=pod.path, ifname=ifname), {**base, "name": bad})
        for bad in BAD_IFNAMES:
            fz.case(plugin, _env(command, netns=pod.path, ifname=bad), base)
    accepted = list(fz.accepted)
    fz.case(plugin, _env("ADD", netns=pod.path, ifname=ifname), {**base, "name": LONG})
    assert not fz.problems, "\n".join(fz.problems[:8])
    assert not accepted, "path tricks accepted:\n" + "\n".join(accepted[:5])
    assert not list(tmp_path.parent.glob("**/rlpwn")) and not Path("/tmp/rlpwn").exists()
    leakcheck.assert_none(fz.host, net.data_dir, net.cache_dir, ignore_links=("vethrlfz0",
                                                                               "eth0"))


def test_runtime_refuses_path_tricks_before_touching_the_cache(runtime: Runtime, pod: Netns,
                                                               tmp_path: Path) -> None:
    need_runtime()
    need(*PLUGIN_MODULES.values())
    for bad in ["../../rlpwn", "a/../../rlpwn", "-rlpwn"]:
        code, _, err = runtime.run("add", pod.path, bad)
        assert code != 0, f"runtime accepted container ID {bad[:40]!r}"
        assert "Traceback" not in err
    for name in ["../rlpwn", "a/b"]:
        conf = runtime.net.conflist() | {"name": name}
        runtime.write_conflist(conf)
        runtime.net.name, old = name, runtime.net.name
        try:
            code, _, err = runtime.run("add", pod.path, "rlok-1")
        finally:
            runtime.net.name = old
        assert code != 0 and "Traceback" not in err
    runtime.write_conflist()
    assert not list(tmp_path.rglob("*rlpwn*"))
    assert not any(runtime.net.cache_dir.rglob("*")) if runtime.net.cache_dir.exists() else True


def test_symlinks_planted_in_the_store_are_not_followed(fuzz_setup, net: Net, pod: Netns,
                                                        tmp_path: Path) -> None:
    need_plugins("host-local")
    fz, _ = fuzz_setup
    victim = tmp_path / "victim"
    victim.write_text("precious")
    store = net.data_dir / net.name
    store.mkdir(parents=True)
    (store / "last_reserved_ip.0").symlink_to(victim)  # would be overwritten through the link
    (store / "10.77.0.2").symlink_to(victim)  # the first free address: a planted "reservation"
    conf = net.host_local()
    code, out = fz.in_process("host-local", _env("ADD", "rlsym-1", pod.path), json.dumps(
        conf).encode())
    assert not verdict(code, out, "ADD"), out
    assert victim.read_text() == "precious", "a symlink in the store was written through"
    if code == 0:
        got = json.loads(out)["ips"][0]["address"]
        assert got != "10.77.0.2/24", "handed out an address whose file is a planted symlink"
    code, out = fz.in_process("host-local", _env("DEL", "rlsym-1", pod.path),
                              json.dumps(conf).encode())
    assert code == 0, out
    assert victim.read_text() == "precious" and victim.exists()
    # the lock file too
    (store / "lock").unlink(missing_ok=True)
    (store / "lock").symlink_to(victim)
    fz.in_process("host-local", _env("ADD", "rlsym-2", pod.path), json.dumps(conf).encode())
    fz.in_process("host-local", _env("DEL", "rlsym-2", pod.path), json.dumps(conf).encode())
    assert victim.read_text() == "precious"


def test_symlink_planted_as_cache_file_is_not_written_through(runtime: Runtime, pod: Netns,
                                                              tmp_path: Path) -> None:
    need_runtime()
    need(*PLUGIN_MODULES.values())
    victim = tmp_path / "victim"
    victim.write_text("precious")
    results = runtime.net.cache_dir / "results"
    results.mkdir(parents=True)
    (results / f"{runtime.net.name}-rlsymc-1-eth0").symlink_to(victim)
    caps = {"portMappings": [], "bandwidth": {}}
    runtime.run("add", pod.path, "rlsymc-1", caps)
    runtime.run("del", pod.path, "rlsymc-1", caps)
    assert victim.read_text() == "precious"


INJECTIONS = {
    "conditionsV4": [["ip saddr 10.0.0.1 ; add table ip rlevil"], ["} ; add table ip rlevil {"],
                     ["ip saddr 10.0.0.1 accept"], ["meta mark 1 jump hostports"],
                     ['ip saddr 10.0.0.1 comment "x" ; flush ruleset'], ["ip saddr @evil"],
                     ["ip daddr 10.0.0.1\nadd table ip rlevil"]],
    "protocol": ["tcp ; add table ip rlevil", "tcp dport 1 accept", "tcp\nflush ruleset",
                 "TCP", "icmp", "all", ""],
    "hostIP": ["1.2.3.4 ; flush ruleset", "1.2.3.4 }", "1.2.3.4\nadd table ip rlevil",
               "0.0.0.0/0", "127.0.0.1 drop", "10.77.0.1 accept"],
    "containerPort": ["80 ; flush ruleset", "80-90", -1, 65536, "80"],
    "hostPort": ["8080; flush ruleset", 0, 70000, "8080"],
}


def test_nft_injection_through_portmap_changes_nothing(fuzz_setup, net: Net, pod: Netns) -> None:
    need_plugins("portmap")
    fz, _ = fuzz_setup
    fz.host.run("nft", "add table ip rlsentinel; add chain ip rlsentinel c")
    base = base_conf("portmap", net, pod)
    tried = 0
    for key, values in INJECTIONS.items():
        for value in values:
            conf = json.loads(json.dumps(base))
            mapping = conf["runtimeConfig"]["portMappings"][0]
            if key == "conditionsV4":
                conf[key] = value
            else:
                mapping[key] = value
            fz.case("portmap", _env("ADD", "rlinj-1", pod.path), conf)
            tried += 1
            ruleset = json.dumps(fz.host.nft_ruleset())
            assert "rlevil" not in ruleset, f"{key}={value!r} created a table"
            assert "rlsentinel" in ruleset, f"{key}={value!r} flushed the ruleset"
            for rule in leakcheck.commented_rules(fz.host.nft_ruleset()):
                body = json.dumps(rule["expr"])
                for verdict_word in ('"accept"', '"drop"', '"jump"'):
                    assert verdict_word not in body or "hostports" in body, (key, value, rule)
    figures.record("nft-injection", cases=tried, errors=fz.errors, problems=len(fz.problems))
    assert not fz.problems, "\n".join(fz.problems[:8])


def test_100mb_stdin_is_refused_cleanly(host: Netns, pod: Netns) -> None:
    need_plugins("bridge")
    blob = b'{"cniVersion":"1.1.0","name":"n","type":"bridge","pad":"' + b"a" * (100 << 20) + b'"}'
    for plugin in ("bridge", "loopback"):
        proc = subprocess.run(plugin_argv(host, plugin), input=blob, capture_output=True,
                              env={**_env("ADD", "rlbig-1", pod.path),
                                   "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                              timeout=TIMEOUT)
        assert not verdict(proc.returncode, proc.stdout, "ADD"), proc.stdout[:300]
        assert proc.returncode == 1 and json.loads(proc.stdout)["code"] in (5, 6, 7)
    assert not [n for n in leakcheck.links(host) if n["ifname"] != "lo"]


def test_non_utf8_bytes_in_stdin_and_env(host: Netns, pod: Netns, net: Net) -> None:
    need_plugins("bridge", "host-local")
    conf = json.dumps(net.bridge_conf()).encode()
    stdins = [conf.replace(net.name.encode(), net.name.encode() + b"\xff"),
              conf.replace(b'"rlbr0"', b'"rl\xc3\x28br"'), b"\xff\xfe{}", b"\x00" * 64,
              conf[:-1] + b',"x":"\xed\xa0\x80"}']
    checked = errors = 0

    def one(plugin: str, stdin: bytes, env: dict[bytes, bytes]) -> None:
        nonlocal checked, errors
        before = leakcheck.snapshot(host, net.data_dir)
        proc = subprocess.run(plugin_argv(host, plugin), input=stdin, capture_output=True,
                              env=env, timeout=TIMEOUT)
        problem = verdict(proc.returncode, proc.stdout, "ADD", proc.stderr)
        assert not problem, (plugin, stdin[:60], env, problem)
        checked += 1
        if proc.returncode == 0:  # accepted (e.g. loopback ignores CNI_ARGS): undo it
            subprocess.run(plugin_argv(host, plugin), input=stdin, capture_output=True,
                           env={**env, b"CNI_COMMAND": b"DEL"}, timeout=TIMEOUT, check=True)
        else:
            errors += 1
            assert before.diff(leakcheck.snapshot(host, net.data_dir)) == [], (plugin, env)

    base = {k.encode(): v.encode() for k, v in _env("ADD", "rlutf-1", pod.path,
                                                     ifname="eth1").items()}
    base[b"PATH"] = b"/usr/sbin:/usr/bin:/sbin:/bin"
    for plugin in ("bridge", "host-local", "loopback"):
        for stdin in stdins:
            one(plugin, stdin, base)
        # CNI_IFNAME has its own test below
        for key in (b"CNI_CONTAINERID", b"CNI_NETNS", b"CNI_ARGS", b"CNI_COMMAND"):
            one(plugin, conf, {**base, key: b"rl\xff\xfe" + (b"=1" if key == b"CNI_ARGS"
                                                              else b"")})
    figures.record("non-utf8", cases=checked, errors=errors, problems=0)


@pytest.mark.parametrize("plugin", ["loopback", "bridge"])
def test_unopenable_netns_path_is_a_cni_error(plugin: str, fuzz_setup, net: Net,
                                              pod: Netns) -> None:
    need_plugins(plugin)
    fz, _ = fuzz_setup
    for path in ("/etc/hostname/x", "/proc/1/ns/mnt", "/" + "x" * 5000):
        for command in ("ADD", "DEL"):
            fz.case(plugin, _env(command, netns=path, ifname="eth1"), base_conf(plugin, net, pod))
    assert not fz.problems, "\n".join(fz.problems[:4])


def test_portmap_add_without_a_route_to_the_container(fuzz_setup, host: Netns, net: Net,
                                                      pod: Netns) -> None:
    need_plugins("portmap")
    fz, _ = fuzz_setup
    host.run("ip", "addr", "flush", "dev", "vethrlfz0")  # no route toward 10.77.0.0/24 now
    conf = base_conf("portmap", net, pod)
    code, out = fz.in_process("portmap", _env("ADD", "rlnoroute-1", pod.path),
                              json.dumps(conf).encode())
    assert not verdict(code, out, "ADD"), out[:500]
    assert code == 0, out[:500]
    fz.in_process("portmap", _env("DEL", "rlnoroute-1", pod.path), json.dumps(conf).encode())


def test_very_long_container_id_is_released_by_del(fuzz_setup, net: Net, pod: Netns) -> None:
    need_plugins("host-local")
    fz, _ = fuzz_setup
    fz.case("host-local", _env("ADD", cid=LONG, netns=pod.path), base_conf("host-local", net, pod))
    assert not fz.problems, fz.problems
    assert not leakcheck.reservations(net.data_dir)  # case() DELs every successful ADD


def test_runtime_with_a_very_long_container_id_fails_cleanly(runtime: Runtime,
                                                             pod: Netns) -> None:
    need_runtime()
    need(*PLUGIN_MODULES.values())
    cid = "x" * 5000
    code, _, err = runtime.run("add", pod.path, cid)
    runtime.run("del", pod.path, cid)
    assert "Traceback" not in err
    leakcheck.assert_none(runtime.host, runtime.net.data_dir, runtime.net.cache_dir)


def test_non_utf8_ifname_is_a_clean_error(host: Netns, pod: Netns, net: Net) -> None:
    need_plugins("bridge", "host-local")
    env = {k.encode(): v.encode() for k, v in _env("ADD", "rlutf-2", pod.path).items()}
    env[b"PATH"], env[b"CNI_IFNAME"] = b"/usr/bin:/bin", b"rl\xff\xfe"
    before = leakcheck.snapshot(host, net.data_dir)
    proc = subprocess.run(plugin_argv(host, "bridge"), input=json.dumps(net.bridge_conf()).encode(),
                          capture_output=True, env=env, timeout=TIMEOUT)
    assert not verdict(proc.returncode, proc.stdout, "ADD", proc.stderr), proc.stderr[-300:]
    if proc.returncode:
        assert before.diff(leakcheck.snapshot(host, net.data_dir)) == []


def test_verdict_catches_what_it_should() -> None:
    """The fuzz oracle itself: it must reject each bad shape."""
    assert verdict(0, b"", "DEL") == ""
    assert verdict(0, b'{"cniVersion":"1.1.0"}', "ADD") == ""
    assert verdict(1, b'{"code":7,"msg":"x"}', "ADD") == ""
    assert verdict(1, b'{"code":999,"msg":"x"}', "ADD") == ""  # a runtime failure, as in Go
    assert verdict(1, b'{"code":999,"msg":"KeyError"}', "ADD",
                   b"Traceback (most recent call last):\n  KeyError")
    assert verdict(1, b'{"code":12,"msg":"x"}', "ADD")
    assert verdict(1, b"Traceback (most recent call last):", "ADD")
    assert verdict(2, b'{"code":7,"msg":"x"}', "ADD")
    assert verdict(0, b"", "ADD")
    assert verdict(1, b'{"code":"7","msg":"x"}', "ADD")
    assert verdict(0, b"ok", "DEL")


def _unused() -> Any:  # keep parse imported for interactive debugging of exec'd cases
    return parse
