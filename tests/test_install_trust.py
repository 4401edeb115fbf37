"""`pycni install` against a local user (`nobody`): root reads only what root owns and writes
only into what root owns, one install at a time in a bin dir, and the package copies the plugins
run are repaired when damaged and kept while a plugin may still run them (issue #37)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_install import ROOT, cli, snapshot

from cni import install as inst

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root runs install; nobody attacks")
NOBODY = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
LO_CONF = {"cniVersion": "1.1.0", "name": "lo-test", "plugins": [{"type": "loopback"}]}
EVIL = {"cniVersion": "1.0.0", "name": "evil", "plugins": [{"type": "../../tmp/evil"}]}
SHIPPED = ROOT / "conf" / inst.DEFAULT_CONFLIST


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A scratch dir nobody can reach (pytest's own is under a 0700 dir): root's, 0755, in /tmp
    (root-owned and sticky, as install allows for an ancestor)."""
    d = Path(tempfile.mkdtemp(prefix="pycni-trust-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture(autouse=True)
def no_daemon(tmp_path: Path, monkeypatch) -> None:
    """Install asks a running daemon of another version to hand over: never the machine's."""
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.setenv("PYCNI_SYSTEMD", "0")


def nobody(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, cwd=cwd, timeout=30)


def public_dir(tmp_path: Path) -> Path:
    """A dir anyone can make entries in, as /tmp: root-owned, sticky, 1777."""
    pub = tmp_path / "pub"
    if not pub.exists():
        pub.mkdir()
        pub.chmod(0o1777)
    return pub


def nobody_dir(tmp_path: Path, name: str) -> Path:
    """A dir nobody made (in a public dir), as a local user's own."""
    d = public_dir(tmp_path) / name
    assert nobody("mkdir", str(d)).returncode == 0
    assert d.stat().st_uid != 0
    return d


def install_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["install", "--bin-dir", str(tmp_path / "bin"), "--conf-dir", str(tmp_path / "net.d"),
            "--no-compile", "--no-systemd", *extra]


# ---- item 1: the conflist --------------------------------------------------------------------

def test_a_bare_conflist_name_is_the_shipped_one_never_a_file_in_the_cwd(tmp_path, monkeypatch):
    """Root runs install in a dir nobody can write: nobody's 10-pycni.conflist there is never
    read; the default name means the conflist the package ships."""
    cwd = nobody_dir(tmp_path, "cwd")
    assert nobody("sh", "-c", f"echo '{json.dumps(EVIL)}' > {inst.DEFAULT_CONFLIST}",
                  cwd=cwd).returncode == 0
    monkeypatch.chdir(cwd)
    code, out = cli(*install_args(tmp_path))
    assert code == 0, out
    assert (tmp_path / "net.d" / inst.DEFAULT_CONFLIST).read_bytes() == SHIPPED.read_bytes()


def test_a_local_conflist_is_read_only_if_root_owns_it(tmp_path, monkeypatch):
    """A file of one's own is given by a path with a /; nobody's file, a file others can write,
    a root file in nobody's dir, or a symlink: refused, naming it, nothing written."""
    cwd = nobody_dir(tmp_path, "cwd")
    assert nobody("sh", "-c", f"echo '{json.dumps(EVIL)}' > mine.conflist",
                  cwd=cwd).returncode == 0
    (cwd / "roots.conflist").write_text(json.dumps(LO_CONF))  # root's file in nobody's dir
    safe = tmp_path / "safe"
    safe.mkdir()
    (safe / "writable.conflist").write_text(json.dumps(LO_CONF))
    (safe / "writable.conflist").chmod(0o666)
    (safe / "real.conflist").write_text(json.dumps(LO_CONF))
    (safe / "link.conflist").symlink_to(safe / "real.conflist")
    monkeypatch.chdir(cwd)
    cases = {"./mine.conflist": "nobody", str(cwd / "roots.conflist"): "nobody",
             str(safe / "writable.conflist"): "0666", str(safe / "link.conflist"): "symlink"}
    for path, why in cases.items():
        code, out = cli(*install_args(tmp_path, "--conflist", path))
        assert code == 1 and why in out, (path, out)
        assert not (tmp_path / "bin").exists() and not (tmp_path / "net.d").exists(), path
    code, out = cli(*install_args(tmp_path, "--conflist", str(safe / "real.conflist")))
    assert code == 0, out
    assert json.loads((tmp_path / "net.d" / "real.conflist").read_text()) == LO_CONF


# ---- item 1: the dirs, the interpreter, the sys.path dirs ------------------------------------

def test_install_refuses_dirs_a_user_owns_or_can_write(tmp_path, monkeypatch):
    """Every dir install writes into or puts on the plugins' sys.path, and the interpreter, must
    be root's and writable by root alone, all the way up: else a refusal naming the path and its
    owner or mode, and nothing written anywhere."""
    pub = public_dir(tmp_path)
    theirs = nobody_dir(tmp_path, "theirs")
    roots_in_theirs = theirs / "x"
    assert nobody("chmod", "0777", str(theirs)).returncode == 0
    roots_in_theirs.mkdir()  # root's dir, in a dir nobody can rename it out of
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    python = pub / "python"  # nobody's link in a sticky dir
    assert nobody("ln", "-s", str(inst.venv_python()), str(python)).returncode == 0
    sites = inst.site_dirs(inst.venv_python())
    real_python = inst.venv_python()
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    cases = [
        ({"bin": theirs / "bin"}, f"{theirs} is owned by nobody"),  # nobody made its parent
        ({"bin": theirs}, f"{theirs} is owned by nobody"),
        ({"bin": roots_in_theirs}, f"{theirs} is owned by nobody"),
        ({"conf": group}, f"{group} is owned by root (uid 0) with mode 0775"),
        ({"conf": group / "net.d"}, f"{group} is owned by root (uid 0) with mode 0775"),
        ({"bin": pub}, f"{pub} is owned by root (uid 0) with mode 1777"),
        ({"sites": [*sites, str(theirs)]}, f"{theirs} is owned by nobody"),
        ({"sites": [*sites, str(theirs / "lib")]}, f"{theirs} is owned by nobody"),  # missing
        ({"python": python}, f"{python} is owned by nobody"),
    ]
    for case, why in cases:
        py, on_path = case.get("python", real_python), case.get("sites", sites)
        monkeypatch.setattr(inst, "venv_python", lambda py=py: py)
        monkeypatch.setattr(inst, "site_dirs", lambda _p, s=on_path: s)
        b, c = case.get("bin", bin_dir), case.get("conf", conf_dir)
        before = snapshot(tmp_path)
        with pytest.raises(inst.InstallError, match="nothing was written") as e:
            inst.install(b, c, inst.DEFAULT_CONFLIST, compile_bytecode=False)
        assert why in str(e.value), (case, str(e.value))
        assert snapshot(tmp_path) == before, case
    monkeypatch.setattr(inst, "venv_python", lambda: real_python)
    monkeypatch.setattr(inst, "site_dirs", lambda _p: sites)
    inst.install(pub / "made-by-root" / "bin", conf_dir, compile_bytecode=False)  # /tmp-like


# ---- item 4/9: what install makes, nobody cannot change ---------------------------------------

def wheel_like(monkeypatch) -> None:
    """Install as from a wheel (the package's dir is a site dir): the plugins run a copy."""
    sites = inst.site_dirs(inst.venv_python())
    monkeypatch.setattr(inst, "site_dirs", lambda _python: [str(ROOT), *sites])


def test_nobody_cannot_write_into_what_install_made(tmp_path, monkeypatch):
    wheel_like(monkeypatch)
    bin_dir, conf_dir = tmp_path / "opt" / "bin", tmp_path / "net.d"
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    [lib] = (bin_dir / ".pycni-lib").iterdir()
    modes = {bin_dir: 0o755, bin_dir.parent: 0o755, conf_dir: 0o755, lib.parent: 0o755,
             lib: 0o755, lib / "cni": 0o755, bin_dir / inst.MULTICALL: 0o755,
             bin_dir / inst.MANIFEST: 0o644, bin_dir / ".pycni-install.lock": 0o600,
             conf_dir / inst.DEFAULT_CONFLIST: 0o644}
    for path, mode in modes.items():
        st = path.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), path
    for p in lib.rglob("*"):
        assert p.lstat().st_uid == 0 and not p.lstat().st_mode & 0o022, p
    for target in (bin_dir / "x", lib.parent / "x", lib / "x", lib / "cni" / "x",
                   conf_dir / "x.conflist"):
        assert nobody("touch", str(target)).returncode != 0, target
    for existing in (bin_dir / inst.MULTICALL, lib / "cni" / "skel.py"):
        assert nobody("sh", "-c", f": > {existing}").returncode != 0, existing
    assert nobody("mv", str(lib), str(tmp_path / "gone")).returncode != 0
    assert not (tmp_path / "gone").exists() and not (bin_dir / "x").exists()


# ---- item 4: one install at a time ------------------------------------------------------------

def test_an_install_waits_for_the_one_holding_the_bin_dirs_lock(tmp_path):
    """Installs into one bin dir run one at a time: one waits while another holds the lock."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fd = os.open(bin_dir / ".pycni-install.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = {**os.environ, "PYCNI_SOCKET": str(tmp_path / "no.sock"), "PYCNI_SYSTEMD": "0"}
    proc = subprocess.Popen([str(inst.venv_python()), "-m", "cni.cli", *install_args(tmp_path)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        assert not (bin_dir / inst.MULTICALL).exists()  # it waits before writing anything
    finally:
        os.close(fd)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert (bin_dir / inst.MULTICALL).exists()


# ---- item 4: a damaged copy, a copy still in use ----------------------------------------------

def test_a_damaged_package_copy_is_made_again(tmp_path, monkeypatch):
    """A copy whose files a power loss emptied is not trusted for being there: install checks
    it against its digests and makes it again; the plugins then run."""
    wheel_like(monkeypatch)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    [lib] = (bin_dir / ".pycni-lib").iterdir()
    (lib / "cni" / "skel.py").write_bytes(b"")
    for pyc in (lib / "cni" / "__pycache__").glob("skel.*.pyc"):
        pyc.write_bytes(b"")
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    assert [lib] == list((bin_dir / ".pycni-lib").iterdir())
    assert (lib / "cni" / "skel.py").read_bytes() == (ROOT / "cni" / "skel.py").read_bytes()
    assert all(p.stat().st_size for p in (lib / "cni" / "__pycache__").glob("skel.*.pyc"))


def short_prune_wait(monkeypatch) -> None:
    copies = sys.modules.get("cni.install.copies")
    if copies is not None:  # a plugin stays alive here: no need to wait for it to finish
        monkeypatch.setattr(copies, "PRUNE_WAIT", 1.0)


PLUGIN_CONF = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}


def start_plugin(bin_dir: Path, tmp_path: Path) -> subprocess.Popen:
    """loopback's ADD exec'd as a runtime does, waiting for its config on stdin: by then it has
    imported the shim from the copy its executable names, the rest it imports once it reads."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/nonexistent/netns",
           "CNI_IFNAME": "lo", "CNI_PATH": str(bin_dir), "PATH": "/usr/bin:/bin",
           "PYCNI_SOCKET": str(tmp_path / "no.sock")}
    plugin = subprocess.Popen([str(bin_dir / "loopback")], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    time.sleep(1)  # started, imported the shim; it waits on stdin
    return plugin


def finish_plugin(plugin: subprocess.Popen) -> None:
    """Its config sent: it ends with the CNI error a bad netns always gets, not a missing
    module."""
    try:
        out, err = plugin.communicate(json.dumps(PLUGIN_CONF).encode(), timeout=60)
    finally:
        if plugin.poll() is None:
            plugin.send_signal(signal.SIGKILL)
            plugin.wait()
    assert b"ModuleNotFoundError" not in err and b"Traceback" not in err, err
    assert json.loads(out)["code"], out


def test_a_copy_stays_while_a_plugin_exec_d_before_the_switch_runs(tmp_path, monkeypatch):
    """A plugin exec'd from the executable of version 1 imports from version 1's copy lazily
    (holding nothing of it open): installs of 2 and then 3 meanwhile keep that copy, and the
    plugin finishes on it; once it is gone, the next install removes it."""
    wheel_like(monkeypatch)
    short_prune_wait(monkeypatch)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    lib_dir = bin_dir / ".pycni-lib"
    monkeypatch.setattr(inst, "__version__", "1.0.0")
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    [first] = lib_dir.iterdir()
    plugin = start_plugin(bin_dir, tmp_path)
    try:
        for version in ("1.0.1", "1.0.2"):
            monkeypatch.setattr(inst, "__version__", version)
            inst.install(bin_dir, conf_dir, force=True, compile_bytecode=False)
            assert first.is_dir(), version
    finally:
        finish_plugin(plugin)
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    assert first not in list(lib_dir.iterdir()) and len(list(lib_dir.iterdir())) == 1


def test_uninstall_leaves_the_copy_a_running_plugin_still_imports(tmp_path, monkeypatch):
    """Uninstall removes the executables; a plugin exec'd from them just before still imports
    from their copy: it stays (said so), and the plugin finishes on it."""
    wheel_like(monkeypatch)
    short_prune_wait(monkeypatch)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    [copy] = (bin_dir / ".pycni-lib").iterdir()
    plugin = start_plugin(bin_dir, tmp_path)
    try:
        code, out = cli("uninstall", "--bin-dir", str(bin_dir))
        assert code == 0 and f"left {copy}: pid {plugin.pid} may still run it" in out, out
        assert copy.is_dir() and not (bin_dir / inst.MULTICALL).exists()
    finally:
        finish_plugin(plugin)


def test_uninstall_believes_only_a_manifest_root_owns(tmp_path):
    """The manifest says what uninstall removes and restores: in a bin dir others can write
    (an admin's chmod), nobody's forged one would have root delete any file it names."""
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    inst.install(bin_dir, conf_dir, compile_bytecode=False)
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's own\n")
    forged = json.loads((bin_dir / inst.MANIFEST).read_text())
    forged["entries"].append({"path": str(victim), "kind": "file",
                              "digest": hashlib.sha256(b"root's own\n").hexdigest()})
    bin_dir.chmod(0o777)
    assert nobody("sh", "-c", f"echo '{json.dumps(forged)}' > {bin_dir}/forged && "
                  f"mv -f {bin_dir}/forged {bin_dir / inst.MANIFEST}").returncode == 0
    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 1 and f"{bin_dir} is owned by root (uid 0) with mode 0777" in out, out
    assert victim.read_bytes() == b"root's own\n" and (bin_dir / "bridge").is_symlink()


def test_containerd_template_goes_only_into_roots_dirs(tmp_path):
    """--containerd-template PATH: a dir nobody owns (or can write) on the way is refused,
    naming it, and nothing is written; containerd would render nobody's edits as root."""
    theirs = nobody_dir(tmp_path, "theirs")
    for path in (theirs / "pycni.tmpl", theirs / "containerd" / "pycni.tmpl"):
        before = snapshot(tmp_path)
        code, out = cli(*install_args(tmp_path, "--cluster-cidr", "10.244.0.0/16",
                                      "--containerd-template", str(path)))
        assert code == 1 and f"{theirs} is owned by nobody" in out, out
        assert snapshot(tmp_path) == before
    mine = tmp_path / "etc" / "containerd" / "pycni.tmpl"
    code, out = cli(*install_args(tmp_path, "--cluster-cidr", "10.244.0.0/16",
                                  "--containerd-template", str(mine)))
    assert code == 0 and mine.stat().st_uid == 0 and stat.S_IMODE(mine.stat().st_mode) == 0o644
