"""IPAM delegation: our host-local in-process, anything else exec'd, same behaviour either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cnitest import loaded_by
from rootskips import have, missing
from test_host_local import GO, ROOT, conf, needs_go, reservations, store_files

from cni.ipam import delegate
from cni.skel import Request
from cni.spec.errors import CNIError


def request(config: dict, path: list[str], command: str = "ADD", cid: str = "ctr1",
            ifname: str = "eth0", cni_args: list[tuple[str, str]] | None = None) -> Request:
    stdin = json.dumps(config).encode()
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": ifname, "CNI_PATH": ":".join(path),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if cni_args:
        env["CNI_ARGS"] = ";".join(f"{k}={v}" for k, v in cni_args)
    return Request(plugin="bridge", command=command, container_id=cid, netns="/dev/null",
                   ifname=ifname, args=cni_args or [], path=path, config=config,
                   version=config["cniVersion"], stdin=stdin, env=env)


def bridge_conf(data_dir: Path, version: str = "1.0.0") -> dict:
    c = conf(data_dir, version, ranges=[[{"subnet": "10.110.0.0/24"}], [{"subnet": "fd00::/64"}]],
             routes=[{"dst": "0.0.0.0/0"}])
    return {**c, "type": "bridge", "bridge": "cni0"}


OURS_PATH = [str(ROOT / "bin")]
GO_PATH = ["/nonexistent", "/usr/lib/cni"]


def test_our_host_local_is_recognised_and_go_is_not(tmp_path):
    assert delegate.is_ours(delegate.find("host-local", OURS_PATH))
    if have(os.access(GO, os.X_OK), f"the reference host-local {GO}"):
        assert not delegate.is_ours(delegate.find("host-local", GO_PATH))
    # an installed copy elsewhere is recognised by its marker
    copy = tmp_path / "host-local"
    shutil.copy(ROOT / "bin" / "cni-plugin", copy)
    assert delegate.is_ours(str(copy))


def test_in_process_runs_without_exec(tmp_path, monkeypatch):
    def no_exec(*a, **kw):
        raise AssertionError("exec'd although in-process was possible")
    monkeypatch.setattr(subprocess, "run", no_exec)  # invoke imports it when it execs
    config = bridge_conf(tmp_path)
    result = delegate.add(request(config, OURS_PATH), "host-local")
    assert [ip["address"] for ip in result["ips"]] == ["10.110.0.2/24", "fd00::2/64"]
    delegate.check(request(config, OURS_PATH, "CHECK"), "host-local")
    delegate.delete(request(config, OURS_PATH, "DEL"), "host-local")
    assert reservations(tmp_path) == {}


@needs_go
@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_in_process_and_exec_reserve_alike(tmp_path, version):
    results, stores = [], []
    for path, data in ((OURS_PATH, tmp_path / "ours"), (GO_PATH, tmp_path / "go")):
        config = bridge_conf(data, version)
        got = [delegate.add(request(config, path, cid=f"c{i}"), "host-local") for i in range(3)]
        with pytest.raises(CNIError) as e:
            delegate.add(request(config, path, cid="c0"), "host-local")
        assert "duplicate allocation is not allowed" in e.value.msg
        assert e.value.code == 999
        results.append(got)
        stores.append(store_files(data))
        delegate.delete(request(config, path, "DEL", cid="c1"), "host-local")
        assert set(reservations(data)) == {"10.110.0.2", "fd00::2", "10.110.0.4", "fd00::4"}
    assert results[0] == results[1]
    assert stores[0] == stores[1]
    assert results[0][0]["routes"] == [{"dst": "0.0.0.0/0"}]


@needs_go
def test_exec_passes_cni_args(tmp_path):
    config = bridge_conf(tmp_path)
    result = delegate.add(request(config, GO_PATH, cni_args=[("IP", "10.110.0.77")]),
                          "host-local")
    assert result["ips"][0]["address"] == "10.110.0.77/24"


@pytest.mark.parametrize("path", [OURS_PATH, GO_PATH])
def test_errors_keep_their_code(tmp_path, path):
    if path == GO_PATH and not os.access(GO, os.X_OK):
        missing(f"the reference host-local {GO} (scripts/setup.sh installs "
                "containernetworking-plugins)")
    config = bridge_conf(tmp_path)
    config["ipam"]["ranges"] = [[{"subnet": "10.110.0.1/24"}]]
    with pytest.raises(CNIError) as e:
        delegate.add(request(config, path), "host-local")
    assert "host bits" in e.value.msg
    # the reference reports its config errors as 999; ours as 7 naming the key
    assert e.value.code == (7 if path == OURS_PATH else 999)
    assert not (tmp_path / "net1").exists()


def test_not_found_names_type_and_path():
    with pytest.raises(CNIError) as e:
        delegate.add(request({"cniVersion": "1.0.0", "name": "n"}, ["/a", "/b"]), "nope")
    assert e.value.msg == 'failed to find plugin "nope" in path [/a /b]'


@pytest.mark.parametrize("bad", ["../host-local", "/usr/lib/cni/host-local", "..", "", "a/b"])
def test_type_cannot_be_a_path(bad):
    with pytest.raises(CNIError) as e:
        delegate.add(request({"cniVersion": "1.0.0", "name": "n"}, OURS_PATH), bad)
    assert e.value.code == 7 and "ipam.type" in e.value.msg


def test_exec_non_json_error_is_quoted(tmp_path):
    fake = tmp_path / "fake-ipam"
    fake.write_text("#!/bin/sh\necho 'something broke' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(CNIError) as e:
        delegate.add(request({"cniVersion": "1.0.0", "name": "n"}, [str(tmp_path)]), "fake-ipam")
    # libcni's exec code, which the reference's pkg/ipam uses too: code 0, stderr quoted
    assert e.value.code == 0 and e.value.msg == 'netplugin failed: "something broke\\n"'



def test_exec_json_error_and_env(tmp_path):
    fake = tmp_path / "fake-ipam"
    fake.write_text('#!/bin/sh\ncat > "$0.stdin"\nenv > "$0.env"\n'
                    'echo \'{"code": 11, "msg": "busy", "details": "later"}\'\nexit 1\n')
    fake.chmod(0o755)
    config = {"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "fake-ipam"}}
    with pytest.raises(CNIError) as e:
        delegate.gc(request(config, [str(tmp_path)], "GC"), "fake-ipam")
    assert (e.value.code, e.value.msg, e.value.details) == (11, "busy", "later")
    assert json.loads((tmp_path / "fake-ipam.stdin").read_text()) == config
    env_lines = (tmp_path / "fake-ipam.env").read_text().splitlines()
    assert "CNI_COMMAND=GC" in env_lines and "CNI_CONTAINERID=ctr1" in env_lines


def test_exec_add_result_converted(tmp_path):
    fake = tmp_path / "fake-ipam"
    fake.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"cniVersion": "0.2.0", '
                    '"ip4": {"ip": "10.1.2.3/24", "gateway": "10.1.2.1"}}\'\n')
    fake.chmod(0o755)
    result = delegate.add(request({"cniVersion": "0.2.0", "name": "n"}, [str(tmp_path)]),
                          "fake-ipam")
    assert result["ips"] == [{"address": "10.1.2.3/24", "gateway": "10.1.2.1"}]


def test_delegation_imports_only_the_exec_module() -> None:
    """Bridge imports this on every exec: cni.runtime's chain, cache and conflist, and
    subprocess (imported when a plugin is exec'd), would cost each one ~5 ms."""
    assert loaded_by("cni.ipam.delegate", ("subprocess", "cni.runtime.chain",
                                           "cni.runtime.cache", "cni.runtime.conflist")) == []


def _bridge_check(config: dict, cid: str = "ctr1") -> Any:
    """skel.run of a bridge CHECK whose verb is only its IPAM's CHECK (the links and rules are
    other tests' business): the Reply, as the runtime would read it."""
    from cni import skel

    env = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid, "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(ROOT / "bin"),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return skel.run("bridge", env, json.dumps(config).encode())


@pytest.fixture
def ipam_only_bridge(monkeypatch):
    from cni import skel
    from cni.ipam import delegate as ipam

    bridge = skel.load("bridge")

    def check(req):
        ipam.check(req, req.config["ipam"]["type"])
        req.log("after IPAM")
    monkeypatch.setattr(bridge, "check", check)


def _added(tmp_path: Path, version: str = "1.0.0") -> dict:
    config = bridge_conf(tmp_path, version)
    result = delegate.add(request(config, OURS_PATH), "host-local")
    return config | {"prevResult": {"cniVersion": version, "interfaces": [],
                                    "ips": result["ips"], "routes": result["routes"]}}


def test_in_process_check_reads_the_config_once(tmp_path, monkeypatch, ipam_only_bridge):
    """The IPAM's CHECK in-process does not decode the stdin and prevResult skel has just
    decoded and checked for the main plugin (its own verb, the same input)."""
    from cni import skel

    config = _added(tmp_path)
    decoded: list[int] = []
    real = skel.decode_config
    monkeypatch.setattr(skel, "decode_config", lambda stdin: (decoded.append(1), real(stdin))[1])
    reply = _bridge_check(config)
    assert reply.code == 0, reply
    assert len(decoded) == 1


def _states(tmp_path: Path) -> list[tuple[str, dict]]:
    """Configs whose IPAM CHECK succeeds, and fails each way host-local fails it."""
    ok = _added(tmp_path)
    gone = json.loads(json.dumps(ok))
    gone["prevResult"]["ips"][0]["address"] = "10.110.0.99/24"  # not reserved for it
    bad = json.loads(json.dumps(ok))
    bad["ipam"]["ranges"] = [[{"subnet": "10.110.0.1/24"}]]  # host bits: error 7
    old = ok | {"cniVersion": "0.3.1"}  # CHECK is refused before 0.4.0
    weird = json.loads(json.dumps(ok))
    weird["ipam"]["dataDir"] = str(tmp_path / "file")  # a store that is a file: 999
    (tmp_path / "file").write_text("x")
    return [("ok", ok), ("gone", gone), ("bad", bad), ("old", old), ("weird", weird),
            ("other", ok | {"name": "net2"})]  # nothing reserved in that network


def test_in_process_check_answers_as_skel_run(tmp_path, monkeypatch, ipam_only_bridge):
    """The same Reply, byte for byte (result, error and code, the log lines), as the IPAM's
    CHECK run by skel.run on the main plugin's environment and stdin."""
    from cni import skel

    states = _states(tmp_path)
    fast = {name: _bridge_check(config) for name, config in states}
    monkeypatch.setattr(skel, "run_nested", lambda parent, plugin: skel.run(
        plugin, {**parent.env, "CNI_COMMAND": parent.command}, parent.stdin,
        parent.netns_fd))
    slow = {name: _bridge_check(config) for name, config in states}
    assert fast == slow
    assert fast["ok"].code == 0 and {r.code for n, r in fast.items() if n != "ok"} == {1}
    assert len({r.stdout for r in fast.values()}) == len(fast)  # each its own error


def test_is_ours_is_remembered_until_the_file_or_link_changes(tmp_path, monkeypatch):
    """A spare asks is_ours for every IPAM call: the path is resolved and the file read once,
    and again when the file (rewritten, replaced) or the symlink (re-pointed) changes."""
    import pathlib

    resolved: list[str] = []
    real = pathlib.Path.resolve
    monkeypatch.setattr(pathlib.Path, "resolve",
                        lambda self, *a, **k: (resolved.append(str(self)), real(self, *a, **k))[1])
    copy = tmp_path / "pycni-plugin"
    shutil.copy(ROOT / "bin" / "cni-plugin", copy)
    link = tmp_path / "host-local"
    link.symlink_to(copy.name)
    assert delegate.is_ours(str(link)) and delegate.is_ours(str(link))
    assert len(resolved) == 1, "asked again of a file and link that did not change"
    other = tmp_path / "other"
    other.write_bytes(b"#!/bin/sh\nexit 0\n")
    link.unlink()
    link.symlink_to(other.name)
    assert not delegate.is_ours(str(link))  # re-pointed
    other.write_bytes(copy.read_bytes())
    assert delegate.is_ours(str(link))  # the file it leads to rewritten, the link as it was
    assert len(resolved) == 3


def test_the_repo_executable_carries_the_marker():
    """is_ours remembers a file's answer whichever path leads to it: right only because the
    repo's executable (known by its path) carries the marker as installed copies do."""
    assert delegate.MARKER in (ROOT / "bin" / "cni-plugin").read_bytes()[:1024]
