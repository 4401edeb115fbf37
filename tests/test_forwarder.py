"""The forwarder is the same plugin: every request sent through the Python shim and through
pycni-forwarder (two bin dirs, `pycni install` with and without --forwarder, in one shared
throwaway dir) must give the same stdout, stderr and exit code byte for byte, in every daemon
state: down, a stale socket (stopped or restarting), up, refusing, closing before the ACK
(stopping), accepting then dying mid-verb, a non-root listener; with the shim's fallback on and
off. The plugin chains (kernel state, MACs and veth names random) are compared as
test_daemon.py compares the daemon with in-process: those masked, nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cnitest import Netns, Plugins
from forwarder_util import built
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_daemon import (  # noqa: F401 (start_daemon: a fixture)
    NO_FALLBACK,
    normalize,
    run_chain,
    scenario,
    start_daemon,
    wait_for,
)
from test_shim import json_values

from cni import deleted, registry
from cni import install as inst
from cni.fast import protocol as proto
from cni.install import forwarder

pytestmark = pytest.mark.root
PLUGINS = sorted(registry.NAMES)
UNKNOWN = "no-such-plugin"
Outcome = tuple[int, bytes, bytes]


class Kinds:
    """A Python bin dir and a forwarder bin dir, installed from this checkout."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.py, self.fwd = top / "py" / "bin", top / "fwd" / "bin"

    def install(self) -> None:
        for bin_dir, use in ((self.py, False), (self.fwd, True)):
            inst.install(bin_dir, None, None, compile_bytecode=False, units_dir=None,
                         use_forwarder=use)
        (self.py / UNKNOWN).symlink_to(inst.MULTICALL)  # a name no plugin has
        (self.fwd / UNKNOWN).symlink_to(forwarder.FORWARDER)
        for name in PLUGINS:  # the second really is the forwarder, the first the shim
            assert (self.fwd / name).resolve() == self.fwd / forwarder.FORWARDER
            assert (self.py / name).resolve() == self.py / inst.MULTICALL

    def run(self, host: Netns, plugin: str, command: str, stdin: bytes, env: dict,
            netns: str = "", markers: bool = False,
            closed_stdin: bool = False) -> tuple[Outcome, Outcome]:
        """The same request through both, each from the same state of cni.deleted's markers
        (none; markers: as they are); (shim's, forwarder's) (code, stdout, stderr)."""
        full = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": command,
                "CNI_CONTAINERID": "fwdtest1", "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
                "CNI_PATH": str(self.fwd)} | env
        full = {k: v for k, v in full.items() if v is not None}
        out = []
        for bin_dir in (self.py, self.fwd):
            if not markers:  # else the first one's DEL answers the second's
                shutil.rmtree(deleted.MARKER_DIR, ignore_errors=True)
            close = ["sh", "-c", 'exec "$0" <&-'] if closed_stdin else []
            proc = subprocess.run(["ip", "netns", "exec", host.name, *close,
                                   str(bin_dir / plugin)], input=stdin, env=full,
                                  capture_output=True, timeout=600, cwd="/")
            out.append((proc.returncode, proc.stdout, proc.stderr))
        return out[0], out[1]


@pytest.fixture(scope="module")
def kinds() -> Iterator[Kinds]:
    built()
    top = Path(tempfile.mkdtemp(prefix="pycni-fwd-"))  # 0700 made 0755: nobody execs them too
    os.chmod(top, 0o755)
    old = os.environ.get("PYCNI_SOCKET")
    os.environ["PYCNI_SOCKET"] = str(top / "none.sock")  # install asks no daemon of ours
    try:
        k = Kinds(top)
        k.install()
        yield k
    finally:
        os.environ.pop("PYCNI_SOCKET") if old is None else os.environ.update(PYCNI_SOCKET=old)
        shutil.rmtree(top, ignore_errors=True)


def conf(plugin: str, **extra) -> bytes:
    return json.dumps({"cniVersion": "1.1.0", "name": "fwdnet", "type": plugin} | extra).encode()


# Requests of every verb, good and bad: (command, stdin, env changes, in the pod's netns).
def requests(plugin: str) -> list[tuple[str, bytes, dict, bool]]:
    good = conf(plugin)
    return [
        ("ADD", b"{", {}, True),  # not JSON
        ("ADD", conf(plugin, cniVersion="0.0.9"), {}, True),  # a version nobody speaks
        ("ADD", good, {"CNI_CONTAINERID": None}, True),  # a required variable missing
        ("ADD", good, {"CNI_IFNAME": "bad/name"}, True),
        ("CHECK", conf(plugin, cniVersion="0.3.1"), {}, True),  # CHECK before 0.4.0
        ("DEL", good, {}, False),  # no netns: DEL still succeeds
        ("DEL", good, {}, True),
        ("GC", conf(plugin, **{"cni.dev/valid-attachments": []}), {}, False),
        ("STATUS", good, {}, False),
        ("FOO", good, {}, False),  # no such verb
        ("ADD", b"\xff\xfe{}", {}, True),
    ]


VERSION_STDINS = [b"", b"{}", b' {"cniVersion": "0.4.0"} ', b'{"cniVersion":"0.2.0"}',
                  b'{"cniVersion":"9.9.9"}', b'{"cniVersion": "1.0.0", "name": "x"}', b"[1]",
                  b"\xff", b'{"cniVersion": "0.3.1", "x": NaN}', b'{"cniVersion": "\\u0030.4.0"}']


def compare(kinds: Kinds, host: Netns, pod: Netns, env: dict, plugins=(*PLUGINS, UNKNOWN),
            only: tuple[str, ...] = ()) -> int:
    """Every request through both executables: the same bytes. How many were sent."""
    sent = 0
    for plugin in plugins:
        for command, stdin, changes, in_pod in requests(plugin):
            if only and command not in only:
                continue
            shim, fwd = kinds.run(host, plugin, command, stdin, env | changes,
                                  pod.path if in_pod else "")
            assert fwd == shim, (plugin, command, stdin, changes)
            sent += 1
    return sent


def test_version_is_the_shims_for_every_plugin_and_stdin(kinds, host) -> None:
    for plugin in [*PLUGINS, UNKNOWN]:
        for stdin in VERSION_STDINS:
            shim, fwd = kinds.run(host, plugin, "VERSION", stdin, {})
            assert fwd == shim, (plugin, stdin)
            assert shim[0] == 0 and b"supportedVersions" in shim[1]


def test_a_repeated_del_is_answered_by_the_marker(kinds, host, tmp_path) -> None:
    """A DEL without a netns after a DEL of that attachment: success, no daemon asked (none
    here, and no fallback: without the marker both answer 11)."""
    env = {"PYCNI_SOCKET": str(tmp_path / "none.sock")} | NO_FALLBACK
    for marked in (False, True):
        shutil.rmtree(deleted.MARKER_DIR, ignore_errors=True)
        if marked:
            deleted.mark("bridge", "fwdtest1", "eth0", time.time())
        shim, fwd = kinds.run(host, "bridge", "DEL", conf("bridge"), env, markers=True)
        assert fwd == shim
        assert shim[0] == (0 if marked else 1), shim


stdins = (json_values.map(lambda v: json.dumps(v).encode())
          | st.dictionaries(st.sampled_from(["cniVersion", "name"]), json_values | st.text(),
                            max_size=2).map(lambda v: json.dumps(v, ensure_ascii=False).encode())
          | st.binary(max_size=24))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stdin=stdins, command=st.sampled_from(["VERSION", "ADD"]))
@example(stdin=b'{"cniVersion": 0.0, "name": "n"}', command="ADD")  # falsy: the default
@example(stdin=b'{"cniVersion": []}', command="ADD")
@example(stdin=b'{"cniVersion": "\xc3\xa9\\ud83d"}', command="ADD")  # escapes
@example(stdin=b'\xef\xbb\xbf{"cniVersion": "0.4.0"}', command="ADD")  # a BOM
@example(stdin=b'{"cniVersion": "0.4.0", "x": "\xff"}', command="ADD")  # not UTF-8
@example(stdin=b'{"cniVersion": "0.4.0"} {}', command="ADD")  # extra data
@example(stdin=b'{"cniVersion": "\xed\xa0\xbd"}', command="ADD")  # a surrogate's bytes
def test_any_stdin_gives_the_same_bytes(kinds, host, tmp_path, stdin, command) -> None:
    """VERSION of any stdin (the forwarder's own answer or skel's), and the error the forwarder
    writes itself (no daemon, no fallback: its JSON names the config's version) for any stdin."""
    env = {"PYCNI_SOCKET": str(tmp_path / "none.sock")} | NO_FALLBACK
    shim, fwd = kinds.run(host, "bandwidth", command, stdin, env)
    assert fwd == shim


def test_no_stdin_at_all(kinds, host, tmp_path) -> None:
    """fd 0 closed: both read nothing, and the forwarder still hands the request on."""
    for command in ("VERSION", "ADD", "DEL"):
        shim, fwd = kinds.run(host, "loopback", command, b"", {"PYCNI_SOCKET": str(
            tmp_path / "none.sock")}, closed_stdin=True)
        assert fwd == shim, command


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "no-fallback"])
def test_daemon_down_or_stale_socket(kinds, host, pod, tmp_path, fallback) -> None:
    """No socket; then a socket file no one listens on (a stopped or restarting daemon)."""
    env = {"PYCNI_SOCKET": str(tmp_path / "none.sock")} | ({} if fallback else NO_FALLBACK)
    compare(kinds, host, pod, env)
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
        compare(kinds, host, pod, env | {"PYCNI_SOCKET": str(stale)},
                plugins=["bridge", "loopback"])
    shim, _ = kinds.run(host, "loopback", "ADD", conf("loopback"), env, pod.path)
    if not fallback:
        assert json.loads(shim[1])["code"] == 11 and "Connection refused" not in shim[1].decode()


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "no-fallback"])
def test_daemon_up(kinds, host, pod, start_daemon, fallback) -> None:  # noqa: F811
    daemon = start_daemon(host)
    env = daemon.fallback_env if fallback else daemon.env
    compare(kinds, host, pod, env)
    # Both went through the daemon: all but FOO (skel's) and the second DEL without a netns
    # (the first one's marker answers it), of each plugin, from each
    want = 2 * sum(1 for p in (*PLUGINS, UNKNOWN) for c, *_ in requests(p) if c != "FOO") \
        - len(PLUGINS) - 1
    wait_for(lambda: daemon.served() >= want, f"{want} requests served")


class Fake(threading.Thread):
    """A root listener on `path` acting a daemon's failure: 'refuse' (a REPLY without ACK),
    'close' (hang up before the ACK: a stopping daemon), 'ack-close' (ACK, then die: killed
    mid-verb), 'ack-cut' (ACK and half a reply)."""

    def __init__(self, path: Path, how: str) -> None:
        super().__init__(daemon=True)
        self.how, self.sock = how, socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stop, self.got = False, []

    def run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(30)
                head = conn.recv(proto.REQ_PREFIX, socket.MSG_WAITALL)
                size = proto.request_size(head) - len(head) if len(head) == proto.REQ_PREFIX \
                    else 0
                data = head + (conn.recv(size, socket.MSG_WAITALL) if size else b"")
                self.got.append(len(data))
                if self.how == "refuse":
                    conn.sendall(proto.encode_reply(1, proto.error_reply(
                        proto.IO_FAILURE, "the pycni daemon is busy \u00e9", b""), b""))
                elif self.how == "ack-close":
                    conn.sendall(proto.ACK)
                elif self.how == "ack-cut":
                    conn.sendall(proto.ACK + proto.encode_reply(0, b"x" * 100, b"")[:20])

    def __exit__(self, *exc) -> None:
        self.stop = True
        self.join(10)
        self.sock.close()

    def __enter__(self) -> Fake:
        self.start()
        return self


@pytest.mark.parametrize("how", ["refuse", "close", "ack-close", "ack-cut"])
@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "no-fallback"])
def test_a_daemon_that_fails(kinds, host, pod, tmp_path, how, fallback) -> None:
    path = tmp_path / "fake.sock"
    env = {"PYCNI_SOCKET": str(path)} | ({} if fallback else NO_FALLBACK)
    with Fake(path, how) as fake:
        sent = compare(kinds, host, pod, env, plugins=["bridge", "loopback", "portmap"],
                       only=("ADD", "DEL", "STATUS"))
        shim, _ = kinds.run(host, "loopback", "ADD", conf("loopback"), env)
    assert len(fake.got) >= sent and min(fake.got) > proto.REQ_PREFIX  # whole requests
    if how.startswith("ack"):  # accepted: never run again, 11 (the runtime retries)
        assert json.loads(shim[1])["code"] == 11 and "stopped while running" in shim[1].decode()


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "no-fallback"])
def test_a_non_root_listener_gets_nothing(kinds, host, pod, fallback) -> None:
    base = Path(tempfile.mkdtemp(prefix="pycni-fwd-evil-"))
    os.chmod(base, 0o755)
    home = base / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    path, log = home / "evil.sock", home / "got"
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
            "s.listen(16)\nwhile True:\n    c, _ = s.accept(); c.settimeout(2)\n"
            "    try: n = len(c.recv(65536))\n    except OSError: n = -1\n"
            "    open(sys.argv[2], 'a').write(f'{n}\\n'); c.close()\n")
    evil = subprocess.Popen(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                             "--clear-groups", "/usr/bin/python3", "-c", code, str(path), str(log)])
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {"PYCNI_SOCKET": str(path)} | ({} if fallback else NO_FALLBACK)
        sent = compare(kinds, host, pod, env, plugins=["bridge", "loopback"],
                       only=("ADD", "STATUS"))
        deadline = time.monotonic() + 60
        while (len(log.read_text().split()) if log.exists() else 0) < 2 * sent:
            assert time.monotonic() < deadline, "the listener saw fewer connections"
            time.sleep(0.1)
        assert set(log.read_text().split()) == {"0"}  # connected, and not a byte sent to it
    finally:
        evil.kill()
        evil.wait()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("name", ["loopback", "host-local", "bridge", "portmap", "bandwidth",
                                  "tuning", "firewall", "chain"])
def test_chains_through_both(kinds, netns_factory, start_daemon,  # noqa: F811
                             tmp_path, name) -> None:
    """ADD, CHECK, DEL twice, GC, STATUS and errors along each chain, as a runtime runs it, via
    the daemon; the chain also without it (in-process, the forwarder exec'ing the shim)."""
    host_a, host_b = netns_factory("pycni-host"), netns_factory("pycni-host")
    pod_a, pod_b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    daemon = start_daemon(host_a)
    envs = [daemon.env] + ([{"PYCNI_SOCKET": str(tmp_path / "none.sock")}]
                           if name == "chain" else [])
    for i, env in enumerate(envs):
        runs = []
        for j, (host, pod, bin_dir) in enumerate(((host_a, pod_a, kinds.py),
                                                   (host_b, pod_b, kinds.fwd))):
            tmp = tmp_path / f"{i}{j}"
            tmp.mkdir()
            plugins = Plugins(host, bin_dir=bin_dir)
            steps = run_chain(plugins, pod, scenario(name, tmp), env | {"CNI_PATH": str(kinds.fwd)})
            runs.append(normalize(steps, pod, tmp))
        assert runs[0] == runs[1]
    with contextlib.suppress(Exception):
        daemon.kill()
