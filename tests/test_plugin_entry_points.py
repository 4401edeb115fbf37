"""Plugins of one's own, found by entry point (group pycni.plugins): the registry finds them,
skel dispatches to them with the whole contract (version gates, result conversion, error JSON),
the daemon's preload imports them and reports a broken one by name without stopping the others,
`pycni install` links them and bakes their VERSION answer into the executable (no metadata read
on the shim's path), uninstall takes them back, doctor names them. The fake distributions are
dist-info dirs on sys.path, as pip leaves them in site-packages."""

from __future__ import annotations

import json
import os
import subprocess

from click.testing import CliRunner
from cnitest import ROOT, VENV_PY
from plugin_dists import MODULE_PLUGIN, fake_dists_fixture  # noqa: F401 - the fixture

from cni import doctor, plugload, registry, skel
from cni import install as inst
from cni.cli import main
from cni.fast import preload, shim
from cni.install import entrypoints

# A third-party plugin as a class (module:object): ADD returns a result of the current version,
# skel prints it in the config's; CHECK refuses with a CNI error; it speaks 0.3.0 and later.
CLASS_PLUGIN = '''
from cni.api import CNIError, Code, Request

class Greeter:
    SUPPORTED_FROM = "0.3.0"

    def add(self, req: Request):
        return {"cniVersion": req.version, "interfaces": [{"name": req.ifname}],
                "ips": [{"address": "192.0.2.7/24", "interface": 0}]}

    def check(self, req: Request):
        raise CNIError(Code.INVALID_CONFIG, "greeter says no", req.network)

    def delete(self, req: Request):
        return None
'''
BROKEN_PLUGIN = "raise RuntimeError('cannot start')\n"
ENV = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
       "CNI_PATH": "/nonexistent"}


def conf(version: str, plugin: str) -> bytes:
    return json.dumps({"cniVersion": version, "name": "net", "type": plugin}).encode()


def test_discover_finds_entry_points_and_refuses_what_cannot_be_served(fake_dists) -> None:
    fake_dists("greeter-dist", {"greeter": "greeter_mod:Greeter", "bridge": "evil_mod",
                                ".hidden": "greeter_mod", "tiny": "tiny_mod"},
               {"greeter_mod": CLASS_PLUGIN, "tiny_mod": MODULE_PLUGIN})
    fake_dists("other-dist", {"tiny": "other_mod"}, {})
    found = registry.discover()
    assert found == {"greeter": "greeter_mod:Greeter"}
    assert registry.plugins()["bridge"] == "cni.plugins.bridge"  # a built-in is never shadowed
    assert "built-in" in registry.REFUSED["bridge"]
    assert "not a plain file name" in registry.REFUSED[".hidden"]
    assert "both" in registry.REFUSED["tiny"]
    assert "greeter" in registry.names()


def test_skel_serves_an_entry_point_plugin_with_the_contract(fake_dists) -> None:
    fake_dists("greeter-dist", {"greeter": "greeter_mod:Greeter", "tiny": "tiny_mod"},
               {"greeter_mod": CLASS_PLUGIN, "tiny_mod": MODULE_PLUGIN})
    # ADD's result converted to the config's version (0.3.1: ips carry "version")
    reply = skel.run("greeter", {**ENV, "CNI_COMMAND": "ADD"}, conf("0.3.1", "greeter"))
    assert reply.code == 0, reply
    out = json.loads(reply.stdout)
    assert out["cniVersion"] == "0.3.1" and out["ips"][0]["version"] == "4", out
    # its CNIError becomes the spec's error JSON, in the config's version
    reply = skel.run("greeter", {**ENV, "CNI_COMMAND": "CHECK"}, conf("1.0.0", "greeter"))
    assert reply.code == 1
    assert json.loads(reply.stdout) == {"cniVersion": "1.0.0", "code": 7,
                                        "msg": "greeter says no", "details": "net"}
    # its SUPPORTED_FROM gates the versions, and VERSION lists them
    reply = skel.run("greeter", {**ENV, "CNI_COMMAND": "ADD"}, conf("0.2.0", "greeter"))
    assert json.loads(reply.stdout)["code"] == 1, reply
    version = json.loads(skel.run("greeter", {"CNI_COMMAND": "VERSION"}, b"{}").stdout)
    assert version["supportedVersions"][0] == "0.3.0"
    # a plain module works the same; a 0.2.0 config gets the 0.2.0 shape
    reply = skel.run("tiny", {**ENV, "CNI_COMMAND": "ADD"}, conf("0.2.0", "tiny"))
    assert json.loads(reply.stdout)["ip4"] == {"ip": "198.51.100.9/24"}, reply


def test_installed_table_is_used_without_reading_metadata(fake_dists, monkeypatch) -> None:
    """The executable's baked table names the module: skel and the shim never read the entry
    points (importlib.metadata's walk of every dist-info costs tens of ms)."""
    fake_dists("tiny-dist", {}, {"tiny_mod": MODULE_PLUGIN})
    registry._found = None

    def no_metadata(*_a, **_k):
        raise AssertionError("entry points read")

    monkeypatch.setattr("importlib.metadata.entry_points", no_metadata)
    monkeypatch.setattr("importlib.metadata.distributions", no_metadata)
    registry.INSTALLED["tiny"] = ("tiny_mod", "0.4.0")
    reply = skel.run("tiny", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "tiny"))
    assert reply.code == 0, reply
    fast = shim.fast_version("tiny", b'{"cniVersion":"0.3.1"}')
    assert fast == skel.version_info("tiny", b'{"cniVersion":"0.3.1"}').encode()
    assert json.loads(fast) == {"cniVersion": "1.1.0",
                                "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}


def test_preload_reports_a_broken_plugin_by_name_and_serves_the_others(fake_dists,
                                                                        caplog) -> None:
    fake_dists("mixed", {"broken": "broken_mod", "tiny": "tiny_mod"},
               {"broken_mod": BROKEN_PLUGIN, "tiny_mod": MODULE_PLUGIN})
    failed = preload.load_entry_points()
    assert failed == ["broken"]
    assert "cannot start" in registry.REFUSED["broken"]
    assert "plugin broken not served" in caplog.text
    assert "tiny" in skel._loaded
    reply = skel.run("broken", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "broken"))
    assert reply.code == 1 and json.loads(reply.stdout)["code"] == 50, reply
    assert "cannot start" in json.loads(reply.stdout)["msg"]
    assert skel.run("tiny", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "tiny")).code == 0


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def test_install_links_entry_points_and_bakes_their_versions(fake_dists, tmp_path,
                                                             monkeypatch) -> None:
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.setattr(plugload, "PROBE_TIMEOUT", 5.0)
    site = fake_dists("mixed", {"greeter": "greeter_mod:Greeter", "broken": "broken_mod",
                                "hang": "hang_mod"},
                      {"greeter_mod": CLASS_PLUGIN, "broken_mod": BROKEN_PLUGIN,
                       "hang_mod": "import time\ntime.sleep(3600)\n"})
    real_sites = inst.site_dirs
    monkeypatch.setattr(inst, "site_dirs", lambda python: [*real_sites(python), str(site)])
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--no-systemd", "--no-compile")
    assert code == 0, out
    assert "skipped plugin broken" in out and not (bin_dir / "broken").exists()
    assert "skipped plugin hang" in out and "did not finish within 5s" in out  # install returns
    assert os.readlink(bin_dir / "greeter") == inst.MULTICALL
    manifest = inst.Manifest.load(bin_dir)
    assert manifest.plugins == {"greeter": "greeter_mod:Greeter"}
    assert str(bin_dir / "greeter") in [e.path for e in manifest.entries]
    text = (bin_dir / inst.MULTICALL).read_text()
    assert "_plugins = {'greeter': ('greeter_mod:Greeter', '0.3.0')}  # pycni:plugins" in text
    # exec'd as a runtime does, VERSION comes from the table: neither the plugin's module (not
    # on the executable's path at all) nor importlib.metadata is imported
    proc = subprocess.run([str(VENV_PY), "-IS", "-X", "importtime", str(bin_dir / "greeter")],
                          input=b'{"cniVersion":"0.4.0"}', env={"CNI_COMMAND": "VERSION"},
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"cniVersion": "0.4.0", "supportedVersions": [
        "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    imported = proc.stderr.decode()
    assert "importlib.metadata" not in imported and "greeter_mod" not in imported
    # doctor names what the registry serves and what it refused
    found = {f.what: f for f in doctor.plugin_findings()}
    assert found["plugin greeter"].status == doctor.OK
    assert found["plugin broken"].status == doctor.WARN
    assert "cannot start" in found["plugin broken"].detail
    # the package is gone: the next install drops its name; uninstall leaves nothing
    registry._found = {}
    registry.REFUSED.clear()
    monkeypatch.setattr(entrypoints, "plugin_table", lambda *_a: ({}, {}))
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--no-systemd", "--no-compile")
    assert code == 0, out
    assert not (bin_dir / "greeter").is_symlink()
    assert "_plugins = {}  # pycni:plugins" in (bin_dir / inst.MULTICALL).read_text()
    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 0, out
    assert not bin_dir.exists()


def test_builtins_resolve_through_the_registry_and_pyproject_declares_them() -> None:
    """The built-ins are entry points too (pyproject.toml): equal to registry.PLUGINS, which
    the shim and skel read without metadata. The editable install in .venv carries them."""
    import tomllib
    from importlib.metadata import entry_points

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][registry.GROUP] == registry.PLUGINS
    ours = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)
            if ep.dist is not None and ep.dist.name == "pycni"}
    assert ours == registry.PLUGINS, "re-run make setup after changing pyproject.toml"
    assert registry.discover(refresh=True) == {} and registry.REFUSED == {}
    for name, target in registry.PLUGINS.items():
        assert registry.target(name) == target


def test_attachments_name_the_entry_point_plugins_of_a_chain(fake_dists) -> None:
    """`pycni attachments` shows which of a chain's plugins are entry points (what they made is
    theirs to report, not judged by pycni)."""
    from cni import attachments

    fake_dists("greeter-dist", {"greeter": "greeter_mod:Greeter"}, {"greeter_mod": CLASS_PLUGIN})
    chain = [{"type": "bridge", "IPAM": {"Type": "greeter"}}, {"type": "portmap"}]
    assert attachments._entry_point_plugins(chain) == ["greeter"]
    att = attachments.Attachment("net", "c1", "eth0", plugins=["greeter"])
    assert att.owns() == ["plugin:greeter"] and att.to_json()["plugins"] == ["greeter"]


def test_a_plugin_installed_after_discovery_is_found_in_process_not_by_the_daemon(
        fake_dists) -> None:
    """In-process, a package pip-installed since the last discovery is found by the request for
    it (one metadata read). The daemon's table is fixed at its start (registry.fix): it reads
    no metadata at request time, and refuses the name (restart it) before its child becomes
    the caller (registry.refusal, asked by child.run_request first)."""
    fake_dists("early", {"tiny": "tiny_mod"}, {"tiny_mod": MODULE_PLUGIN})
    assert "greeter" not in registry.discover()
    site = fake_dists("late", {"greeter": "greeter_mod:Greeter"}, {"greeter_mod": CLASS_PLUGIN})
    registry._found = {"tiny": "tiny_mod"}  # as a discovery before it left it
    assert (site / "greeter_mod.py").is_file()
    reply = skel.run("greeter", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "greeter"))
    assert reply.code == 0, reply
    reply = skel.run("nosuch", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "nosuch"))
    assert json.loads(reply.stdout)["msg"] == 'unknown plugin "nosuch"'
    # the daemon: what it found at start, and nothing else
    registry._found = {"tiny": "tiny_mod"}
    del skel._loaded["greeter"]
    registry.fix()
    assert registry.refusal("tiny") is None and registry.refusal("bridge") is None
    code, msg = registry.refusal("greeter")
    assert code == 999 and "restart" in msg
    reply = skel.run("greeter", {**ENV, "CNI_COMMAND": "ADD"}, conf("1.0.0", "greeter"))
    assert "restart" in json.loads(reply.stdout)["msg"], reply
    assert registry.refusal("../x")[0] == 7 and registry.refusal("a b")[0] == 7
