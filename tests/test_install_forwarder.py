"""`pycni install --forwarder`: the plugin names link to pycni-forwarder with its install table
beside it, the Python executable stays (the fallback), the manifest says which kind; install
switches kinds either way, uninstall restores, a mixed bin dir is refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from forwarder_util import built
from test_install import snapshot

from cni import doctor, registry
from cni import install as inst
from cni.cli import main
from cni.install import forwarder
from cni.install.manifest import Manifest
from cni.spec import version as versions

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def no_daemon(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))


@pytest.fixture(scope="module")
def binary() -> Path:
    return built()


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    return tmp_path / "opt" / "cni" / "bin"


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def install(bin_dir: Path, *extra: str) -> str:
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conflist", "", "--no-systemd",
                    "--no-compile", *extra)
    assert code == 0, out
    return out


def linked_to(bin_dir: Path) -> set[str]:
    return {os.readlink(bin_dir / name) for name in registry.NAMES}


def test_install_forwarder_links_every_name_to_it(bin_dir, binary) -> None:
    install(bin_dir, "--forwarder")
    assert linked_to(bin_dir) == {forwarder.FORWARDER}
    installed = bin_dir / forwarder.FORWARDER
    assert installed.read_bytes() == binary.read_bytes() and os.access(installed, os.X_OK)
    assert (bin_dir / inst.MULTICALL).is_file()  # the fallback stays
    table = json.loads((bin_dir / forwarder.TABLE).read_text())
    assert table["python"] == str(bin_dir / inst.MULTICALL)
    assert table["supported"] == list(versions.SUPPORTED)
    for name in registry.NAMES:  # the versions the shim answers VERSION with
        assert table["plugins"][name] == list(registry.supported(name, versions.SUPPORTED))
    st = (bin_dir / forwarder.TABLE).stat()
    assert st.st_uid == 0 and st.st_mode & 0o022 == 0
    manifest = Manifest.load(bin_dir)
    assert manifest.forwarder
    (found,) = [f for f in doctor.install_findings(bin_dir, bin_dir / "no-conf")
                if f.what.startswith("install in")]
    assert found.status == doctor.OK and "linked to pycni-forwarder" in found.detail, found
    assert {str(bin_dir / forwarder.FORWARDER), str(bin_dir / forwarder.TABLE)} <= {
        e.path for e in manifest.entries}


def test_install_switches_kinds_both_ways(bin_dir, binary) -> None:
    install(bin_dir)
    plain = snapshot(bin_dir)
    assert linked_to(bin_dir) == {inst.MULTICALL}
    install(bin_dir, "--forwarder")
    assert linked_to(bin_dir) == {forwarder.FORWARDER}
    out = install(bin_dir)  # an upgrade without --forwarder: back to the Python executable
    assert linked_to(bin_dir) == {inst.MULTICALL}
    assert not (bin_dir / forwarder.FORWARDER).exists()
    assert not (bin_dir / forwarder.TABLE).exists()
    assert f"removed {bin_dir / forwarder.FORWARDER}" in out
    assert not Manifest.load(bin_dir).forwarder
    assert snapshot(bin_dir) == plain


def test_uninstall_after_forwarder_leaves_dirs_as_they_were(bin_dir, binary) -> None:
    bin_dir.mkdir(parents=True)
    (bin_dir / "other-vendor").write_text("#!/bin/sh\n")
    before = snapshot(bin_dir)
    install(bin_dir, "--forwarder")
    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 0, out
    assert snapshot(bin_dir) == before


def test_a_mixed_bin_dir_is_refused(bin_dir, binary) -> None:
    install(bin_dir, "--forwarder")
    (bin_dir / "bridge").unlink()
    (bin_dir / "bridge").symlink_to(inst.MULTICALL)  # an admin's hand edit
    before = snapshot(bin_dir)
    for extra in ((), ("--forwarder",)):
        code, out = cli("install", "--bin-dir", str(bin_dir), "--conflist", "", "--no-systemd",
                        "--no-compile", *extra)
        assert code == 1
        assert "mixed node" in out and "bridge to pycni-plugin" in out, out
        assert "loopback" in out and "nothing was written" in out
        assert snapshot(bin_dir) == before
    install(bin_dir, "--forwarder", "--force")  # relinks them all, the odd one kept aside
    assert linked_to(bin_dir) == {forwarder.FORWARDER}


def test_the_binary_is_found_or_refused_clearly(bin_dir, binary, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(forwarder, "BUILT", tmp_path / "none" / forwarder.FORWARDER)
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conflist", "", "--no-systemd",
                    "--forwarder")
    assert code == 1 and "no forwarder binary at" in out and "make forwarder" in out, out
    assert not bin_dir.exists()
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(binary, loose / "fw")
    os.chmod(loose / "fw", 0o777)
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conflist", "", "--no-systemd",
                    "--forwarder-binary", str(loose / "fw"))
    assert code == 1 and "group or others can write it" in out, out
    assert not bin_dir.exists()
    os.chmod(loose / "fw", 0o755)
    install(bin_dir, "--forwarder-binary", str(loose / "fw"))  # implies --forwarder
    assert linked_to(bin_dir) == {forwarder.FORWARDER}


def test_an_interrupted_switch_is_completed_not_refused(bin_dir, binary) -> None:
    """Install saves the manifest after each link: a switch stopped halfway leaves a mixed bin
    dir the manifest records, which the next install finishes."""
    install(bin_dir, "--forwarder")
    manifest = Manifest.load(bin_dir)
    manifest.find(bin_dir / "bridge").target = inst.MULTICALL
    manifest.save()
    (bin_dir / "bridge").unlink()
    (bin_dir / "bridge").symlink_to(inst.MULTICALL)
    install(bin_dir)
    assert linked_to(bin_dir) == {inst.MULTICALL}
    assert not (bin_dir / forwarder.FORWARDER).exists()
