"""`pycni install` / `uninstall` / `doctor` on temp dirs: what lands on disk, what is refused,
and that uninstall leaves the dirs exactly as they were."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cni import doctor, registry
from cni import install as inst
from cni.cli import main
from cni.install import files

ROOT = Path(__file__).resolve().parent.parent
LO_CONF = {"cniVersion": "1.1.0", "name": "lo-test", "plugins": [{"type": "loopback"}]}


def snapshot(*dirs: Path) -> dict[str, tuple]:
    """Every path under dirs with its type, mode and content (or link target)."""
    out: dict[str, tuple] = {}
    for d in dirs:
        if not d.exists():
            out[str(d)] = ("absent",)
            continue
        for p in [d, *sorted(d.rglob("*"))]:
            st = p.lstat()
            body = (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "")
            out[str(p)] = (st.st_mode, body)
    return out


@pytest.fixture(autouse=True)
def no_daemon(tmp_path: Path, monkeypatch) -> None:
    """Install asks a running daemon of another version to hand over: never the machine's."""
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    bin_dir, conf_dir = tmp_path / "opt" / "cni" / "bin", tmp_path / "etc" / "cni" / "net.d"
    src = tmp_path / "lo.conflist"
    src.write_text(json.dumps(LO_CONF))
    return bin_dir, conf_dir, src


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def test_install_writes_direct_shebang_executables(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--conflist", str(src))
    assert code == 0, out
    multi = bin_dir / inst.MULTICALL
    text = multi.read_text()
    first = text.splitlines()[0]
    assert first == f"#!{ROOT / '.venv' / 'bin' / 'python'} -IS"
    assert "/usr/bin/env" not in first and "''''" not in text
    assert inst.MARKER in text[:1024]
    assert f"_root = {str(ROOT)!r}  # pycni:root" in text
    assert os.access(multi, os.X_OK)
    for name in registry.NAMES:
        assert (bin_dir / name).resolve() == multi.resolve()
    assert json.loads((conf_dir / src.name).read_text()) == LO_CONF
    # Bytecode is in place so the first exec compiles nothing.
    assert list((ROOT / "cni" / "__pycache__").glob("skel.*.pyc"))


def test_package_data_is_the_checkout_files() -> None:
    """One source: the package's data (what a wheel carries) is bin/cni-plugin and conf/."""
    assert Path(str(inst.SOURCE)).resolve() == ROOT / "bin" / "cni-plugin"
    assert inst.SOURCE.read_bytes() == (ROOT / "bin" / "cni-plugin").read_bytes()
    shipped = sorted(p.name for p in (ROOT / "conf").iterdir())
    assert sorted(p.name for p in inst.CONF_SRC.iterdir()) == shipped
    for name in shipped:
        assert (inst.CONF_SRC / name).read_bytes() == (ROOT / "conf" / name).read_bytes()
    assert inst.shipped_conflists() == ["10-pycni.conflist", "20-pycni-dualstack.conflist"]


def test_multicall_rendered_for_a_wheel_keeps_the_stdlib_first(tmp_path: Path) -> None:
    """Installed from a wheel, the package's dir is site-packages: it goes after the stdlib."""
    site = str(tmp_path / "lib" / "python3.12" / "site-packages")
    text = inst.render_multicall(Path("/v/bin/python"), Path(site), sites=[site]).decode()
    assert text.splitlines()[0] == "#!/v/bin/python -IS"
    assert f"_root = {site!r}  # pycni:root" in text
    paths = [line for line in text.splitlines() if line.startswith("sys.path")]
    assert paths == [f"sys.path.append({site!r})  # pycni:path"]
    assert ".venv" not in text and "_site" not in text
    # A checkout: its root first, the venv's site-packages last.
    checkout = inst.render_multicall(Path("/c/.venv/bin/python"), Path("/c"),
                                     sites=["/c/.venv/lib/python3.12/site-packages"]).decode()
    assert [line for line in checkout.splitlines() if line.startswith("sys.path")] == [
        "sys.path.insert(0, _root)  # pycni:path",
        "sys.path.append('/c/.venv/lib/python3.12/site-packages')  # pycni:path"]


def test_version_option_prints_the_package_version() -> None:
    from importlib.metadata import version

    import cni

    code, out = cli("--version")
    assert code == 0 and out == f"pycni {version('pycni')}\n"
    assert version("pycni") == cni.__version__


def test_installed_plugin_answers_version_by_its_own_name(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False)
    env = {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(bin_dir / "loopback")], input=b'{"cniVersion":"1.0.0"}', env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1.0.0" in json.loads(proc.stdout)["supportedVersions"]


def test_bridge_recognises_installed_host_local_as_ours(dirs) -> None:
    from cni.ipam import delegate

    bin_dir, conf_dir, src = dirs
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False)
    assert delegate.is_ours(str(bin_dir / "host-local"))


def test_install_then_uninstall_leaves_dirs_as_they_were(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    bin_dir.mkdir(parents=True)
    foreign = bin_dir / "macvlan"
    foreign.write_text("#!/bin/sh\necho foreign\n")
    foreign.chmod(0o755)
    before = snapshot(bin_dir, conf_dir)
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False)
    assert (conf_dir / src.name).exists() and (bin_dir / "bridge").is_symlink()
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False)  # reinstall is fine
    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 0, out
    assert snapshot(bin_dir, conf_dir) == before
    assert not conf_dir.exists()  # install made it, uninstall removed it
    assert foreign.read_text() == "#!/bin/sh\necho foreign\n"


def test_refuses_a_different_conflist_without_force(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    conf_dir.mkdir(parents=True)
    theirs = conf_dir / src.name
    theirs.write_text('{"name": "theirs"}')
    before = snapshot(bin_dir, conf_dir)
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--conflist", str(src), "--no-compile")
    assert code == 1 and "refusing to overwrite" in out and str(theirs) in out
    assert snapshot(bin_dir, conf_dir) == before  # nothing written at all


def test_force_keeps_backups_that_uninstall_restores(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    bin_dir.mkdir(parents=True)
    conf_dir.mkdir(parents=True)
    (bin_dir / "bridge").write_bytes(b"\x7fELF reference bridge")
    (conf_dir / src.name).write_text('{"name": "theirs"}')
    before = snapshot(bin_dir, conf_dir)
    inst.install(bin_dir, conf_dir, str(src), force=True, compile_bytecode=False)
    assert (bin_dir / "bridge").is_symlink()
    assert json.loads((conf_dir / src.name).read_text())["name"] == "lo-test"
    assert not list(conf_dir.glob(".*"))  # backups never go where a runtime reads conflists
    inst.uninstall(bin_dir)
    assert snapshot(bin_dir, conf_dir) == before


def test_no_path_is_ever_missing_while_install_replaces_it(dirs, monkeypatch) -> None:
    """A runtime exec'ing a plugin meanwhile must find the old file or the new one: each file
    is renamed over its path, a replaced one kept as a backup under a second name first."""
    bin_dir, conf_dir, src = dirs
    bin_dir.mkdir(parents=True)
    (bin_dir / "bridge").write_bytes(b"\x7fELF reference bridge")
    (bin_dir / inst.MULTICALL).write_bytes(b"#!/bin/sh\nsomeone else's\n")
    there_before: dict[str, bool] = {}
    write, symlink = files.atomic_write, files.atomic_symlink

    def watched(replace):
        def wrapper(path: Path, *args) -> None:
            there_before[path.name] = path.exists() or path.is_symlink()
            replace(path, *args)
        return wrapper
    monkeypatch.setattr(files, "atomic_write", watched(write))
    monkeypatch.setattr(files, "atomic_symlink", watched(symlink))
    inst.install(bin_dir, conf_dir, str(src), force=True, compile_bytecode=False)
    assert there_before[inst.MULTICALL] and there_before["bridge"], there_before
    backups = sorted(p.name for p in (bin_dir / inst.BACKUPS).iterdir())
    assert len(backups) == 2, backups
    assert not list(bin_dir.glob(".pycni-tmp-*"))
    # an upgrade over its own install: nothing is a backup, every path still replaced in place
    there_before.clear()
    inst.install(bin_dir, conf_dir, str(src), force=True, compile_bytecode=False)
    assert all(there_before.values()) and there_before, there_before
    assert sorted(p.name for p in (bin_dir / inst.BACKUPS).iterdir()) == backups
    inst.uninstall(bin_dir)
    assert (bin_dir / "bridge").read_bytes() == b"\x7fELF reference bridge"


def test_from_a_wheel_the_plugins_run_a_copy_pip_never_changes(dirs, monkeypatch) -> None:
    """Installed in site-packages (here: the checkout taken for one), the executables import a
    copy of the package made by install (pip upgrades site-packages in place, file by file);
    a copy goes once no executable names it and no process may run it (nothing runs here)."""
    bin_dir, conf_dir, src = dirs
    sites = inst.site_dirs(inst.venv_python())
    monkeypatch.setattr(inst, "site_dirs", lambda _python: [str(ROOT), *sites])
    lib_dir = bin_dir / ".pycni-lib"
    libs = []
    for version in ("1.0.0", "1.0.1", "1.0.2"):
        monkeypatch.setattr(inst, "__version__", version)
        inst.install(bin_dir, conf_dir, str(src), force=True, compile_bytecode=False)
        [lib] = [d for d in lib_dir.iterdir() if d.name.startswith(version + "-")]
        libs.append(lib)
        text = (bin_dir / inst.MULTICALL).read_text()
        assert f"_root = {str(lib)!r}  # pycni:root" in text
        assert "sys.path.insert(0, _root)  # pycni:path" in text
        assert (lib / "cni" / "skel.py").read_bytes() == (ROOT / "cni" / "skel.py").read_bytes()
        assert list((lib / "cni" / "__pycache__").glob("skel.*.pyc"))  # compiled
        assert not list(lib_dir.glob(".tmp-*"))
        # no plugin ran the replaced executable: its copy is gone (test_install_trust: kept
        # while one does)
        assert sorted(lib_dir.iterdir()) == libs[-1:]
    proc = subprocess.run([str(bin_dir / "bridge")], input=b'{"cniVersion": "1.0.0"}',
                          env={"CNI_COMMAND": "VERSION"}, capture_output=True, cwd="/")
    assert proc.returncode == 0 and b'"supportedVersions"' in proc.stdout, proc.stderr
    probe = "import cni, sys; print(cni.__file__)"
    body = (bin_dir / inst.MULTICALL).read_text().split("from cni.fast.shim")[0]
    where = subprocess.run([inst.venv_python(), "-IS", "-c", body + probe],
                           capture_output=True, text=True, cwd="/")
    assert where.stdout.strip() == str(libs[-1] / "cni" / "__init__.py"), where.stderr
    [found] = doctor.install_findings(bin_dir, conf_dir)[:1]
    assert found.status == doctor.OK and str(libs[-1]) in found.detail, found
    shutil.rmtree(libs[-1])  # someone cleaned the bin dir's hidden files: doctor says so
    [found] = doctor.install_findings(bin_dir, conf_dir)[:1]
    assert found.status == doctor.FAIL and "pycni install --force" in found.fix, found
    inst.uninstall(bin_dir)
    assert not bin_dir.exists()


def test_uninstall_leaves_what_was_changed_since(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False)
    edited = conf_dir / src.name
    edited.write_text('{"name": "edited by the admin"}')
    lines = inst.uninstall(bin_dir)
    assert edited.read_text() == '{"name": "edited by the admin"}'
    assert any("changed since install" in line for line in lines)
    assert not (bin_dir / "bridge").exists() and not (bin_dir / inst.MANIFEST).exists()


def test_cni_version_rewrite_for_older_runtimes(dirs) -> None:
    bin_dir, conf_dir, src = dirs
    inst.install(bin_dir, conf_dir, str(src), cni_version="1.0.0", compile_bytecode=False)
    assert json.loads((conf_dir / src.name).read_text())["cniVersion"] == "1.0.0"


def test_unknown_conflist_names_what_is_available(dirs) -> None:
    bin_dir, conf_dir, _ = dirs
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--conflist", "no-such.conflist", "--no-compile")
    assert code == 1 and "no conflist 'no-such.conflist'" in out
    assert not bin_dir.exists()


def test_uninstall_without_install_is_an_error(tmp_path: Path) -> None:
    code, out = cli("uninstall", "--bin-dir", str(tmp_path))
    assert code == 1 and "no pycni install recorded" in out


def test_cli_add_does_not_import_install_or_doctor() -> None:
    code = ("import sys, cni.cli as c; c.main.get_command(None, 'add');"
            "assert not {'cni.install', 'cni.cli.node', 'cni.doctor'} & set(sys.modules);"
            "assert c.main.get_command(None, 'install').name == 'install'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_doctor_reports_and_fails_on_a_missing_requirement(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(doctor, "STORE_DIR", blocker / "networks")
    monkeypatch.setattr(doctor, "kernel_findings", lambda: [])
    code, out = cli("doctor", "--bin-dir", str(tmp_path), "--conf-dir", str(tmp_path))
    assert code == 1
    assert f"[FAIL] host-local store {blocker / 'networks'}: {blocker} is not a directory" in out
    assert "fix: make" in out


@pytest.mark.root
def test_doctor_probes_kernel_in_a_throwaway_netns(tmp_path) -> None:
    def real_state() -> tuple[list, str, str]:
        # Links by name and kind: `ip -d link`'s bridge timers (virbr0's gc_timer) tick.
        links = json.loads(subprocess.run(["ip", "-j", "-d", "link"], capture_output=True,
                                          text=True).stdout)
        return ([(link["ifname"], link.get("linkinfo", {}).get("info_kind")) for link in links],
                subprocess.run(["tc", "qdisc"], capture_output=True, text=True).stdout,
                subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout)

    before = real_state()
    findings = doctor.kernel_findings()
    names = {f.what: f for f in findings}
    for feature in ("bridge links", "veth pairs", "nftables nat, fib, masquerade",
                    "tbf qdisc (bandwidth)", "ifb links (bandwidth egress)"):
        assert names[feature].status == doctor.OK, names[feature]
    assert real_state() == before  # the probe's objects died with its namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="the socket must be root's")
def test_doctor_checks_the_configured_daemon_socket(tmp_path, monkeypatch) -> None:
    import socket

    path = tmp_path / "pycni.sock"
    monkeypatch.setenv(doctor.SOCKET_ENV, str(path))
    assert doctor.daemon_findings()[0].status == doctor.WARN  # configured, missing
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        srv.listen(1)
        path.chmod(0o600)
        assert doctor.daemon_findings()[0].status == doctor.OK
        path.chmod(0o666)
        finding = doctor.daemon_findings()[0]
        assert finding.status == doctor.FAIL and "not root-only" in finding.detail
    finally:
        srv.close()


# --- systemd units ----------------------------------------------------------------------------

@pytest.fixture
def fake_systemctl(tmp_path: Path, monkeypatch) -> Path:
    """A `systemctl` first on PATH that logs each call's argv, one line per call."""
    tools, log = tmp_path / "tools", tmp_path / "systemctl.log"
    tools.mkdir()
    (tools / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (tools / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.delenv("PYCNI_SYSTEMD", raising=False)
    return log


def test_install_writes_and_enables_units_and_uninstall_reverses(dirs, tmp_path,
                                                                 fake_systemctl) -> None:
    bin_dir, conf_dir, src = dirs
    units = tmp_path / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    before = snapshot(bin_dir, conf_dir, units)
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--conflist", str(src), "--no-compile", "--systemd-dir", str(units))
    assert code == 0, out
    service = (units / "pycni.service").read_text()
    daemon = ROOT / ".venv" / "bin" / "pycni"
    assert f"\nExecStart={daemon} daemon\n" in service
    assert "Type=notify" in service
    socket_unit = (units / "pycni.socket").read_text()
    assert "ListenStream=/run/pycni/pycni.sock" in socket_unit
    assert f"Documentation=file://{ROOT / 'README.md'}" in socket_unit
    assert fake_systemctl.read_text().splitlines() == [
        "daemon-reload", "enable --now pycni.socket", "try-restart pycni.service"]
    manifest = json.loads((bin_dir / inst.MANIFEST).read_text())
    assert manifest["systemd"] is True
    assert {str(units / u) for u in inst.UNITS} <= {e["path"] for e in manifest["entries"]}

    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 0, out
    assert fake_systemctl.read_text().splitlines()[3:] == [
        "disable --now pycni.socket pycni.service", "daemon-reload"]
    assert snapshot(bin_dir, conf_dir, units) == before


def test_a_different_unit_is_refused_without_force(dirs, tmp_path, fake_systemctl) -> None:
    bin_dir, conf_dir, src = dirs
    units = tmp_path / "units"
    units.mkdir()
    (units / "pycni.service").write_text("[Service]\nExecStart=/usr/local/bin/mine\n")
    with pytest.raises(inst.InstallError, match="pycni.service"):
        inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False, units_dir=units)
    assert not fake_systemctl.exists()  # refused before anything ran
    assert not (units / "pycni.socket").exists()
    inst.install(bin_dir, conf_dir, str(src), compile_bytecode=False, units_dir=units,
                 force=True)
    inst.uninstall(bin_dir)
    assert (units / "pycni.service").read_text() == "[Service]\nExecStart=/usr/local/bin/mine\n"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_opting_out_writes_no_units_and_runs_no_systemctl(dirs, tmp_path, fake_systemctl,
                                                          monkeypatch, how) -> None:
    bin_dir, conf_dir, src = dirs
    units = tmp_path / "units"
    args = ["install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir), "--conflist",
            str(src), "--no-compile", "--systemd-dir", str(units)]
    if how == "flag":
        args.append("--no-systemd")
    else:
        monkeypatch.setenv("PYCNI_SYSTEMD", "0")
    code, out = cli(*args)
    assert code == 0, out
    assert not units.exists() and not fake_systemctl.exists()
    assert json.loads((bin_dir / inst.MANIFEST).read_text())["systemd"] is False


def test_systemd_is_detected_as_sd_booted_does(monkeypatch) -> None:
    monkeypatch.delenv("PYCNI_SYSTEMD", raising=False)
    booted = Path("/run/systemd/system").is_dir()
    assert inst.systemd_dir(None) == (inst.SYSTEMD_DIR if booted else None)
    assert inst.systemd_dir(None, enabled=False) is None
    monkeypatch.setenv("PYCNI_SYSTEMD", "0")
    assert inst.systemd_dir(Path("/x")) is None


def test_a_failing_systemctl_is_an_install_error(dirs, tmp_path, monkeypatch) -> None:
    bin_dir, conf_dir, src = dirs
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "systemctl").write_text("#!/bin/sh\necho 'System has not been booted' >&2\nexit 1\n")
    (tools / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.delenv("PYCNI_SYSTEMD", raising=False)
    code, out = cli("install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                    "--conflist", str(src), "--no-compile", "--systemd-dir",
                    str(tmp_path / "units"))
    assert code == 1
    assert "systemctl daemon-reload failed (1): System has not been booted" in out
    inst.uninstall(bin_dir)  # what was written is recorded, so it can be taken back
    assert not (tmp_path / "units" / "pycni.service").exists()
