"""Who is on the other end of the daemon's socket. The shim hands root's request (its
environment, namespaces and cwd) only to a root listener: one of another uid on the path is no
daemon (in-process, or error 11 naming why). A daemon's refusal (a reply without ACK) ran
nothing: in-process too. And a local user (nobody) can neither bind the daemon's path, nor
connect to its socket, nor, with the modes opened up, have a request run by it; the pods and
the daemon's service to root stay as they were. Nor can root without CAP_NET_ADMIN or
CAP_SYS_ADMIN, or root of a user namespace (peercaps.py): they get the EPERM an exec'd plugin
would, and the shim runs nothing in-process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cnitest import BIN, ROOT, VENV_PY, Netns, Plugins
from test_daemon import LOOPBACK, start_daemon, wait_for  # noqa: F401 (a fixture)

from cni.fast import protocol as proto
from cni.fast import status

pytestmark = pytest.mark.root
NOBODY = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
NOBODY_UID = 65534
PYTHON = "/usr/bin/python3"  # nobody's: the system's, no venv needed

# Listens on argv[1]; for each connection, prints how many bytes it got before the peer hung up
# (or went quiet for 3 s: the old shim waited for an answer).
LISTENER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(3)
    n = 0
    try:
        while chunk := c.recv(65536):
            n += len(chunk)
    except OSError:
        pass
    c.close()
    print(n, flush=True)
"""

# Tries to bind, then to connect to, argv[1]; prints the outcome of each (errno or "ok").
BIND_CONNECT = """
import socket, sys
for what in ("bind", "connect"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        getattr(s, what)(sys.argv[1])
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
"""


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory nobody can reach (0755, root's), outside pytest's private tmp tree."""
    base = Path(tempfile.mkdtemp(prefix="pycni-peers-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def lo_up(pod: Netns) -> bool:
    return "UP" in pod.links()["lo"]["flags"]


def lo_down(pod: Netns) -> None:
    """Down, as no loopback ADD left it (new_netns sets it up): an ADD that ran shows."""
    pod.run("ip", "link", "set", "lo", "down")


def test_the_shim_sends_nothing_to_a_listener_that_is_not_root(host, pod, plugins,
                                                                public_dir) -> None:
    """A PYCNI_SOCKET in a directory another user may write (here nobody's own): that user's
    listener gets zero bytes (before, it got the whole request); the call runs in-process."""
    theirs = public_dir / "nobodys"
    theirs.mkdir()
    os.chown(theirs, NOBODY_UID, NOBODY_UID)
    path = theirs / "pycni.sock"
    lo_down(pod)
    listener = subprocess.Popen([*NOBODY, PYTHON, "-I", "-c", LISTENER, str(path)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline() == "ready\n"
        assert os.stat(path).st_uid == NOBODY_UID
        env = {"PYCNI_SOCKET": str(path)}
        code, out, _ = plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                                    env=env | {proto.FALLBACK_ENV: "0"})
        assert listener.stdout.readline() == "0\n"
        assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER, out
        assert f"on {path} (the socket's listener runs as uid {NOBODY_UID}, not root)" in (
            out["msg"]), out
        assert not lo_up(pod)  # nothing ran
        out = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=env)
        assert listener.stdout.readline() == "0\n"
        assert out["interfaces"][0]["name"] == "lo" and lo_up(pod)  # in-process
        # pycni doctor's and pycni install's queries: no answer from a stranger either
        assert status.query(str(path)) is None
        assert listener.stdout.readline() == "0\n"
    finally:
        listener.kill()
        listener.wait()


class Refuser:
    """A root listener that answers every request as a daemon refusing it: a REPLY, no ACK."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.refused = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            if self.stopping:
                conn.close()
                return
            with conn:
                data = b""
                while len(data) < proto.REQ_PREFIX or len(data) < proto.request_size(
                        data[:proto.REQ_PREFIX]):
                    chunk, anc, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(16))
                    for _, _, fds in anc:  # the request's namespace and cwd fds
                        for i in range(0, len(fds) - len(fds) % 4, 4):
                            os.close(int.from_bytes(fds[i:i + 4], sys.byteorder))
                    if not chunk:
                        break
                    data += chunk
                err = proto.error_reply(proto.IO_FAILURE, "pycni daemon: refused for the test",
                                        b"")
                conn.sendall(proto.encode_reply(1, err, b""))
                self.refused += 1

    def close(self) -> None:
        self.stopping = True
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
            wake.connect(self.sock.getsockname())
        self.thread.join(10)
        self.sock.close()


def test_a_refusal_before_the_ack_ran_nothing_and_falls_back(host, pod, plugins,
                                                            public_dir) -> None:
    """A reply without ACK is the daemon refusing the request: it ran nothing, so the shim runs
    it in-process, or with the fallback off answers 11 (try again later), not the refusal's 5."""
    home = public_dir / "refuser"
    home.mkdir(mode=0o700)
    refuser = Refuser(home / "pycni.sock")
    lo_down(pod)
    try:
        env = {"PYCNI_SOCKET": str(home / "pycni.sock")}
        code, out, _ = plugins.exec("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo",
                                    env=env | {proto.FALLBACK_ENV: "0"})
        assert refuser.refused == 1
        assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER, out
        assert "it refused the request: pycni daemon: refused for the test" in out["msg"], out
        assert not lo_up(pod)
        out = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=env)
        assert refuser.refused == 2
        assert out["interfaces"][0]["name"] == "lo" and lo_up(pod)  # in-process
    finally:
        refuser.close()


def nobody_tries(path: Path) -> dict[str, str]:
    """nobody's bind and connect on `path`: {"bind": errno or "ok", "connect": ...}."""
    ran = subprocess.run([*NOBODY, PYTHON, "-I", "-c", BIND_CONNECT, str(path)],
                         capture_output=True, text=True, check=True)
    return dict(line.split() for line in ran.stdout.splitlines())


def nobody_calls(plugins: Plugins, pod: Netns, env: dict) -> tuple[int, dict]:
    """The loopback executable run by nobody, ADD into the pod, to the daemon in `env`."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "evil1", "CNI_NETNS": pod.path, "CNI_IFNAME": "lo",
            "CNI_PATH": str(BIN), **env}
    ran = subprocess.run(["ip", "netns", "exec", plugins.host.name, *NOBODY,
                          str(BIN / "loopback")], input=json.dumps(LOOPBACK).encode(),
                         capture_output=True, env=full, cwd="/")
    return ran.returncode, json.loads(ran.stdout)


def test_nobody_can_neither_bind_nor_reach_nor_use_the_daemons_socket(
        host, pod, plugins, start_daemon, public_dir) -> None:  # noqa: F811
    """test_daemon.test_socket_is_private_and_refuses_non_root_peers sends raw requests as
    nobody; here nobody runs the real executable and tries the paths too."""
    # Where the socket lives: the systemd unit's directory and socket modes, the default dir
    # (as this test's mount namespace has it, made as the unit makes it) and a daemon's own.
    unit = (ROOT / "conf" / "pycni.socket").read_text()
    for line in ("ListenStream=/run/pycni/pycni.sock", "SocketUser=root", "SocketMode=0600",
                 "DirectoryMode=0700"):
        assert line in unit.splitlines()
    assert nobody_tries(Path(proto.DEFAULT_SOCKET)) == {"bind": "13", "connect": "13"}
    daemon = start_daemon(host)
    assert nobody_tries(daemon.socket) == {"bind": "13", "connect": "13"}
    assert nobody_tries(daemon.socket.parent / "other.sock")["bind"] == "13"
    # A PYCNI_SOCKET in a directory nobody can write but can reach: still no bind.
    reachable = public_dir / "run"
    reachable.mkdir(mode=0o755)
    assert nobody_tries(reachable / "pycni.sock") == {"bind": "13", "connect": "2"}
    # A daemon refuses to listen in a directory others may write (they could replace the
    # socket file with theirs; the shim would refuse theirs, but requests would stop).
    loose = public_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    ran = subprocess.run([str(VENV_PY), "-m", "cni.fast.daemon", "--socket",
                          str(loose / "pycni.sock")], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert ran.returncode != 0 and "not be writable by others" in ran.stderr, ran.stderr
    assert not (loose / "pycni.sock").exists()
    # nobody's plugin call through the daemon's socket: not even connected (the modes) ...
    lo_down(pod)
    code, out = nobody_calls(plugins, pod, daemon.env)
    assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER and "Permission denied" in (
        out["msg"]), out
    # ... and with the modes opened up, refused by the daemon (SO_PEERCRED): ran nothing.
    run_dir, home, base = daemon.socket.parents[0:3]
    assert base.name.startswith("pycni-daemon-")  # never loosen anything but our own dirs
    for p in (base, home, run_dir):
        p.chmod(0o755)
    tried = nobody_tries(daemon.socket)  # the socket file's own mode (0600) refuses too
    assert tried["connect"] == "13" and tried["bind"] in ("13", "98"), tried
    daemon.socket.chmod(0o666)
    code, out = nobody_calls(plugins, pod, daemon.env)
    assert code == 1 and out["code"] == proto.INTERNAL, out  # final: an exec'd plugin's EPERM
    assert "pycni daemon: the caller (pid " in out["msg"] and f"runs as uid {NOBODY_UID}, " \
        "not root" in out["msg"] and out["msg"].endswith("operation not permitted"), out
    code, out = nobody_calls(plugins, pod, daemon.fallback_env)  # not in-process either
    assert code == 1 and out["code"] == proto.INTERNAL, out
    assert not lo_up(pod) and daemon.served() == 0
    assert daemon.log.read_text().count("refused a connection from") == 2
    # root's requests go on as before
    with contextlib.suppress(FileNotFoundError):
        os.unlink(daemon.socket.parent / "other.sock")
    out = plugins.ok("loopback", "ADD", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
    assert out["interfaces"][0]["name"] == "lo" and lo_up(pod)
    daemon.wait_served(1)


# --- callers that could not run a plugin themselves (peercaps.py) ---------------------------

CAPLESS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]  # root, no capability at all
USERNS_ROOT = ["unshare", "--user", "--map-root-user"]  # root of its own user namespace


def without(*caps: str) -> list[str]:
    """root, its exec'd program holding every capability but `caps`."""
    return ["setpriv", "--inh-caps=-all", "--bounding-set=" + ",".join(f"-{c}" for c in caps)]


def bridge_conf(tmp: Path) -> dict:
    return {"cniVersion": "1.0.0", "name": "capnet", "type": "bridge", "bridge": "capbr0",
            "isGateway": True, "ipam": {"type": "host-local", "dataDir": str(tmp / "ipam"),
                                        "ranges": [[{"subnet": "10.78.0.0/24"}]]}}


def bridge_as(wrapper: list[str], plugins: Plugins, pod: Netns, env: dict,
              conf: dict, cid: str) -> tuple[int, dict, str]:
    """The bridge executable (the shim) run under `wrapper`, ADD into the pod, to the daemon."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": cid, "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0",
            "CNI_PATH": str(BIN), **env}
    ran = subprocess.run(["ip", "netns", "exec", plugins.host.name, *wrapper,
                          str(BIN / "bridge")], input=json.dumps(conf).encode(),
                         capture_output=True, env=full, cwd="/", timeout=300)
    return ran.returncode, json.loads(ran.stdout), ran.stderr.decode()


def test_the_daemon_serves_only_callers_that_could_run_the_plugin(
        host, pod, plugins, start_daemon, public_dir, tmp_path) -> None:  # noqa: F811
    """A caller that is root without CAP_NET_ADMIN or CAP_SYS_ADMIN, or root of its own user
    namespace, or (the modes opened up) nobody, gets from the daemon what the reference bridge
    exec'd by it answers: 999, "... operation not permitted", exit 1; with or without the
    shim's fallback nothing runs (no bridge, no veth, no address, no IP allocated). Root with
    its capabilities is served."""
    daemon = start_daemon(host)
    run_dir, home, base = daemon.socket.parents[0:3]
    assert base.name.startswith("pycni-daemon-")  # (nobody reaches it: our own dirs only)
    for p in (base, home, run_dir):
        p.chmod(0o755)
    daemon.socket.chmod(0o666)
    conf = bridge_conf(tmp_path)
    callers = {"capless": (CAPLESS, "lacks CAP_NET_ADMIN and CAP_SYS_ADMIN (effective)"),
               "no-net-admin": (without("net_admin"), "lacks CAP_NET_ADMIN (effective)"),
               "no-sys-admin": (without("sys_admin"), "lacks CAP_SYS_ADMIN (effective)"),
               "userns": (USERNS_ROOT, "is in another user namespace than the daemon's"),
               "nobody": (NOBODY, f"runs as uid {NOBODY_UID}, not root")}
    for name, (wrapper, why) in callers.items():
        for env in (daemon.env, daemon.fallback_env):  # the shim's fallback off, then on
            code, out, err = bridge_as(wrapper, plugins, pod, env, conf, f"cap-{name}")
            assert code == 1 and out["code"] == proto.INTERNAL, (name, out, err)
            assert out["msg"].startswith("pycni daemon: the caller (pid ") and why in (
                out["msg"]) and out["msg"].endswith(": operation not permitted"), (name, out)
            assert out["cniVersion"] == "1.0.0"
            assert "capbr0" not in host.links() and set(pod.links()) == {"lo"}, name
            assert "10.78." not in json.dumps([host.ip("addr"), pod.ip("addr")]), name
            assert not (tmp_path / "ipam").exists(), name
    assert daemon.log.read_text().count("refused a connection from") == 2 * len(callers)
    assert daemon.status()["answered"] == 0 and daemon.served() == 0
    # root with its capabilities: served, the same request
    out = plugins.ok("bridge", "ADD", conf, netns=pod.path, ifname="eth0", env=daemon.env)
    assert out["ips"][0]["address"] == "10.78.0.2/24" and "capbr0" in host.links()
    assert "10.78.0.2/24" in pod.addresses("eth0")
    daemon.wait_served(1)


def test_the_peer_check_reads_the_process_that_connected(tmp_path) -> None:
    """peercaps on a real connection, both ways of naming its process (SO_PEERPIDFD, and
    pidfd_open of SO_PEERCRED's pid on kernels without it): the peer of a socket this process
    made is itself (root, every capability, the daemon's namespace); a peer that exited since
    its connect is refused, never judged by another process, even one its pid names now."""
    from cni.fast import peercaps

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "s"))
    server.listen(4)
    for peerpidfd in (True, False):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as me:
            me.connect(str(tmp_path / "s"))
            conn, _ = server.accept()
            with conn:
                assert peercaps.refusal(conn, os.getpid(), 0, peerpidfd) == ""
        gone = subprocess.Popen([PYTHON, "-I", "-c", "import socket, sys; s = socket.socket("
                                 "socket.AF_UNIX); s.connect(sys.argv[1]); print(1, flush=True);"
                                 " sys.stdin.read()", str(tmp_path / "s")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert gone.stdout.readline() == b"1\n"
        conn, _ = server.accept()
        with conn:
            assert peercaps.refusal(conn, gone.pid, 0, peerpidfd) == ""  # root, as we are
            gone.stdin.close()
            gone.wait()
            why = peercaps.refusal(conn, gone.pid, 0, peerpidfd)
            assert why.startswith(f"the caller (pid {gone.pid}) ") and why.endswith(
                ": operation not permitted"), why
            if peerpidfd:  # its pid now another's (here: ours, root with every capability):
                why = peercaps.refusal(conn, os.getpid(), 0)  # the pidfd says it is gone
                assert "exited or cannot be read" in why, why
    server.close()
