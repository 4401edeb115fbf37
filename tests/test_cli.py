"""The `pycni` command as cnitool users drive it: environment, container ID rule, output, exit
codes, the cache directory option, lazy commands. Fake plugins, no root."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from cnitest import loaded_by
from test_runtime import Fakes

from cni import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    (tmp_path / "fakes").mkdir()
    return Fakes(tmp_path / "fakes")


def pycni(f: Fakes, *args: str, cwd: Path | None = None,
          **env: str) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETCONFPATH": str(f.netconf),
            "CNI_PATH": str(f.bin), "PYCNI_CACHE_DIR": str(f.cache_dir),
            "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "cni.cli", *args], env=full, cwd=cwd or ROOT,
                          capture_output=True, text=True)


def cnitool_id(netns: str) -> str:
    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def test_add_prints_the_result_and_caches_under_cnitools_container_id(fakes: Fakes,
                                                                        tmp_path: Path) -> None:
    fakes.plugin("a")
    fakes.conflist("net1", [{"type": "a", "capabilities": {"portMappings": True}}])
    cap = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
           "mac": "c2:00:00:00:00:01"}
    # a relative netns path is made absolute first, as cnitool's filepath.Abs does
    out = pycni(fakes, "add", "net1", "pod1", cwd=tmp_path, CNI_ARGS="IgnoreUnknown=1;A=b",
                CAP_ARGS=json.dumps(cap))
    assert out.returncode == 0, out.stderr
    netns = str(tmp_path / "pod1")
    cid = cnitool_id(netns)
    assert len(cid) == len("cnitool-") + 20
    result = json.loads(out.stdout)
    assert result["ips"] == [{"interface": 0, "address": "10.1.0.2/24"}]
    assert out.stdout.startswith('{\n    "cniVersion": "1.1.0",\n    "interfaces": [')
    call = fakes.calls("ADD")[0]
    assert call["env"]["CNI_CONTAINERID"] == cid
    assert call["env"]["CNI_NETNS"] == netns
    assert call["env"]["CNI_IFNAME"] == "eth0"
    assert call["env"]["CNI_ARGS"] == "IgnoreUnknown=1;A=b"
    assert call["conf"]["runtimeConfig"] == {"portMappings": cap["portMappings"]}
    cached = json.loads((fakes.cache_dir / "results" / f"net1-{cid}-eth0").read_text())
    assert cached["cniArgs"] == [["IgnoreUnknown", "1"], ["A", "b"]]
    assert cached["capabilityArgs"] == cap

    assert pycni(fakes, "check", "net1", netns).returncode == 0
    assert pycni(fakes, "del", "net1", netns).returncode == 0
    assert [c["command"] for c in fakes.calls()] == ["ADD", "CHECK", "DEL"]
    assert not (fakes.cache_dir / "results" / f"net1-{cid}-eth0").exists()


def test_ifname_and_container_id_from_option_and_environment(fakes: Fakes) -> None:
    fakes.plugin("a")
    fakes.conflist("net1", [{"type": "a"}])
    assert pycni(fakes, "add", "net1", "/run/netns/x", CNI_IFNAME="net7").returncode == 0
    assert pycni(fakes, "add", "net1", "/run/netns/x", "-i", "net8", CNI_IFNAME="net7",
                 CNI_CONTAINERID="mine").returncode == 0
    got = [(c["env"]["CNI_CONTAINERID"], c["env"]["CNI_IFNAME"]) for c in fakes.calls("ADD")]
    assert got == [(cnitool_id("/run/netns/x"), "net7"), ("mine", "net8")]
    names = sorted(p.name for p in (fakes.cache_dir / "results").iterdir())
    assert names == sorted([f"net1-{cnitool_id('/run/netns/x')}-net7", "net1-mine-net8"])


def test_cache_dir_option_wins_over_the_environment(fakes: Fakes, tmp_path: Path) -> None:
    fakes.plugin("a")
    fakes.conflist("net1", [{"type": "a"}])
    out = pycni(fakes, "add", "net1", "/run/netns/x", "--cache-dir", str(tmp_path / "other"))
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "other" / "results").iterdir())) == 1
    assert not (fakes.cache_dir / "results").exists()


def test_errors_go_to_stderr_with_exit_1(fakes: Fakes) -> None:
    fakes.plugin("a", ADD={"stdout": '{"code": 7, "msg": "invalid config", "details": "x"}',
                           "exit": 1})
    fakes.conflist("net1", [{"type": "a"}])
    out = pycni(fakes, "add", "net1", "/run/netns/x")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == 'plugin type="a" failed (add): invalid config; x\n'
    assert not (fakes.cache_dir / "results").exists()
    out = pycni(fakes, "add", "nosuch", "/run/netns/x")
    assert out.returncode == 1
    assert out.stderr == f'no net configuration with name "nosuch" in {fakes.netconf}\n'
    out = pycni(fakes, "add", "net1", "/run/netns/x", CNI_ARGS="A=b;broken")
    assert (out.returncode, out.stderr) == (1, 'invalid CNI_ARGS pair "broken"\n')
    out = pycni(fakes, "add", "net1", "/run/netns/x", CAP_ARGS="{")
    assert out.returncode == 1 and "CAP_ARGS" in out.stderr


def test_gc_takes_valid_attachments_and_status_takes_the_network(fakes: Fakes) -> None:
    fakes.plugin("a")
    fakes.conflist("net1", [{"type": "a"}])
    for ns in ("/run/netns/keep", "/run/netns/gone"):
        assert pycni(fakes, "add", "net1", ns).returncode == 0
    valid = json.dumps([{"containerID": cnitool_id("/run/netns/keep"), "ifname": "eth0"}])
    out = pycni(fakes, "gc", "net1", "--valid-attachments", valid)
    assert out.returncode == 0, out.stderr
    assert [c["env"]["CNI_CONTAINERID"] for c in fakes.calls("DEL")] == [
        cnitool_id("/run/netns/gone")]
    assert fakes.calls("GC")[0]["conf"]["cni.dev/valid-attachments"] == json.loads(valid)
    assert [p.name for p in (fakes.cache_dir / "results").iterdir()] == [
        f"net1-{cnitool_id('/run/netns/keep')}-eth0"]
    # cnitool's form (a netns argument, no list): everything cached is stale
    assert pycni(fakes, "gc", "net1", "/run/netns/any").returncode == 0
    assert list((fakes.cache_dir / "results").iterdir()) == []
    assert pycni(fakes, "gc", "net1", "--valid-attachments", "[{}]").returncode == 1
    assert pycni(fakes, "status", "net1").returncode == 0
    assert fakes.calls("STATUS")[0]["env"]["CNI_COMMAND"] == "STATUS"


def test_version_lists_what_each_plugin_supports(fakes: Fakes) -> None:
    fakes.plugin("a", versions=["0.4.0", "1.0.0"])
    fakes.plugin("b")
    out = pycni(fakes, "version", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["a"] == {"path": str(fakes.bin / "a"), "cniVersion": "1.1.0",
                           "supportedVersions": ["0.4.0", "1.0.0"]}
    assert report["b"]["supportedVersions"][-1] == "1.1.0"
    assert "a.json" not in report  # not executable
    text = pycni(fakes, "version", "a").stdout
    assert text.startswith("a  0.4.0, 1.0.0")
    assert pycni(fakes, "version", "nosuch").returncode == 1


def test_lazy_commands_import_their_module_only_when_run(tmp_path: Path,
                                                         monkeypatch) -> None:
    (tmp_path / "pycni_lazy_probe.py").write_text(
        "import click\n@click.command()\ndef probe():\n    click.echo('probed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cli.main.add_command(cli.lazy("probe", "pycni_lazy_probe:probe", "A probe."))
    try:
        runner = CliRunner()
        listing = runner.invoke(cli.main, ["--help"])
        assert "A probe." in listing.output
        assert "pycni_lazy_probe" not in sys.modules
        assert runner.invoke(cli.main, ["probe"]).output == "probed\n"
        assert "pycni_lazy_probe" in sys.modules
    finally:
        cli.main.commands.pop("probe", None)
        sys.modules.pop("pycni_lazy_probe", None)
    assert isinstance(cli.main, click.Group)


def test_the_cli_imports_nothing_heavy_for_the_cnitool_verbs() -> None:
    assert loaded_by("cni.cli", ("pydantic", "pyroute2", "cni.plugins",
                                "cni.demo")) == []
