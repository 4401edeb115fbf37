"""The shim without a daemon: VERSION answered locally with skel's exact bytes, stdlib only,
and the protocol's framing. (The daemon path is in test_daemon.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from cnitest import BIN, ROOT, VENV_PY
from hypothesis import given
from hypothesis import strategies as st

from cni import registry, skel
from cni.fast import protocol as proto
from cni.fast import shim
from cni.spec import version as versions

PLUGINS = sorted(registry.NAMES)

# Runs the shim the way bin/cni-plugin does, then lists what it imported (to a file: the shim
# owns stdout and stderr).
PROBE = r"""
import sys
sys.path[:0] = [{root!r}]
from cni.fast.main import main
rc = main({plugin!r})
with open({out!r}, "w") as f:
    f.write("\n".join(sorted(sys.modules)))
sys.exit(rc)
"""
# What the shim itself may import from the project: all stdlib-only modules.
OWN_MODULES = {"cni", "cni.fast", "cni.fast.main", "cni.fast.shim", "cni.fast.protocol",
               "cni.deleted", "cni.host", "cni.host.nsfd", "cni.registry"}
# Stdlib modules that cost more than interpreter start-up: not on the hot paths. And os: 1-2 ms
# of CPU (os.environ, _collections_abc, posixpath), a fifth of the shim's own (posix does).
EXPENSIVE = {"json", "re", "dataclasses", "typing", "enum", "socket", "inspect", "ast", "os"}


def run_probe(tmp_path, plugin: str, env: dict, stdin: bytes,
              wrap: tuple[str, ...] = ()) -> tuple[int, bytes, set[str]]:
    out = tmp_path / "modules.txt"
    code = PROBE.format(root=str(ROOT), plugin=plugin, out=str(out))
    proc = subprocess.run([*wrap, str(VENV_PY), "-IS", "-c", code], input=stdin, env=env,
                          capture_output=True)
    return proc.returncode, proc.stdout, set(out.read_text().split())


def assert_stdlib_only(modules: set[str]) -> None:
    foreign = {m for m in modules
               if m.split(".")[0] not in sys.stdlib_module_names and m not in OWN_MODULES
               and m != "__main__"}
    assert not foreign, f"the shim imported non-stdlib modules: {sorted(foreign)}"


def test_constants_equal_the_ones_they_copy() -> None:
    assert shim.SUPPORTED == versions.SUPPORTED
    assert shim.CURRENT == versions.CURRENT
    assert shim.MAX_STDIN == skel.MAX_STDIN
    assert proto.MAX_REQUEST > skel.MAX_STDIN


@pytest.mark.parametrize("plugin", PLUGINS)
def test_version_path_imports_only_cheap_stdlib(tmp_path, plugin) -> None:
    code, out, modules = run_probe(tmp_path, plugin, {"CNI_COMMAND": "VERSION"},
                                   b'{"cniVersion":"1.0.0"}')
    assert code == 0
    assert out == skel.version_info(plugin, b'{"cniVersion":"1.0.0"}').encode()
    assert_stdlib_only(modules)
    assert not modules & EXPENSIVE, sorted(modules & EXPENSIVE)


STDINS = [b"", b"   ", b"{}", b" { } ", b'{"cniVersion":"1.0.0"}', b'{"cniVersion":"0.4.0"}',
          b'{"cniVersion": "1.1.0"}\n', b'\t{ "cniVersion" :\t"0.3.1" }\r\n',
          b'{"cniVersion":"9.9.9"}', b'{"cniVersion":""}', b'{"cniVersion":"1.0.0","x":1}',
          b'{"x":1,"cniVersion":"0.4.0"}', b'{"cniVersion":"0.4.0","cniVersion":"1.0.0"}',
          b'{"cniVersion":1}', b'{"cniVersion":null}', b'{"cniVersion":"1.0\\u002e0"}',
          b'{"cniVersion":"0.4.0"', b"[]", b"null", b"not json", b'"1.0.0"',
          b'\xef\xbb\xbf{"cniVersion":"0.4.0"}', '{"cniVersion":"1.0.0é"}'.encode(),
          b'{"cniVersion":"1.0.0\x01"}', b'{"cniVersion":"0.4.0"}}', b'{{"cniVersion":"0.4.0"}',
          b'{"cniVersion:"0.4.0"}', b'{"cniVersion""0.4.0"}']


@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("stdin", STDINS)
def test_fast_version_is_skels_answer_or_defers(plugin, stdin) -> None:
    fast = shim.fast_version(plugin, stdin)
    if fast is not None:
        assert fast == skel.version_info(plugin, stdin).encode()


@pytest.mark.parametrize("stdin", [b"", b"{}", b'{"cniVersion":"1.1.0"}',
                                   b'{"cniVersion":"0.3.1"}', b'{"cniVersion": "9.9.9"}'])
def test_the_runtimes_shapes_are_answered_locally(stdin) -> None:
    assert shim.fast_version("loopback", stdin) is not None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(versions.SUPPORTED + ("2.0.0",))
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["cniVersion", "name", "x"]), inner, max_size=3),
    max_leaves=6)


@given(value=json_values, indent=st.sampled_from([None, 0, 2]))
def test_fast_version_agrees_with_skel_on_any_json(value, indent) -> None:
    stdin = json.dumps(value, indent=indent).encode()
    fast = shim.fast_version("bridge", stdin)
    assert fast is None or fast == skel.version_info("bridge", stdin).encode()


@given(stdin=st.binary(max_size=40))
def test_fast_version_agrees_with_skel_on_any_bytes(stdin) -> None:
    fast = shim.fast_version("loopback", stdin)
    assert fast is None or fast == skel.version_info("loopback", stdin).encode()


@pytest.mark.parametrize("plugin", PLUGINS)
def test_executables_answer_version_and_about_like_skel(plugin) -> None:
    for stdin in (b'{"cniVersion":"1.1.0"}', b'{"cniVersion":"0.4.0","name":"x"}', b"junk"):
        proc = subprocess.run([str(BIN / plugin)], input=stdin, capture_output=True,
                              env={"CNI_COMMAND": "VERSION"})
        want = skel.run(plugin, {"CNI_COMMAND": "VERSION"}, stdin)
        assert (proc.stdout, proc.stderr, proc.returncode) == (want.stdout, want.stderr,
                                                               want.code)
    proc = subprocess.run([str(BIN / plugin)], capture_output=True, env={})
    assert proc.stderr == skel.run(plugin, {}, b"").stderr and proc.returncode == 0


def test_no_daemon_runs_in_process_with_skels_answer(tmp_path) -> None:
    """No socket: the error (here: missing env) comes from skel, in-process, byte for byte."""
    env = {"CNI_COMMAND": "ADD", "PYCNI_SOCKET": str(tmp_path / "none.sock")}
    stdin = b'{"cniVersion":"1.0.0","name":"n","type":"loopback"}'
    proc = subprocess.run([str(BIN / "loopback")], input=stdin, env=env, capture_output=True)
    want = skel.run("loopback", env, stdin)
    assert (proc.stdout, proc.stderr, proc.returncode) == (want.stdout, want.stderr, want.code)
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == 4


@pytest.mark.parametrize("command", ["ADD", "CHECK", "DEL", "GC", "STATUS"])
def test_no_daemon_with_the_fallback_off_is_error_11_naming_the_socket(tmp_path,
                                                                      command) -> None:
    """PYCNI_SHIM_FALLBACK=0: nothing runs in-process (skel, the plugins are never imported);
    the answer is 11, try again later (nothing ran: the daemon never ACKed), naming the socket.
    VERSION is still the shim's own."""
    sock = tmp_path / "none.sock"
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(BIN), "PYCNI_SOCKET": str(sock),
           proto.FALLBACK_ENV: "0"}
    stdin = b'{"cniVersion":"1.1.0","name":"n","type":"loopback"}'
    code, out, modules = run_probe(tmp_path, "loopback", env, stdin)
    err = json.loads(out)
    assert code == 1 and err["code"] == proto.TRY_AGAIN_LATER, err
    assert err["cniVersion"] == "1.1.0"
    assert err["msg"] == (f"no pycni daemon took the request on {sock} (connect: No such file "
                          f"or directory), and {proto.FALLBACK_ENV}=0 forbids running it "
                          "in-process")
    assert not {"cni.skel", "cni.plugins.loopback"} & modules
    code, out, _ = run_probe(tmp_path, "loopback", env | {"CNI_COMMAND": "VERSION"}, stdin)
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"


def own_imports(exe, env: dict, stdin: bytes) -> tuple[int, bytes, set[str]]:
    """Exec `exe` as a runtime does (under -X importtime): its code, its output, and which of
    the project's modules it imported."""
    proc = subprocess.run([str(VENV_PY), "-IS", "-X", "importtime", str(exe)], input=stdin,
                          env=env, capture_output=True, cwd="/", timeout=60)
    names = {line.rpartition("|")[2].strip() for line in proc.stderr.decode().splitlines()
             if line.startswith("import time:")}
    return proc.returncode, proc.stdout, {n for n in names if n.split(".")[0] == "cni"}


def test_an_installed_executable_imports_four_of_our_modules(tmp_path) -> None:
    """Each module of ours an exec imports costs ~0.1-0.2 ms of CPU (a fresh interpreter's
    import machinery, cold). An installed executable calling the daemon imports cni, cni.fast,
    the shim and the protocol: not cni.registry (its table is the shim's to fill, on the paths
    that read it) nor cni.fast.main; VERSION the registry instead of the protocol."""
    from cni import install

    exe = tmp_path / "loopback"
    exe.write_bytes(install.render_multicall(install.venv_python(), install.ROOT))
    exe.chmod(0o755)
    path = tmp_path / "d.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def daemon() -> None:  # takes the request and answers it, as a daemon's child would
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(proto.ACK + proto.encode_reply(0, b'{"done": 1}', b""))

    answering = threading.Thread(target=daemon)
    answering.start()
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(BIN), "PYCNI_SOCKET": str(path),
           proto.FALLBACK_ENV: "0"}
    try:
        code, out, ours = own_imports(exe, env,
                                      b'{"cniVersion":"1.1.0","name":"n","type":"loopback"}')
    finally:
        answering.join(10)
        listener.close()
    assert (code, out) == (0, b'{"done": 1}')
    assert ours == {"cni", "cni.fast", "cni.fast.shim", "cni.fast.protocol"}
    code, out, ours = own_imports(exe, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    assert code == 0 and out == skel.version_info("loopback", b'{"cniVersion":"1.0.0"}').encode()
    assert ours == {"cni", "cni.fast", "cni.fast.shim", "cni.registry"}


def test_a_del_with_a_namespace_skips_the_marker_check_and_its_imports(tmp_path) -> None:
    """A DEL with CNI_NETNS goes to the daemon without cni.deleted's check (only a DEL without a
    namespace can be answered by a marker): no os or cni.deleted on its path (~1 ms of an
    exec's CPU). Without a namespace the check still runs."""
    sock = tmp_path / "none.sock"
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(BIN), "PYCNI_SOCKET": str(sock),
           proto.FALLBACK_ENV: "0"}
    stdin = b'{"cniVersion":"1.1.0","name":"n","type":"loopback"}'
    code, out, modules = run_probe(tmp_path, "loopback", env, stdin)
    assert code == 1 and json.loads(out)["code"] == proto.TRY_AGAIN_LATER
    assert not {"os", "cni.deleted"} & modules, sorted({"os", "cni.deleted"} & modules)
    code, out, modules = run_probe(tmp_path, "loopback", env | {"CNI_NETNS": ""}, stdin)
    assert code == 1 and "cni.deleted" in modules


def test_request_and_reply_round_trip() -> None:
    env = {b"CNI_COMMAND": b"ADD", b"A": b"x=y", b"B": b"\xff"}
    data = proto.encode_request("bridge", proto.encode_env(env), b"{}\n", 0b1011, 0o027)
    assert proto.request_size(data[:proto.REQ_PREFIX]) == len(data)
    plugin, block, stdin, roles, umask = proto.decode_request(data)
    assert (plugin, stdin, roles, umask) == ("bridge", b"{}\n", 0b1011, 0o027)
    assert proto.decode_env(block) == {k.decode(): os.fsdecode(v) for k, v in env.items()}
    reply = proto.encode_reply(-3, b"out", b"err!")
    code, out_len, err_len = proto.reply_sizes(reply[:proto.REPLY_PREFIX])
    body = reply[proto.REPLY_PREFIX:]
    assert (code, body[:out_len], body[out_len:]) == (-3, b"out", b"err!")
    with pytest.raises(ValueError):
        proto.request_size(b"GET / HTTP/1.1\r\n\r\n"[:proto.REQ_PREFIX])


@pytest.mark.parametrize(("stdin", "version"), [
    (b'{"cniVersion":"0.4.0"}', "0.4.0"), (b'{"name":"x"}', "0.1.0"), (b"junk", "1.1.0"),
    (b"[1]", "1.1.0"), (b'{"cniVersion":7}', "1.1.0")])
def test_errors_the_shim_makes_use_the_version_skel_would(stdin, version) -> None:
    out = json.loads(proto.error_reply(11, "try again", stdin))
    assert out == {"cniVersion": version, "code": 11, "msg": "try again", "details": ""}
