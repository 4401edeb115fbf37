"""Another package's plugin is its own problem (cni.plugload): one that hangs, crashes, exits,
starts a thread or changes the process's namespace at import is refused by name, within the
probe's deadline, by the daemon, install and doctor, and everything else is served; at request
time the daemon's deadline and its forked children contain it, and a nested entry-point IPAM
runs in a forked child of its main plugin. Entry points are read, and their modules imported,
only from the venv's own site dirs, and only files root alone can write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from cnitest import BIN, ROOT, VENV_PY, Plugins
from plugin_dists import MODULE_PLUGIN as GOOD
from plugin_dists import fake_dists_fixture, write_dist  # noqa: F401 - the fixture
from test_daemon import Daemon, wait_for

from cni import doctor, plugload, registry, skel
from cni.fast import preload
from cni.install import entrypoints
from cni.ipam import delegate

UNSHARE = "import ctypes\nassert ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0\n"
THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,)).start()\n"
# at import: name -> (module, source, what the refusal says)
AT_IMPORT = {
    "hang-import": ("hang_mod", "import time\ntime.sleep(3600)\n", "did not finish within"),
    "segv-import": ("segv_mod", "import ctypes\nctypes.string_at(0)\n", "crashed the process "
                    "(SIGSEGV)"),
    "exit-import": ("exit_mod", "import os\nos._exit(3)\n", "ended the process (exit code 3)"),
    "thread-import": ("thread_mod", THREAD + GOOD, "changed the process's threads"),
    "netns-import": ("netns_mod", UNSHARE + GOOD, "changed the process's net namespace"),
}
# at request time: one class per fault, all in rt_mod
AT_REQUEST = '''
import ctypes, os, threading, time


def _result(req):
    return {"cniVersion": req.version, "ips": [{"address": "198.51.100.9/24"}]}


class Base:
    def check(self, req):
        return None

    def delete(self, req):
        return None


class Hang(Base):
    def add(self, req):
        time.sleep(3600)


class Segv(Base):
    def add(self, req):
        ctypes.string_at(0)


class Exit(Base):
    def add(self, req):
        os._exit(3)


class Thread(Base):
    def add(self, req):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        return _result(req)


class Netns(Base):
    def add(self, req):  # leaves bridge's process in a new netns, elsewhere, with a new env
        assert ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0
        os.chdir("/proc")
        os.environ["LEFT_BEHIND"] = "1"
        return _result(req)
'''
REQUEST_FAULTS = {"hang-req": "rt_mod:Hang", "segv-req": "rt_mod:Segv",
                  "exit-req": "rt_mod:Exit", "thread-req": "rt_mod:Thread",
                  "netns-req": "rt_mod:Netns"}
MAIN = '''
from cni.api import get_key, ipam_add


def add(req):
    return ipam_add(req, get_key(req.config, "ipam")["type"])


def check(req):
    return None


def delete(req):
    return None
'''
ENV = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
       "CNI_PATH": "/nonexistent"}


def conf(plugin: str, **extra) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "net", "type": plugin, **extra}).encode()


def import_faults() -> tuple[dict[str, str], dict[str, str]]:
    return ({name: mod for name, (mod, _, _) in AT_IMPORT.items()},
            {mod: source for mod, source, _ in AT_IMPORT.values()})


def process_state() -> tuple:
    return (os.stat("/proc/thread-self/ns/net").st_ino, os.getcwd(), dict(os.environ),
            len(os.listdir("/proc/self/task")))


def test_a_plugin_that_faults_at_import_is_refused_by_name_and_never_imported_here(
        fake_dists, monkeypatch, caplog) -> None:
    """The daemon's preload, install's table and doctor: each fault refused by name with why,
    the good plugin served, none of the bad modules imported into this process (which would
    hang, die, or be left in another netns with a thread)."""
    monkeypatch.setattr(plugload, "PROBE_TIMEOUT", 5.0)
    entries, modules = import_faults()
    site = fake_dists("faulty", {**entries, "tiny": "tiny_mod"}, {**modules, "tiny_mod": GOOD})
    before = process_state()
    failed = preload.load_entry_points()
    assert sorted(failed) == sorted(AT_IMPORT)
    for name, (mod, _, why) in AT_IMPORT.items():
        assert why in registry.REFUSED[name], registry.REFUSED[name]
        assert f"plugin {name} not served" in caplog.text
        assert mod not in sys.modules
        reply = skel.run(name, {**ENV, "CNI_COMMAND": "ADD"}, conf(name))
        out = json.loads(reply.stdout)
        assert reply.code == 1 and out["code"] == 50 and why in out["msg"], out
    assert process_state() == before
    assert registry.serves("tiny") and not registry.serves("hang-import")
    assert skel.run("tiny", {**ENV, "CNI_COMMAND": "ADD"}, conf("tiny")).code == 0
    registry.FIXED = False  # the daemon's; install and doctor run in processes of their own
    # install's table (it links only what passed; the versions come from the probe)
    table, skipped = entrypoints.plugin_table([str(site)])
    assert table == {"tiny": ("tiny_mod", "")}
    assert sorted(skipped) == sorted(AT_IMPORT)
    # doctor
    found = {f.what: f for f in doctor.plugin_findings()}
    assert found["plugin tiny"].status == doctor.OK
    for name, (_, _, why) in AT_IMPORT.items():
        assert found[f"plugin {name}"].status == doctor.WARN
        assert why in found[f"plugin {name}"].detail
    assert process_state() == before


@pytest.fixture
def ipam_bin(tmp_path: Path) -> Path:
    """A CNI_PATH whose entries are pycni's executable (the IPAMs run in-process, ours)."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in [*REQUEST_FAULTS, "tiny"]:
        (d / name).symlink_to(BIN / "cni-plugin")
    return d


def test_a_nested_entry_point_ipam_runs_contained(fake_dists, ipam_bin, monkeypatch) -> None:
    """A main plugin (here an entry point itself) delegating to another package's IPAM: the
    IPAM's hang ends at the nested deadline with error 11, its crash and exit are errors naming
    them, and the namespace, cwd, environment and thread it leaves stay in its child."""
    monkeypatch.setattr(delegate, "NESTED_TIMEOUT", 5.0)
    fake_dists("rt", {**REQUEST_FAULTS, "tiny": "tiny_mod", "main": "main_mod"},
               {"rt_mod": AT_REQUEST, "tiny_mod": GOOD, "main_mod": MAIN})
    for name in [*REQUEST_FAULTS, "tiny", "main"]:
        skel.load(name)  # checked and imported here once, as a daemon would at start
    env = {**ENV, "CNI_COMMAND": "ADD", "CNI_PATH": str(ipam_bin)}
    before = process_state()

    def add(ipam: str) -> tuple[int, dict]:
        reply = skel.run("main", env, conf("main", ipam={"type": ipam}))
        return reply.code, json.loads(reply.stdout)

    assert add("tiny")[1]["ips"][0]["address"] == "198.51.100.9/24"
    code, out = add("hang-req")
    assert code == 1 and out["code"] == 11 and "did not answer within 5s" in out["msg"], out
    code, out = add("segv-req")
    assert out["code"] == 999 and "crashed (SIGSEGV)" in out["msg"], out
    code, out = add("exit-req")
    assert out["code"] == 999 and "exit code 3" in out["msg"], out
    for ipam in ("thread-req", "netns-req"):
        code, out = add(ipam)
        assert code == 0 and out["ips"][0]["address"] == "198.51.100.9/24", out
    assert process_state() == before


def make_venv(where: Path, dists: list[tuple[str, dict[str, str], dict[str, str]]]
              ) -> tuple[Path, Path]:
    """A venv of its own whose site dir holds `dists` (and a .pth to pycni and its
    dependencies: imported from there, but no entry point of theirs is read): its python and
    its site dir."""
    subprocess.run([str(VENV_PY), "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_path('purelib'))"], check=True, capture_output=True,
                               text=True).stdout.strip())
    deps = sysconfig.get_path("purelib", vars={"base": str(VENV_PY.parent.parent),
                                               "platbase": str(VENV_PY.parent.parent)})
    (site / "pycni-deps.pth").write_text(f"{deps}\n{ROOT}\n")
    for dist, entries, modules in dists:
        write_dist(site, dist, entries, modules)
    return python, site


@pytest.mark.root
def test_the_daemon_serves_while_bad_plugins_are_installed(host, pod, tmp_path) -> None:
    """A daemon whose venv holds plugins that fault at import and at request time: it starts
    (the import faults refused by name in its status), a request to a plugin it refused is
    error 50 naming why, one that hangs ends at --timeout with 11, a crash and an exit are
    999; a thread or a namespace left behind end that child only; loopback ADD is served
    throughout, into a real netns."""
    entries, modules = import_faults()
    base = Path(tempfile.mkdtemp(prefix="pycni-load-"))  # short socket path, 0700
    try:
        python, site = make_venv(base / "venv", [
            ("faulty", entries, modules),
            ("rt", REQUEST_FAULTS, {"rt_mod": AT_REQUEST})])
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name in ["loopback", *AT_IMPORT, *REQUEST_FAULTS, "late", "bad name"]:
            (bin_dir / name).symlink_to(BIN / "cni-plugin")
        sock, log = base / "run" / "pycni.sock", base / "daemon.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.name, str(python), "-m", "cni.fast.daemon",
                 "--socket", str(sock), "-v", "--timeout", "10", "--spares", "1"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        daemon = Daemon(proc, sock, log)
        try:
            _run_bad_plugins(daemon, Plugins(host, bin_dir=bin_dir), pod, site)
        finally:
            print(log.read_text())
            daemon.kill()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run_bad_plugins(daemon: Daemon, plugins: Plugins, pod, site: Path) -> None:
    wait_for(lambda: "listening" in daemon.log.read_text() or daemon.proc.poll() is not None,
             "the daemon to listen", limit=180)
    assert daemon.proc.poll() is None, daemon.log.read_text()
    refused = daemon.status()["plugins"]["refused"]
    assert sorted(refused) == sorted(AT_IMPORT), refused
    for name, (_, _, why) in AT_IMPORT.items():
        assert why in refused[name]

    def loopback() -> None:
        plugins.ok("loopback", "ADD", conf("loopback"), netns=pod.path, ifname="lo",
                   env=daemon.env)
        assert "UP" in pod.links()["lo"]["flags"]
        pod.run("ip", "link", "set", "lo", "down")

    def call(name: str) -> tuple[int, dict]:
        code, out, _ = plugins.exec(name, "ADD", conf(name), netns=pod.path, env=daemon.env)
        return code, out

    loopback()
    code, out = call("hang-import")
    assert code == 1 and out["code"] == 50 and "did not finish within" in out["msg"], out
    code, out = call("hang-req")
    assert code == 1 and out["code"] == 11 and "timed out after 10s" in out["msg"], out
    loopback()
    for name in ("segv-req", "exit-req"):
        code, out = call(name)
        assert code == 1 and out["code"] == 999, out
    for name in ("thread-req", "netns-req"):
        code, out = call(name)
        assert code == 0 and out["ips"][0]["address"] == "198.51.100.9/24", out
        loopback()
    # the table is fixed at start: a package installed since is not read (restart the daemon),
    # a name outside the pattern is error 7; both answered before the caller's namespaces
    write_dist(site, "late", {"late": "late_mod"}, {"late_mod": GOOD})
    code, out = call("late")
    assert code == 1 and out["code"] == 999 and "restart" in out["msg"], out
    code, out = call("bad name")
    assert code == 1 and out["code"] == 7 and "invalid plugin name 'bad name'" in out["msg"], out
    loopback()


def planted(where: Path, marker: Path) -> Path:
    """`where`, owned by nobody, holding a distribution whose module writes `marker` when
    imported (and would be a plugin named evil)."""
    where.mkdir()
    write_dist(where, "evil", {"evil": "evil_mod"},
               {"evil_mod": f"open({str(marker)!r}, 'w').write('imported')\n" + GOOD})
    subprocess.run(["chown", "-R", "nobody:nogroup", str(where)], check=True)
    return where


@pytest.mark.root
@pytest.mark.parametrize("via", ["cwd", "PYTHONPATH"])
def test_install_reads_no_entry_point_from_cwd_or_pythonpath(tmp_path, via) -> None:
    """Root runs `python -m cni.cli install` in a dir another user can write (sys.path[0]), or
    with PYTHONPATH kept (sudo -E): a distribution planted there is neither imported nor baked
    into the executable's table; entry points come from the venv's site dirs only."""
    from cni.install import MULTICALL

    marker = tmp_path / "imported"
    plant = planted(tmp_path / "planted", marker)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "PYCNI_SYSTEMD": "0",
           "PYCNI_SOCKET": str(tmp_path / "no-daemon.sock")}
    if via == "PYTHONPATH":
        env["PYTHONPATH"] = str(plant)
    proc = subprocess.run([str(VENV_PY), "-m", "cni.cli", "install", "--bin-dir", str(bin_dir),
                           "--conf-dir", str(conf_dir), "--no-compile"],
                          cwd=plant if via == "cwd" else tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()
    assert "_plugins = {}  # pycni:plugins" in (bin_dir / MULTICALL).read_text()
    assert not (bin_dir / "evil").exists() and "evil" not in proc.stdout


def test_a_plugin_file_others_can_write_is_refused_naming_path_and_owner(fake_dists) -> None:
    """A module file group or others can write, a package file owned by another user, a
    dist-info file others can write, another module its distribution ships (RECORD) others
    can write: each plugin refused by install, doctor and the in-process
    path, naming the path, its owner and mode; the module never imported."""
    site = fake_dists("loose", {"ww": "ww_mod", "pkg": "pkg_mod", "tiny": "tiny_mod"},
                      {"ww_mod": GOOD, "tiny_mod": GOOD})
    (site / "pkg_mod").mkdir()
    (site / "pkg_mod" / "__init__.py").write_text(GOOD)
    (site / "pkg_mod" / "__init__.py").chmod(0o644)
    os.chown(site / "pkg_mod" / "__init__.py", 65534, 65534)
    (site / "ww_mod.py").chmod(0o666)
    write_dist(site, "looseinfo", {"wwinfo": "wwinfo_mod"}, {"wwinfo_mod": GOOD})
    (site / "looseinfo-1.0.dist-info" / "entry_points.txt").chmod(0o646)
    # a module the plugin's distribution ships beside it (its RECORD lists it), others can write
    write_dist(site, "rec", {"rec": "rec_mod"}, {"rec_mod": "import helper_mod\n",
                                                   "helper_mod": GOOD})
    (site / "rec-1.0.dist-info" / "RECORD").write_text("rec_mod.py,,\nhelper_mod.py,,\n")
    (site / "helper_mod.py").chmod(0o662)
    table, skipped = entrypoints.plugin_table([str(site)])
    assert table == {"tiny": ("tiny_mod", "")}
    assert f"{site}/ww_mod.py is owned by root (uid 0) with mode 0666" in skipped["ww"]
    assert f"{site}/helper_mod.py is owned by root (uid 0) with mode 0662" in skipped["rec"]
    assert f"{site}/pkg_mod/__init__.py is owned by nobody (uid 65534)" in skipped["pkg"]
    assert (f"{site}/looseinfo-1.0.dist-info/entry_points.txt is owned by root (uid 0) with "
            f"mode 0646") in skipped["wwinfo"]
    found = {f.what: f for f in doctor.plugin_findings()}
    assert "ww_mod.py" in found["plugin ww"].detail and found["plugin ww"].status == doctor.WARN
    registry._found = None
    reply = skel.run("ww", {**ENV, "CNI_COMMAND": "ADD"}, conf("ww"))
    out = json.loads(reply.stdout)
    assert out["code"] == 50 and "ww_mod.py is owned by root (uid 0) with mode 0666" in out["msg"]
    assert "ww_mod" not in sys.modules and "pkg_mod" not in sys.modules


def test_a_plugin_module_shadowed_by_an_earlier_sys_path_entry_is_refused(
        fake_dists, tmp_path, monkeypatch) -> None:
    """The site dir's module passed the checks; a module of the same name earlier on this
    process's sys.path (a cwd, PYTHONPATH) is what import would load: refused, naming it."""
    fake_dists("shadowed", {"shady": "shady_mod"}, {"shady_mod": GOOD})
    early = tmp_path / "early"
    early.mkdir()
    (early / "shady_mod.py").write_text("raise SystemExit('planted')\n")
    monkeypatch.syspath_prepend(str(early))
    reply = skel.run("shady", {**ENV, "CNI_COMMAND": "ADD"}, conf("shady"))
    out = json.loads(reply.stdout)
    assert out["code"] == 50 and f"would be imported from {early}/shady_mod.py" in out["msg"], out
    assert "shady_mod" not in sys.modules
