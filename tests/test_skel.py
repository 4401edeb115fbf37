"""skel.run: env validation, version gating, error shapes; no root needed."""

from __future__ import annotations

import json
import subprocess

import pytest
from cnitest import BIN, ROOT, probe_binary

from cni import skel
from cni.spec.version import SUPPORTED

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc", "CNI_NETNS": "/run/netns/x",
       "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
CONF = b'{"cniVersion":"1.0.0","name":"net","type":"loopback"}'


def error_of(reply: skel.Reply) -> dict:
    assert reply.code == 1
    out = json.loads(reply.stdout)
    assert set(out) == {"cniVersion", "code", "msg", "details"}
    return out


def test_version_lists_every_supported_version() -> None:
    reply = skel.run("loopback", {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.1.0"}')
    assert reply.code == 0
    assert json.loads(reply.stdout) == {"cniVersion": "1.1.0",
                                        "supportedVersions": list(SUPPORTED)}


def test_no_command_prints_about_on_stderr() -> None:
    reply = skel.run("bridge", {}, b"")
    assert (reply.code, reply.stdout) == (0, b"")
    assert reply.stderr.startswith(b"CNI bridge plugin pycni")


def test_missing_env_names_the_variables() -> None:
    out = error_of(skel.run("loopback", {"CNI_COMMAND": "ADD"}, CONF))
    assert out["code"] == 4
    assert out["msg"] == ("required env variables "
                          "[CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing")


@pytest.mark.parametrize("var,value,msg", [
    ("CNI_CONTAINERID", "a/b", "invalid characters in containerID"),
    ("CNI_CONTAINERID", "../x", "invalid characters in containerID"),
    ("CNI_IFNAME", "x" * 16, "interface name is too long"),
    ("CNI_IFNAME", "..", "interface name is . or .."),
    ("CNI_IFNAME", "eth 0", "interface name contains / or : or whitespace characters"),
    ("CNI_IFNAME", "a:b", "interface name contains / or : or whitespace characters"),
    ("CNI_COMMAND", "FOO", "unknown CNI_COMMAND: FOO"),
    ("CNI_ARGS", "IgnoreUnknown", 'CNI_ARGS: invalid pair "IgnoreUnknown"'),
])
def test_invalid_env_is_code_4(var, value, msg) -> None:
    out = error_of(skel.run("loopback", ENV | {var: value}, CONF))
    assert (out["code"], out["msg"]) == (4, msg)


@pytest.mark.parametrize("stdin,code,fragment", [
    (b"{not json", 6, "error parsing network config"),
    (b"[1,2]", 6, "must be a JSON object"),
    (b"\xff\xfe", 6, "error parsing network config"),
    (b'{"cniVersion":"0.5.0","name":"n"}', 1, "incompatible CNI versions"),
    (b'{"cniVersion":"1.0.0","name":"../etc"}', 7, "invalid characters found in network name"),
    # found by the long fuzz: an empty object/list/0/false was taken for "absent" (0.1.0)
    (b'{"cniVersion":{},"name":"n"}', 6, "cniVersion must be a string"),
    (b'{"cniVersion":[],"name":"n"}', 6, "cniVersion must be a string"),
    (b'{"cniVersion":0,"name":"n"}', 6, "cniVersion must be a string"),
    (b'{"cniVersion":false,"name":"n"}', 6, "cniVersion must be a string"),
])
def test_bad_config(stdin, code, fragment) -> None:
    out = error_of(skel.run("loopback", ENV, stdin))
    assert out["code"] == code and fragment in out["msg"]
    if code == 1:  # the reference's split: the list in details
        assert out["details"].startswith('config is "0.5.0", plugin supports ["0.1.0" "0.2.0"')


@pytest.mark.parametrize("command,version", [("CHECK", "0.3.1"), ("GC", "1.0.0"),
                                              ("STATUS", "1.0.0")])
def test_verbs_gated_by_version(command, version) -> None:
    conf = json.dumps({"cniVersion": version, "name": "n", "type": "loopback"}).encode()
    out = error_of(skel.run("loopback", ENV | {"CNI_COMMAND": command}, conf))
    assert out["code"] == 1 and f"does not allow {command}" in out["msg"]
    assert out["cniVersion"] == version


@pytest.mark.parametrize("prev", [b'{"ips":[{"address":"x"}]}',
                                  b'{"ips":true}', b'{"ips":5}'])  # the last two: long fuzz
def test_bad_prev_result_is_a_decode_error(prev: bytes) -> None:
    conf = b'{"cniVersion":"1.0.0","name":"n","prevResult":' + prev + b'}'
    reply = skel.run("loopback", ENV, conf)
    assert error_of(reply)["code"] == 6 and b"Traceback" not in reply.stderr


def test_unexpected_exception_is_999_without_traceback_on_stdout(monkeypatch) -> None:
    def boom(req):
        raise RuntimeError("kaboom")
    import cni.plugins.loopback as lo
    monkeypatch.setattr(lo, "add", boom)
    reply = skel.run("loopback", ENV, CONF)
    out = error_of(reply)
    assert out["code"] == 999 and "kaboom" in out["msg"]
    assert b"Traceback" not in reply.stdout and b"Traceback" in reply.stderr


def test_version_via_binary_imports_nothing_heavy() -> None:
    """The exec'd binary answers VERSION without pyroute2, pydantic, click or libnftables."""
    out, code, loaded = probe_binary("loopback", {"CNI_COMMAND": "VERSION"})
    assert "supportedVersions" in out and code == 0
    assert loaded == []


@pytest.mark.parametrize("plugin", ["bridge", "host-local", "loopback", "portmap", "bandwidth"])
def test_each_link_answers_version_from_anywhere(plugin) -> None:
    proc = subprocess.run([str(BIN / plugin)], env={"CNI_COMMAND": "VERSION"},
                          input=b'{"cniVersion":"1.0.0"}', capture_output=True, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr
    speaks = list(SUPPORTED) if plugin != "bandwidth" else list(SUPPORTED[2:])  # 0.3.0 on
    assert json.loads(proc.stdout) == {"cniVersion": "1.0.0", "supportedVersions": speaks}


def test_root_is_a_real_checkout() -> None:
    assert (ROOT / "cni" / "skel.py").exists()
