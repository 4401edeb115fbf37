"""cni.runtime without root: request building, versions, conflist loading, the cache's bytes,
chains and errors, against small fake plugins that record what they were given."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from cni.runtime import conflist
from cni.runtime.cache import CachedAttachment, ResultCache, go_json
from cni.runtime.chain import (
    MultiError,
    Runtime,
    RuntimeConf,
    build_request,
    parse_valid_attachments,
    request_bytes,
    runtime_config,
)
from cni.runtime.invoke import find_in_path, plugin_error
from cni.spec.errors import CNIError

# A fake plugin: logs (command, CNI_* env, stdin) to $dir/calls.jsonl, then behaves as
# $dir/<name>.json says per command ({"stdout", "stderr", "exit"}); by default ADD passes
# prevResult on (or makes a result with one IP) and VERSION reports "versions".
FAKE = r'''#!{python} -S
import json, os, sys
name = os.path.basename(sys.argv[0]); here = os.path.dirname(os.path.abspath(sys.argv[0]))
cmd = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.read()
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps({{"plugin": name, "command": cmd, "env": env, "stdin": raw}}) + "\n")
spec = json.load(open(os.path.join(here, name + ".json")))
act = spec.get(cmd)
if act is not None:
    sys.stdout.write(act.get("stdout", "")); sys.stderr.write(act.get("stderr", ""))
    sys.exit(act.get("exit", 0))
conf = json.loads(raw) if raw else {{}}
version = conf.get("cniVersion", "")
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.1.0", "supportedVersions": spec["versions"]}}))
elif cmd == "ADD":
    prev = conf.get("prevResult")
    if prev is not None:
        out = dict(prev, cniVersion=version)
    elif version.startswith(("0.1", "0.2")):
        out = {{"cniVersion": version, "ip4": {{"ip": "10.1.0.2/24"}}}}
    else:
        out = {{"cniVersion": version, "interfaces": [{{"name": "eth0", "sandbox": "/x"}}],
               "ips": [{{"address": "10.1.0.2/24", "interface": 0}}]}}
    print(json.dumps(out))
'''

ALL = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


class Fakes:
    """A CNI_PATH directory of fake plugins, and a NETCONFPATH beside it."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.netconf = root / "net.d"
        self.cache_dir = root / "cache"
        self.bin.mkdir()
        self.netconf.mkdir()

    def plugin(self, name: str, versions: list[str] | None = None, **behaviour: Any) -> None:
        exe = self.bin / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
        (self.bin / f"{name}.json").write_text(json.dumps({"versions": versions or ALL,
                                                           **behaviour}))

    def conflist(self, name: str, plugins: list[dict], filename: str | None = None,
                 **extra: Any) -> conflist.NetworkConfigList:
        body = {"cniVersion": "1.1.0", "name": name, **extra, "plugins": plugins}
        path = self.netconf / (filename or f"10-{name}.conflist")
        path.write_text(json.dumps(body, indent=2))
        return conflist.load(self.netconf, name)

    def calls(self, command: str | None = None) -> list[dict]:
        log = self.bin / "calls.jsonl"
        if not log.exists():
            return []
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        for c in calls:
            c["conf"] = json.loads(c["stdin"]) if c["stdin"] else None
        return [c for c in calls if command is None or c["command"] == command]

    def runtime(self) -> Runtime:
        return Runtime([str(self.bin)], cache_dir=str(self.cache_dir))


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    return Fakes(tmp_path)


RT = RuntimeConf("ctr1", "/var/run/netns/pod1", "eth0", [("K8S_POD_NAME", "p")],
                 {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})

CANONICAL = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
             "ips": [{"interface": 0, "address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
             "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}

# ---- request building -------------------------------------------------------------------------


def test_name_and_version_are_injected_over_the_plugins_own() -> None:
    req = build_request({"type": "bridge", "name": "other", "cniVersion": "0.3.1", "mtu": 1400},
                        "net1", "1.0.0")
    assert req == {"type": "bridge", "name": "net1", "cniVersion": "1.0.0", "mtu": 1400}


CAP_ARGS = {
    "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {"ingressRate": 1000, "ingressBurst": 100},
    "ips": ["10.1.0.9/24"],
    "mac": "c2:11:22:33:44:55",
    "io.kubernetes.cri.pod-annotations": {"a": "b"},
    "dns": {"servers": ["1.1.1.1"]},
}


def test_runtime_config_holds_only_capabilities_declared_true() -> None:
    plugin = {"type": "x", "capabilities": {
        "portMappings": True, "bandwidth": True, "ips": True, "mac": True,
        "io.kubernetes.cri.pod-annotations": True, "dns": False, "aliases": True}}
    rc = runtime_config(plugin, CAP_ARGS)
    assert rc == {k: v for k, v in CAP_ARGS.items() if k != "dns"}
    req = build_request(plugin, "n", "1.1.0", capability_args=CAP_ARGS)
    assert req["runtimeConfig"] == rc
    # libcni leaves `capabilities` in the request; plugins tolerate it
    assert req["capabilities"] == plugin["capabilities"]


def test_no_capability_no_runtime_config_and_a_configured_one_is_kept() -> None:
    assert "runtimeConfig" not in build_request({"type": "x"}, "n", "1.1.0",
                                                capability_args=CAP_ARGS)
    own = {"type": "x", "runtimeConfig": {"mine": 1}, "capabilities": {"mac": True}}
    assert build_request(own, "n", "1.1.0")["runtimeConfig"] == {"mine": 1}
    assert build_request(own, "n", "1.1.0", capability_args=CAP_ARGS)["runtimeConfig"] == {
        "mac": CAP_ARGS["mac"]}


@pytest.mark.parametrize(("version", "expected"), [
    ("1.1.0", {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
               "ips": [{"interface": 0, "address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
               "routes": [{"dst": "0.0.0.0/0"}]}),  # libcni v1.3 leaves out an empty dns
    ("0.4.0", {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
               "ips": [{"version": "4", "interface": 0, "address": "10.1.0.2/24",
                        "gateway": "10.1.0.1"}],
               "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}),
    ("0.2.0", {"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.2/24", "gateway": "10.1.0.1",
                                              "routes": [{"dst": "0.0.0.0/0"}]}, "dns": {}}),
])
def test_prev_result_is_converted_to_the_requests_version(version: str, expected: dict) -> None:
    assert build_request({"type": "x"}, "n", version, CANONICAL)["prevResult"] == expected


def test_request_bytes_are_libcni_inject_conf_bytes() -> None:
    req = build_request({"type": "x", "b": "<&>", "a": {"z": 1, "y": 2.0}}, "n", "1.0.0",
                        CANONICAL)
    text = request_bytes(req).decode()
    # Go map: sorted keys, compact, HTML escaped, 2.0 printed as 2; prevResult a struct
    assert text.startswith('{"a":{"y":2,"z":1},"b":"\\u003c\\u0026\\u003e","cniVersion":"1.0.0",'
                           '"name":"n","prevResult":{"cniVersion":"1.0.0","interfaces":')
    assert text.endswith('"routes":[{"dst":"0.0.0.0/0"}]},"type":"x"}')  # no empty dns


def test_valid_attachments_take_libcnis_form() -> None:
    assert parse_valid_attachments([{"containerID": "c1", "ifname": "eth0"}]) == [("c1", "eth0")]
    with pytest.raises(CNIError):
        parse_valid_attachments([{"containerId": "c1"}])

# ---- conflists and versions -------------------------------------------------------------------


def test_cni_versions_pick_the_highest_we_speak() -> None:
    conf = conflist.from_bytes(json.dumps({
        "cniVersion": "0.3.1", "cniVersions": ["0.4.0", "1.0.0", "9.0.0"], "name": "n",
        "plugins": [{"type": "x"}]}).encode())
    assert conf.cni_version == "1.0.0"
    assert conf.offered_versions == ["1.0.0", "0.4.0", "0.3.1"]
    with pytest.raises(CNIError, match="invalid cniVersions entry 1.x at index 0"):
        conflist.from_bytes(b'{"name":"n","cniVersions":["1.x"],"plugins":[{"type":"x"}]}')


def test_conflist_keys_are_read_like_libcni(tmp_path: Path) -> None:
    conf = conflist.from_bytes(b'{"name":"n","cniVersion":"1.1.0","disableCheck":"TRUE",'
                               b'"disableGC":true,"plugins":[{"type":"x"}]}')
    assert conf.disable_check and conf.disable_gc and not conf.load_only_inlined_plugins
    for bad, msg in [(b'{"cniVersion":"1.0.0"}', "no name"),
                     (b'{"name":"n","plugins":[]}', "no plugins in list"),
                     (b'{"name":"n","plugins":[{"a":1}]}', "missing 'type'"),
                     (b'{"name":"n","disableCheck":"yes","plugins":[{"type":"x"}]}',
                      'invalid value "yes" for disableCheck')]:
        with pytest.raises(CNIError, match=msg) as e:
            conflist.from_bytes(bad)
        assert e.value.code == 7


def test_load_picks_by_name_conflists_first_then_single_confs(fakes: Fakes) -> None:
    d = fakes.netconf
    (d / "20-a.conflist").write_text('{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"y"}]}')
    (d / "10-a.conflist").write_text('{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"x"}]}')
    single = b'{"cniVersion":"0.4.0","name":"s","type":"bridge","bridge":"br9"}'
    (d / "05-s.conf").write_bytes(single)
    (d / "ignored.txt").write_text("{")
    assert conflist.load(d, "a").plugins == [{"type": "x"}]
    s = conflist.load(d, "s")
    assert (s.name, s.cni_version, s.plugins[0]["bridge"]) == ("s", "0.4.0", "br9")
    # libcni caches a wrapped single conf as the Go-marshalled list
    assert s.raw == (b'{"cniVersion":"0.4.0","name":"s","plugins":[{"bridge":"br9",'
                     b'"cniVersion":"0.4.0","name":"s","type":"bridge"}]}')
    with pytest.raises(CNIError, match=f'no net configuration with name "zz" in {d}'):
        conflist.load(d, "zz")
    with pytest.raises(CNIError, match="no net configurations found"):
        conflist.load(d / "nothing", "a")


def test_plugins_from_the_networks_directory_are_appended(fakes: Fakes) -> None:
    d = fakes.netconf
    (d / "n").mkdir()
    (d / "n" / "50-extra.conf").write_text('{"type":"tuning"}')
    (d / "10-n.conflist").write_text('{"cniVersion":"1.1.0","name":"n","plugins":[{"type":"x"}]}')
    assert [p["type"] for p in conflist.load(d, "n").plugins] == ["x", "tuning"]
    (d / "10-n.conflist").write_text('{"cniVersion":"1.1.0","name":"n",'
                                     '"loadOnlyInlinedPlugins":true,"plugins":[{"type":"x"}]}')
    assert [p["type"] for p in conflist.load(d, "n").plugins] == ["x"]


def test_without_cni_versions_every_plugin_gets_the_list_version(fakes: Fakes) -> None:
    fakes.plugin("old", versions=["0.4.0", "1.0.0"])
    conf = fakes.conflist("n", [{"type": "old"}], cniVersion="1.0.0")
    fakes.runtime().add(conf, RT)
    assert [c["command"] for c in fakes.calls()] == ["ADD"]  # no VERSION probe
    assert fakes.calls("ADD")[0]["conf"]["cniVersion"] == "1.0.0"


def test_cni_versions_negotiate_per_plugin_and_convert_prev_result(fakes: Fakes) -> None:
    fakes.plugin("old", versions=["0.3.1", "0.4.0", "1.0.0"])
    fakes.plugin("new")
    conf = fakes.conflist("n", [{"type": "old"}, {"type": "new"}],
                          cniVersions=["0.4.0", "1.0.0", "1.1.0"])
    runtime = fakes.runtime()
    final = runtime.add(conf, RT)
    adds = fakes.calls("ADD")
    assert [c["conf"]["cniVersion"] for c in adds] == ["1.0.0", "1.1.0"]
    assert adds[1]["conf"]["prevResult"]["cniVersion"] == "1.1.0"
    assert final is not None and final.version == "1.1.0"
    runtime.delete(conf, RT)
    dels = fakes.calls("DEL")
    assert [(c["plugin"], c["conf"]["prevResult"]["cniVersion"]) for c in dels] == [
        ("new", "1.1.0"), ("old", "1.0.0")]
    fakes.plugin("ancient", versions=["0.1.0", "0.2.0"])
    bad = fakes.conflist("b", [{"type": "ancient"}], cniVersions=["1.0.0"])
    with pytest.raises(CNIError, match="supports none of the network's versions") as e:
        runtime.add(bad, RT)
    assert e.value.code == 1

# ---- the cache's bytes ------------------------------------------------------------------------


def test_cache_file_is_libcnis_cached_info_byte_for_byte(tmp_path: Path) -> None:
    config = b'{\n  "cniVersion": "1.0.0", "name": "net1", "plugins": [{"type": "bridge"}]\n}\n'
    result = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/n"}],
              "ips": [{"interface": 0, "address": "10.1.0.2/24"}], "dns": {}}
    att = CachedAttachment("cid-1", "net1", "eth0", config, netns="/var/run/netns/p&1",
                           cni_args=[("IgnoreUnknown", "1"), ("K8S_POD_NAME", "web")],
                           capability_args={"portMappings": [{"hostPort": 80}], "mac": "m"},
                           result=result)
    path = ResultCache(tmp_path / "c").write(att)
    assert path == tmp_path / "c" / "results" / "net1-cid-1-eth0"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    b64 = base64.b64encode(config).decode()
    assert path.read_bytes() == (
        '{"kind":"cniCacheV1","containerId":"cid-1","config":"' + b64 + '","ifName":"eth0",'
        '"networkName":"net1","netns":"/var/run/netns/p\\u00261",'
        '"cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAME","web"]],'
        '"capabilityArgs":{"mac":"m","portMappings":[{"hostPort":80}]},'
        '"result":{"cniVersion":"1.0.0","dns":{},"interfaces":[{"name":"eth0","sandbox":"/n"}],'
        '"ips":[{"address":"10.1.0.2/24","interface":0}]}}').encode()
    assert base64.b64decode(json.loads(path.read_bytes())["config"]) == config
    back = ResultCache(tmp_path / "c").read("net1", "cid-1", "eth0")
    assert back == att


def test_cache_omits_empty_fields_and_reads_legacy_results(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    cache.write(CachedAttachment("c", "n", "eth0", b"{}"))
    assert cache.path("n", "c", "eth0").read_bytes() == (
        b'{"kind":"cniCacheV1","containerId":"c","config":"e30=","ifName":"eth0",'
        b'"networkName":"n"}')
    # Before cniCacheV1 the file was the bare result; libcni still reads it.
    cache.path("n", "old", "eth0").write_text('{"cniVersion":"0.4.0","ips":[]}')
    assert cache.read_result("n", "old", "eth0") == {"cniVersion": "0.4.0", "ips": []}
    assert [a.container_id for a in cache.attachments()] == ["c"]
    assert cache.attachments("c")[0].network == "n" and cache.attachments("zz") == []


def test_add_caches_the_conflist_bytes_and_final_result_after_the_chain(fakes: Fakes) -> None:
    fakes.plugin("a")
    fakes.plugin("b")
    conf = fakes.conflist("net1", [{"type": "a"}, {"type": "b"}])
    final = fakes.runtime().add(conf, RT)
    path = fakes.cache_dir / "results" / "net1-ctr1-eth0"
    cached = json.loads(path.read_bytes())
    assert base64.b64decode(cached["config"]) == (fakes.netconf / "10-net1.conflist").read_bytes()
    assert cached["result"] == json.loads(go_json(final.printable()))
    assert cached["cniArgs"] == [["K8S_POD_NAME", "p"]]
    assert cached["capabilityArgs"] == RT.capability_args
    assert cached["netns"] == RT.netns

# ---- chains -----------------------------------------------------------------------------------


def test_add_in_order_threads_prev_result_check_in_order_del_in_reverse(fakes: Fakes) -> None:
    for name in "abc":
        fakes.plugin(name)
    conf = fakes.conflist("net1", [{"type": "a"}, {"type": "b", "capabilities": {
        "portMappings": True}}, {"type": "c"}])
    runtime = fakes.runtime()
    runtime.add(conf, RT)
    adds = fakes.calls("ADD")
    assert [c["plugin"] for c in adds] == ["a", "b", "c"]
    assert "prevResult" not in adds[0]["conf"]
    assert adds[1]["conf"]["prevResult"]["ips"][0]["address"] == "10.1.0.2/24"
    assert adds[1]["conf"]["runtimeConfig"] == {"portMappings": RT.capability_args[
        "portMappings"]}
    assert "runtimeConfig" not in adds[0]["conf"]
    assert adds[0]["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1",
                              "CNI_NETNS": RT.netns, "CNI_ARGS": "K8S_POD_NAME=p",
                              "CNI_IFNAME": "eth0", "CNI_PATH": str(fakes.bin)}
    runtime.check(conf, RT)
    assert [c["plugin"] for c in fakes.calls("CHECK")] == ["a", "b", "c"]
    assert all(c["conf"]["prevResult"]["ips"] for c in fakes.calls("CHECK"))
    runtime.delete(conf, RT)
    assert [c["plugin"] for c in fakes.calls("DEL")] == ["c", "b", "a"]
    assert all(c["conf"]["prevResult"]["ips"] for c in fakes.calls("DEL"))
    assert not (fakes.cache_dir / "results" / "net1-ctr1-eth0").exists()


def test_add_failing_half_way_runs_nothing_else_and_caches_nothing(fakes: Fakes) -> None:
    fakes.plugin("a")
    fakes.plugin("b", ADD={"stdout": json.dumps({"cniVersion": "1.1.0", "code": 11,
                                                   "msg": "busy", "details": "later"}),
                           "exit": 1})
    fakes.plugin("c")
    conf = fakes.conflist("net1", [{"type": "a"}, {"type": "b", "name": "bee"}, {"type": "c"}])
    with pytest.raises(CNIError) as e:
        fakes.runtime().add(conf, RT)
    assert e.value.code == 11
    assert str(e.value) == 'plugin type="b" name="bee" failed (add): busy; later'
    assert [c["plugin"] for c in fakes.calls()] == ["a", "b"]
    assert not (fakes.cache_dir / "results").exists()


def test_check_and_del_follow_the_version_rules(fakes: Fakes) -> None:
    fakes.plugin("a")
    old = fakes.conflist("old", [{"type": "a"}], cniVersion="0.3.1")
    runtime = fakes.runtime()
    runtime.add(old, RT)
    with pytest.raises(CNIError, match='configuration version "0.3.1" does not support the '
                                       'CHECK command'):
        runtime.check(old, RT)
    runtime.delete(old, RT)
    assert "prevResult" not in fakes.calls("DEL")[0]["conf"]  # before 0.4.0: no cached result
    quiet = fakes.conflist("quiet", [{"type": "a"}], disableCheck=True)
    runtime.check(quiet, RT)
    assert fakes.calls("CHECK") == []


def test_del_without_a_cache_entry_still_runs_and_a_broken_one_is_dropped(fakes: Fakes) -> None:
    fakes.plugin("a")
    conf = fakes.conflist("net1", [{"type": "a"}])
    runtime = fakes.runtime()
    runtime.delete(conf, RT)
    assert "prevResult" not in fakes.calls("DEL")[0]["conf"]
    path = runtime.cache.path("net1", "ctr1", "eth0")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    runtime.delete(conf, RT)
    assert not path.exists()


def test_gc_dels_stale_attachments_then_gcs_plugins_and_collects_errors(fakes: Fakes) -> None:
    fakes.plugin("a", GC={"stdout": '{"code": 5, "msg": "gc a failed"}', "exit": 1})
    fakes.plugin("b")
    conf = fakes.conflist("net1", [{"type": "a"}, {"type": "b"}])
    other = fakes.conflist("net2", [{"type": "b"}])
    runtime = fakes.runtime()
    for cid in ("keep", "stale1", "stale2"):
        runtime.add(conf, RuntimeConf(cid, f"/run/netns/{cid}", "eth0"))
    runtime.add(other, RuntimeConf("stale1", "/run/netns/x", "eth0"))
    with pytest.raises(MultiError) as e:
        runtime.gc(conf, [("keep", "eth0")])
    assert [str(x) for x in e.value.errors] == ["failed to GC plugin a: gc a failed"]
    dels = fakes.calls("DEL")
    assert sorted({c["env"]["CNI_CONTAINERID"] for c in dels}) == ["stale1", "stale2"]
    assert all(c["conf"]["name"] == "net1" for c in dels)
    assert {d["env"]["CNI_NETNS"] for d in dels} == {"/run/netns/stale1", "/run/netns/stale2"}
    gcs = fakes.calls("GC")
    assert [c["plugin"] for c in gcs] == ["a", "b"]  # b still GC'd after a failed
    assert gcs[1]["conf"]["cni.dev/valid-attachments"] == [{"containerID": "keep",
                                                            "ifname": "eth0"}]
    assert gcs[1]["env"]["CNI_CONTAINERID"] == "" and gcs[1]["env"]["CNI_PATH"] == str(fakes.bin)
    left = sorted(p.name for p in (fakes.cache_dir / "results").iterdir())
    assert left == ["net1-keep-eth0", "net2-stale1-eth0"]


def test_gc_reports_failed_dels_and_honours_disable_gc_and_version(fakes: Fakes) -> None:
    fakes.plugin("a", DEL={"stderr": "cannot delete", "exit": 2})
    conf = fakes.conflist("net1", [{"type": "a"}])
    runtime = fakes.runtime()
    runtime.add(conf, RuntimeConf("c1", "/run/netns/c1", "eth0"))
    with pytest.raises(MultiError) as e:
        runtime.gc(conf, None)
    assert str(e.value.errors[0]) == ('failed to delete stale attachment c1 eth0: plugin '
                                      'type="a" failed (delete): netplugin failed: '
                                      '"cannot delete"')
    assert "cni.dev/valid-attachments" not in fakes.calls("GC")[0]["conf"]
    off = fakes.conflist("net1", [{"type": "a"}], disableGC=True)
    before = len(fakes.calls())
    runtime.gc(off, [])
    assert len(fakes.calls()) == before
    v10 = fakes.conflist("net1", [{"type": "a"}], cniVersion="1.0.0")
    with pytest.raises(MultiError):
        runtime.gc(v10, [])
    assert len(fakes.calls("GC")) == 1  # no GC below 1.1.0, only the stale DEL


def test_status_stops_at_the_first_error_with_its_code(fakes: Fakes) -> None:
    fakes.plugin("a", STATUS={"stdout": '{"code": 50, "msg": "no IPs left"}', "exit": 1})
    fakes.plugin("b")
    runtime = fakes.runtime()
    with pytest.raises(CNIError) as e:
        runtime.status(fakes.conflist("n", [{"type": "a"}, {"type": "b"}]))
    assert (e.value.code, e.value.msg) == (50, "no IPs left")
    assert [c["plugin"] for c in fakes.calls()] == ["a"]
    runtime.status(fakes.conflist("n", [{"type": "a"}], cniVersion="1.0.0"))
    assert len(fakes.calls()) == 1


def test_add_validates_the_attachment_like_libcni(fakes: Fakes) -> None:
    fakes.plugin("a")
    conf = fakes.conflist("n", [{"type": "a"}])
    for rt, code, msg in [(RuntimeConf("", "/n", "eth0"), 3, "missing containerID"),
                          (RuntimeConf("-x", "/n", "eth0"), 4, "invalid characters"),
                          (RuntimeConf("c", "/n", "a" * 16), 4, "interface name is too long"),
                          (RuntimeConf("c", "/n", "a b"), 4, "whitespace")]:
        with pytest.raises(CNIError, match=msg) as e:
            fakes.runtime().add(conf, rt)
        assert e.value.code == code
    assert fakes.calls() == []

# ---- errors -----------------------------------------------------------------------------------


def test_a_plugin_missing_from_cni_path(fakes: Fakes, tmp_path: Path) -> None:
    conf = fakes.conflist("n", [{"type": "nosuch"}])
    runtime = Runtime([str(fakes.bin), str(tmp_path / "other")], str(fakes.cache_dir))
    with pytest.raises(CNIError) as e:
        runtime.add(conf, RT)
    assert str(e.value) == (f'plugin type="nosuch" failed (add): failed to find plugin "nosuch" '
                            f'in path [{fakes.bin} {tmp_path / "other"}]')
    with pytest.raises(CNIError, match="invalid plugin name"):
        find_in_path("../x", [str(fakes.bin)])
    with pytest.raises(CNIError, match="no paths provided"):
        find_in_path("x", [])


def test_plugin_error_json_stdout_then_stderr_then_nothing() -> None:
    err = plugin_error(1, b'{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"d"}', b"log")
    assert (err.code, err.msg, err.details) == (7, "bad", "d")
    err = plugin_error(1, b"", b"panic: oops\n")
    assert (err.code, err.msg) == (0, 'netplugin failed: "panic: oops\\n"')
    assert plugin_error(3, b"", b"").msg == "netplugin failed with no error message: exit status 3"
    assert plugin_error(1, b"garbage", b"").msg.startswith(
        'netplugin failed but error parsing its diagnostic message "garbage"')


def test_exec_errors_keep_their_code_through_the_chain(fakes: Fakes) -> None:
    fakes.plugin("a", ADD={"stderr": "only stderr", "exit": 1})
    with pytest.raises(CNIError) as e:
        fakes.runtime().add(fakes.conflist("n", [{"type": "a"}]), RT)
    assert str(e.value) == 'plugin type="a" failed (add): netplugin failed: "only stderr"'
    fakes.plugin("a", ADD={"stdout": "not json"})
    with pytest.raises(CNIError, match="failed to unmarshal raw result") as e:
        fakes.runtime().add(fakes.conflist("n", [{"type": "a"}]), RT)
    assert e.value.code == 6


def test_version_info_of_a_plugin(fakes: Fakes) -> None:
    fakes.plugin("a", versions=["0.4.0", "1.0.0"])
    assert fakes.runtime().version_info("a") == {"cniVersion": "1.1.0",
                                                 "supportedVersions": ["0.4.0", "1.0.0"]}
    call = fakes.calls("VERSION")[0]
    assert call["conf"] == {"cniVersion": "1.1.0"}
    assert (call["env"]["CNI_NETNS"], call["env"]["CNI_IFNAME"], call["env"]["CNI_PATH"]) == (
        "dummy", "dummy", "dummy")


def test_the_runtime_imports_nothing_heavy() -> None:
    import subprocess

    code = ("import sys, cni.runtime, cni.runtime.chain; "
            "print([m for m in ('pydantic', 'pyroute2', 'click', "
            "'cni.plugins') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"
