"""`pycni install` / `pycni uninstall`: put the plugins where a runtime finds them, and take back
exactly what was put there.

Install writes one multi-call executable (`pycni-plugin`) into the bin dir, a relative symlink to
it for each plugin name, and a conflist from conf/ into the conf dir. Both come from the package's
data (cni/data: links to the checkout's bin/cni-plugin and conf/, copied into the wheel), so any
installed copy can install: a wheel in a venv, pipx, a checkout. The executable is rewritten for
its new home: its first line runs the venv interpreter directly (`#!<venv python> -IS`: no sh
trampoline, no /usr/bin/env), its root line names the dir the `cni` package is in (the checkout;
installed from a wheel, a copy of the package made in the bin dir, cni/plugin_lib.py, because pip
upgrades site-packages in place), and its path lines name where the dependencies are; the marker
line stays so bridge still recognises our host-local and runs it in-process.

Every file is written under a temporary name in its dir, fsynced and renamed over the path (a
symlink made under a temporary name, then renamed): a runtime exec'ing a plugin during an install
or an upgrade finds the old file or the new one, never a missing or partial one. Everything
written (and every file it replaced with --force, kept as a backup) is recorded in a
manifest in the bin dir, so uninstall removes exactly that, restores what was replaced, and leaves
anything else (another vendor's plugin, a file an admin edited since) alone.

On a systemd host (as sd_booted() tells: /run/systemd/system is a directory) install also writes
conf/pycni.socket and conf/pycni.service into /etc/systemd/system, the service's ExecStart being
this venv's `pycni daemon`, and enables the socket: the first plugin call starts the daemon, so a
node is fast by default. `--no-systemd` or PYCNI_SYSTEMD=0 opts out; uninstall disables them.
With the units, a running daemon restarts (try-restart); without, a daemon of another version
answering on the socket (PYCNI_SOCKET) hands over to one running this (cni/fast/handover.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from cni import __version__, plugin_lib, registry

ROOT = Path(__file__).resolve().parent.parent  # the dir `cni` is in: a checkout or site-packages
PACKAGE = ROOT / "cni"
DATA = resources.files("cni") / "data"
SOURCE = DATA / "cni-plugin"
CONF_SRC = DATA / "conf"
MULTICALL = "pycni-plugin"
MANIFEST = ".pycni-install.json"
BACKUPS = ".pycni-backup"
MARKER = "pycni-multicall"
ROOT_TAG = "# pycni:root"
PATH_TAG = "# pycni:path"
PLUGINS_TAG = "# pycni:plugins"
DEFAULT_BIN = Path("/opt/cni/bin")
DEFAULT_CONF = Path("/etc/cni/net.d")
DEFAULT_CONFLIST = "10-pycni.conflist"
SYSTEMD_DIR = Path("/etc/systemd/system")
UNITS = ("pycni.socket", "pycni.service")
SHEBANG_MAX = 255  # the kernel reads at most this much of a #! line (BINPRM_BUF_SIZE - 1)


class InstallError(Exception):
    """Install or uninstall refused; nothing (further) was changed."""


@dataclass
class Entry:
    """One path install wrote: a file (with its digest) or a symlink (with its target)."""

    path: str
    kind: str  # "file" | "symlink"
    digest: str = ""
    target: str = ""
    backup: str = ""  # where the file it replaced (with --force) was kept

    def matches_disk(self) -> bool:
        """Whether the path still holds what install wrote (else it is someone else's now)."""
        p = Path(self.path)
        if self.kind == "symlink":
            return p.is_symlink() and os.readlink(p) == self.target
        return p.is_file() and not p.is_symlink() and _digest(p.read_bytes()) == self.digest


@dataclass
class Manifest:
    bin_dir: str
    root: str = str(ROOT)
    python: str = ""
    entries: list[Entry] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    systemd: bool = False  # units were installed and enabled: uninstall disables them
    lib: str = ""  # the copy of the package the executables run (plugin_lib), if installed
    plugins: dict[str, str] = field(default_factory=dict)  # entry-point plugins linked: target

    @classmethod
    def load(cls, bin_dir: Path) -> Manifest | None:
        path = bin_dir / MANIFEST
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return cls(bin_dir=raw["bin_dir"], root=raw.get("root", ""), python=raw.get("python", ""),
                   entries=[Entry(**e) for e in raw.get("entries", [])],
                   created_dirs=list(raw.get("created_dirs", [])),
                   systemd=bool(raw.get("systemd", False)), lib=raw.get("lib", ""),
                   plugins=dict(raw.get("plugins", {})))

    def save(self) -> None:
        data = {"bin_dir": self.bin_dir, "root": self.root, "python": self.python,
                "entries": [vars(e) for e in self.entries], "created_dirs": self.created_dirs,
                "systemd": self.systemd, "lib": self.lib, "plugins": self.plugins}
        _atomic_write(Path(self.bin_dir) / MANIFEST, json.dumps(data, indent=2).encode() + b"\n",
                      0o644)

    def find(self, path: Path) -> Entry | None:
        return next((e for e in self.entries if e.path == str(path)), None)


@dataclass
class Planned:
    """What install is about to write at one path."""

    path: Path
    kind: str
    content: bytes = b""
    target: str = ""
    mode: int = 0o755

    def same_as_disk(self) -> bool:
        if self.kind == "symlink":
            return self.path.is_symlink() and os.readlink(self.path) == self.target
        return (self.path.is_file() and not self.path.is_symlink()
                and self.path.read_bytes() == self.content)


def venv_python() -> Path:
    """The interpreter the executables run: a checkout's venv (it has the dependencies), else
    the one running this (a wheel's venv, pipx's). Not resolved: a venv's python is a link."""
    venv = ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


def site_dirs(python: Path) -> list[str]:
    """Where `python` finds its installed packages (purelib, platlib): the executables run it
    with -S, so they put these on sys.path themselves."""
    code = "import sysconfig as s; print(s.get_path('purelib')); print(s.get_path('platlib'))"
    try:
        proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(f"cannot run {python}: {e}") from None
    if proc.returncode != 0:
        raise InstallError(f"{python} failed to name its site dirs: {proc.stderr.strip()}")
    out: list[str] = []
    for d in proc.stdout.split():
        if not any(os.path.realpath(d) == os.path.realpath(seen) for seen in out):
            out.append(d)
    return out


def render_multicall(python: Path, root: Path, source: str | None = None,
                     sites: list[str] | None = None,
                     plugins: dict[str, tuple[str, str]] | None = None) -> bytes:
    """bin/cni-plugin rewritten for an installed copy: direct shebang, absolute root, and the
    dependencies' dirs (sites, default site_dirs(python)) after the stdlib. A checkout's root
    comes first, as in bin/; a root that is itself a site dir (a wheel) goes last with the rest,
    so nothing installed there can shadow the stdlib modules the shim imports. `plugins` (see
    plugin_table) is baked in as cni.registry.INSTALLED."""
    text = SOURCE.read_text() if source is None else source
    shebang = f"#!{python} -IS"
    if len(shebang) > SHEBANG_MAX or " " in str(python):
        raise InstallError(f"interpreter path {python} cannot go in a #! line "
                           f"(too long or has spaces): move the project to a shorter path")
    sites = site_dirs(python) if sites is None else sites
    in_site = _in_site(root, sites)
    paths = ([] if in_site else ["sys.path.insert(0, _root)"]) + [
        f"sys.path.append({d!r})" for d in sites]
    out = [shebang]
    saw_root = saw_path = False
    for line in text.splitlines()[1:]:
        if line.startswith("''''"):  # the sh trampoline line: the shebang now does its job
            continue
        if ROOT_TAG in line and line.lstrip().startswith("_root"):
            line = f"_root = {str(root)!r}  {ROOT_TAG}"
            saw_root = True
        elif line.endswith(PLUGINS_TAG):
            line = f"registry.INSTALLED.update({dict(sorted((plugins or {}).items()))!r})  " \
                f"{PLUGINS_TAG}"
        elif line.endswith(PATH_TAG):
            if not saw_path:
                out += [f"{p}  {PATH_TAG}" for p in paths]
            saw_path = True
            continue
        out.append(line)
    body = "\n".join(out) + "\n"
    if MARKER not in body[:1024] or not saw_root or not saw_path:
        raise InstallError(f"{SOURCE} lacks the {MARKER!r} marker or the {ROOT_TAG!r} or "
                           f"{PATH_TAG!r} lines")
    return body.encode()


def plugin_table() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The entry-point plugins to link (cni.registry.discover), each imported once to read the
    versions it speaks: name -> (target, its SUPPORTED_FROM or ""); and those skipped: name ->
    why (refused by the registry, or failing to import)."""
    from cni import skel

    table, skipped = {}, {}
    for name, target in registry.discover(refresh=True).items():
        try:
            skel.load(name)
        except Exception as e:  # the others are still linked
            skipped[name] = f"importing {target} failed: {type(e).__name__}: {e}"
            continue
        table[name] = (target, registry.SUPPORTED_FROM.get(name, ""))
    return table, {**registry.REFUSED, **skipped}


def _in_site(root: Path, sites: list[str]) -> bool:
    return any(os.path.realpath(d) == os.path.realpath(root) for d in sites)


def conflist_source(name: str) -> Path | Traversable:
    """A conflist shipped in the package (conf/) by file name, or any path to one."""
    direct = Path(name)
    if direct.is_file():
        return direct
    if "/" not in name:
        candidate = CONF_SRC / name
        if candidate.is_file():
            return candidate
    available = ", ".join(shipped_conflists()) or "none"
    raise InstallError(f"no conflist {name!r} in {CONF_SRC} (available: {available})")


def shipped_conflists() -> list[str]:
    """The names of the conflists the package ships."""
    return sorted(p.name for p in CONF_SRC.iterdir() if p.name.endswith((".conf", ".conflist")))


def render_conflist(src: Path | Traversable, cni_version: str | None) -> bytes:
    """The conflist as it will be written; with cni_version its cniVersion is rewritten (runtimes
    built on libcni before 1.2, like containerd 1.6 and 1.7 and podman 4, refuse 1.1.0)."""
    raw = src.read_bytes()
    try:
        conf = json.loads(raw)
    except ValueError as e:
        raise InstallError(f"{src}: not JSON: {e}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("name"), str):
        raise InstallError(f"{src}: not a network configuration (no name)")
    if cni_version is None:
        return raw
    conf["cniVersion"] = cni_version
    return json.dumps(conf, indent=2).encode() + b"\n"


def systemd_dir(requested: Path | None, enabled: bool = True) -> Path | None:
    """Where the units go: the dir asked for, else /etc/systemd/system on a systemd host; None
    when opted out (--no-systemd, PYCNI_SYSTEMD=0) or systemd is not running."""
    if not enabled or os.environ.get("PYCNI_SYSTEMD", "") == "0":
        return None
    if requested is not None:
        return requested.absolute()
    return SYSTEMD_DIR if Path("/run/systemd/system").is_dir() else None


def render_unit(name: str, python: Path) -> bytes:
    """conf/<name> for this install: the daemon is this venv's `pycni daemon`; the docs are the
    README the package carries."""
    text = (CONF_SRC / name).read_text()
    pycni = python.parent / "pycni"
    daemon = f"{pycni} daemon" if pycni.exists() else f"{python} -m cni.cli daemon"
    out = []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={daemon}"
        elif line.startswith("Documentation=file://"):
            line = f"Documentation=file://{Path(str(DATA / 'README.md')).resolve()}"
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def plan(bin_dir: Path, conf_dir: Path | None, conflist: str | None,
         cni_version: str | None = None, python: Path | None = None,
         units_dir: Path | None = None, root: Path = ROOT,
         sites: list[str] | None = None,
         plugins: dict[str, tuple[str, str]] | None = None) -> list[Planned]:
    """What install writes; `plugins`, the entry-point plugins (plugin_table), are linked too."""
    python = python or venv_python()
    plugins = plugins or {}
    items = [Planned(bin_dir / MULTICALL, "file",
                     render_multicall(python, root, sites=sites, plugins=plugins))]
    items += [Planned(bin_dir / name, "symlink", target=MULTICALL)
              for name in (*registry.NAMES, *sorted(plugins))]
    if conf_dir is not None and conflist:
        src = conflist_source(conflist)
        items.append(Planned(conf_dir / src.name, "file", render_conflist(src, cni_version),
                             mode=0o644))
    if units_dir is not None:
        items += [Planned(units_dir / u, "file", render_unit(u, python), mode=0o644)
                  for u in UNITS]
    return items


def install(bin_dir: Path = DEFAULT_BIN, conf_dir: Path | None = DEFAULT_CONF,
            conflist: str | None = DEFAULT_CONFLIST, *, force: bool = False,
            cni_version: str | None = None, compile_bytecode: bool = True,
            units_dir: Path | None = None) -> list[str]:
    """Install; returns human-readable lines of what was done. Refuses (changing nothing) when a
    different file is in the way, unless force (which keeps the old one as a backup). With
    units_dir (see systemd_dir) the daemon's units go there and the socket is enabled."""
    bin_dir, conf_dir = bin_dir.absolute(), conf_dir.absolute() if conf_dir else None
    python = venv_python()
    sites = site_dirs(python)
    # Installed from a wheel, the executables run a copy pip never changes (plugin_lib).
    lib = plugin_lib.path_for(bin_dir, PACKAGE, __version__) if _in_site(ROOT, sites) else None
    table, skipped = plugin_table()
    items = plan(bin_dir, conf_dir, conflist, cni_version, python, units_dir,
                 root=lib or ROOT, sites=sites, plugins=table)
    old = Manifest.load(bin_dir)
    conflicts = [it.path for it in items
                 if (it.path.exists() or it.path.is_symlink()) and not it.same_as_disk()
                 and not (old and (e := old.find(it.path)) and e.matches_disk())]
    if conflicts and not force:
        raise InstallError("refusing to overwrite " + ", ".join(map(str, conflicts))
                           + " (different files are there; --force replaces them, keeping backups"
                           " that uninstall restores)")
    manifest = old or Manifest(bin_dir=str(bin_dir))
    manifest.root, manifest.python = str(ROOT), str(python)
    for d in filter(None, (bin_dir, conf_dir, units_dir)):
        manifest.created_dirs += [str(p) for p in _make_dirs(d)]
    done = [f"skipped plugin {name}: {why}" for name, why in sorted(skipped.items())]
    manifest.plugins = {name: target for name, (target, _) in table.items()}
    if lib is not None:
        if plugin_lib.make(lib, PACKAGE, python):
            done.append(f"copied {PACKAGE} to {lib} (what the plugins run)")
        previous, manifest.lib = manifest.lib, str(lib)
        manifest.save()
    for it in items:
        entry = manifest.find(it.path)
        if entry is None and it.same_as_disk():
            done.append(f"kept {it.path} (already the same)")
            continue  # it was there before us: not ours to remove later
        backup = entry.backup if entry else ""
        if it.path in conflicts:
            kept = _keep_backup(bin_dir, it.path)
            backup = backup or kept  # uninstall restores the oldest: what was there before us
            done.append(f"kept the previous {it.path} as {kept}")
        if it.kind == "symlink":
            _atomic_symlink(it.path, it.target)
            new = Entry(str(it.path), "symlink", target=it.target, backup=backup)
        else:
            _atomic_write(it.path, it.content, it.mode)
            new = Entry(str(it.path), "file", digest=_digest(it.content), backup=backup)
        manifest.entries = [e for e in manifest.entries if e.path != new.path] + [new]
        done.append(f"wrote {it.path}")
        manifest.save()  # after each file: an interrupted install can still be uninstalled
    done += _unlink_dropped(manifest, {str(it.path) for it in items})
    manifest.save()
    if lib is not None:  # execs still running the replaced executable may need its copy
        done += [f"removed {d}" for d in plugin_lib.prune(lib.parent, {str(lib), previous})]
    if compile_bytecode:
        compile_package(python)
        done.append(f"compiled bytecode of {PACKAGE}")
    if units_dir is not None:
        manifest.systemd = True
        manifest.save()
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", "pycni.socket")
        _systemctl("try-restart", "pycni.service")  # a running daemon takes up the new code
        done.append("enabled pycni.socket (the first plugin call starts pycni.service)")
    else:
        done.append(_daemon_takes_up_new_code())
    return done


def _unlink_dropped(manifest: Manifest, planned: set[str]) -> list[str]:
    """A plugin name an earlier install linked and this one does not (its package is gone):
    removed, as uninstall would (what was there before it restored)."""
    done = []
    for e in [e for e in manifest.entries if e.kind == "symlink" and e.target == MULTICALL
              and e.path not in planned]:
        path = Path(e.path)
        if e.matches_disk():
            path.unlink()
            done.append(f"removed {path} (no such plugin any more)")
            if e.backup and Path(e.backup).exists():
                os.replace(e.backup, path)
        manifest.entries.remove(e)
    return done


def _daemon_takes_up_new_code() -> str:
    """A daemon running another version hands over to one running this (cni.fast.handover)."""
    from cni.fast import handover

    try:
        return handover.upgrade(__version__)
    except handover.HandoverError as e:
        raise InstallError(f"installed, but the running daemon still runs other code: {e}") \
            from None


def uninstall(bin_dir: Path = DEFAULT_BIN) -> list[str]:
    """Remove what the manifest in bin_dir records, restore backups, drop dirs install made."""
    bin_dir = bin_dir.absolute()
    manifest = Manifest.load(bin_dir)
    if manifest is None:
        raise InstallError(f"no pycni install recorded in {bin_dir} ({MANIFEST} missing)")
    done = []
    if manifest.systemd:
        _systemctl("disable", "--now", *UNITS, check=False)
        done.append("disabled and stopped " + " ".join(UNITS))
    for e in reversed(manifest.entries):
        path = Path(e.path)
        if e.matches_disk():
            path.unlink()
            done.append(f"removed {path}")
        elif path.exists() or path.is_symlink():
            done.append(f"left {path}: changed since install, not ours any more")
            continue
        if e.backup and Path(e.backup).exists():
            os.replace(e.backup, path)
            done.append(f"restored {path} from {e.backup}")
    if manifest.systemd:
        _systemctl("daemon-reload", check=False)
    if manifest.lib:
        done += [f"removed {d}" for d in plugin_lib.remove(bin_dir / plugin_lib.LIB)]
    (bin_dir / MANIFEST).unlink()
    backups = bin_dir / BACKUPS
    if backups.is_dir() and not any(backups.iterdir()):
        backups.rmdir()
    for d in sorted(manifest.created_dirs, key=len, reverse=True):
        try:
            Path(d).rmdir()
            done.append(f"removed empty dir {d}")
        except OSError:
            pass  # not empty: someone else uses it now
    return done


def compile_package(python: Path) -> None:
    """Bytecode for the cni package, so the first exec of a plugin need not compile anything."""
    if failed := plugin_lib.compile_tree(python, PACKAGE):
        raise InstallError(failed)


def _systemctl(*args: str, check: bool = True) -> None:
    try:
        proc = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    except OSError as e:
        if check:
            raise InstallError(f"systemctl {' '.join(args)}: {e}") from None
        return
    if proc.returncode != 0 and check:
        raise InstallError(f"systemctl {' '.join(args)} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")


def _keep_backup(bin_dir: Path, path: Path) -> str:
    backups = bin_dir / BACKUPS
    backups.mkdir(mode=0o700, exist_ok=True)
    # Flattened path: a conflist and a plugin with the same name must not collide.
    dest = base = backups / str(path).strip("/").replace("/", "%")
    n = 0
    while dest.exists() or dest.is_symlink():
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    try:  # a second name: the path keeps the old file until the new one is renamed over it
        os.link(path, dest, follow_symlinks=False)
    except OSError:
        os.replace(path, dest)  # a directory, or a filesystem without hard links
    return str(dest)


def _make_dirs(d: Path) -> list[Path]:
    """mkdir -p, returning the dirs it created (outermost first) so uninstall can remove them."""
    missing = []
    p = d
    while not p.exists():
        missing.append(p)
        p = p.parent
    for m in reversed(missing):
        m.mkdir(mode=0o755)
    return list(reversed(missing))


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Readers (a runtime watching the conf dir) see the old file or the new one, never half.
    The temp name ends in neither .conf nor .conflist, so no runtime loads it meanwhile."""
    fd, tmp = tempfile.mkstemp(prefix=".pycni-tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_symlink(path: Path, target: str) -> None:
    tmp = path.parent / f".pycni-tmp-{os.getpid()}-{path.name}"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe(manifest: Manifest) -> dict[str, Any]:
    """The manifest as `pycni doctor` shows it."""
    return {"root": manifest.root, "python": manifest.python,
            "files": [e.path for e in manifest.entries], "plugins": manifest.plugins}
