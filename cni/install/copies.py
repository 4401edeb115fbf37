"""The code the installed plugin executables run when pycni is installed from a wheel: a copy of
the cni package for each version installed, in the bin dir (`.pycni-lib/<version>-<digest>`),
never changed once in place.

pip upgrades a package in place: it moves the old files away, then writes the new ones one by
one. A plugin exec'd meanwhile that imported cni from site-packages would find it missing or
half-written (ModuleNotFoundError: the runtime's ADD or DEL fails). The executables import this
copy instead (their root line names it, cni/install/render.py). The daemon runs from
site-packages: it starts (or hands over, cni/install/upgrade.py) once pip is done.

The rules, all applied under the bin dir's install lock (cni/install/lock.py), so no two installs
make, check or prune copies at once:

- A copy is made under a temporary name, compiled, and a digest of every file (sources and
  bytecode) written into it last (`.pycni-digests.json`); every file and dir of it is fsynced,
  then it is renamed into place and the lib dir fsynced. A power loss leaves either no copy or a
  whole one on disk.
- A copy in place is reused only if every file still matches its digest. A damaged one (its files
  emptied by a crash of the filesystem under it, or edited) is moved aside and made again.
- A copy is removed only when no executable names it (the bin dir's executable, any executable
  kept as a backup, the manifest) and no process may still run it (cni/install/inuse.py: a path
  under it open, mapped or the cwd, or a plugin exec'd from the bin dir before its executable
  last changed). Prune waits a few seconds for such processes (a plugin call is short); one still
  running keeps its copies until the next install or uninstall.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from cni.install import files, inuse

LIB = ".pycni-lib"
DIGESTS = ".pycni-digests.json"  # in each copy, written last
PRUNE_WAIT = 10.0  # seconds prune waits for the processes that may run an old copy
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


class LibError(Exception):
    """The copy could not be made (nothing of it is left behind)."""


def _files(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def path_for(bin_dir: Path, package: Path, version: str) -> Path:
    """Where the copy of `package` goes: named by its version and a digest of its files, so a
    different build of one version never reuses another's copy."""
    digest = hashlib.sha256()
    for f in _files(package):
        digest.update(str(f.relative_to(package)).encode() + b"\0" + f.read_bytes() + b"\0")
    return bin_dir / LIB / f"{version}-{digest.hexdigest()[:16]}"


def compile_tree(python: Path, path: Path) -> str:
    """Bytecode for every module under path, by `python` (the interpreter that will run it, so
    the first exec compiles nothing); "" on success, else what went wrong."""
    proc = subprocess.run([str(python), "-m", "compileall", "-q", str(path)],
                          capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"compileall {path} failed: {proc.stdout}{proc.stderr}"


def _digests(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file() and p.name != DIGESTS}


def intact(copy: Path) -> bool:
    """Whether every file the copy's digest file lists is there with its digest."""
    try:
        listed = json.loads((copy / DIGESTS).read_bytes())
        return bool(listed) and all(
            hashlib.sha256((copy / rel).read_bytes()).hexdigest() == want
            for rel, want in listed.items())
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _fsync_tree(tree: Path) -> None:
    for dirpath, _dirs, names in os.walk(tree, topdown=False):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        files.fsync_dir(Path(dirpath))


def make(dest: Path, package: Path, python: Path) -> bool:
    """Copy `package` (as dest/cni), compile it with `python`, record its digests, fsync it all
    and rename it into place; False if an intact copy is there already. Called under the bin
    dir's install lock."""
    if dest.is_dir() and intact(dest):
        return False
    dest.parent.mkdir(mode=0o755, exist_ok=True)
    tmp = dest.parent / f".tmp-{os.getpid()}-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(package, tmp / "cni", ignore=_SKIP)  # links followed: cni/data's
        if failed := compile_tree(python, tmp):
            raise LibError(failed)
        (tmp / DIGESTS).write_text(json.dumps(_digests(tmp), indent=0))
        _fsync_tree(tmp)
        if dest.is_dir() or dest.is_symlink():  # damaged: aside, then the whole one in place
            os.rename(dest, dest.parent / f".tmp-damaged-{os.getpid()}-{dest.name}")
        os.rename(tmp, dest)
        files.fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for d in dest.parent.glob(f".tmp-damaged-{os.getpid()}-*"):
        shutil.rmtree(d, ignore_errors=True)
    return True


def prune(lib_dir: Path, keep: set[str], bin_dir: Path, switched: int,
          wait: float | None = None) -> tuple[list[str], dict[str, int]]:
    """Remove the copies not in keep that no process may run (waiting up to `wait` seconds for
    those), and temporary dirs (under the install lock, only an interrupted install's). The dirs
    removed, and the copies left in use with a pid using each."""
    if not lib_dir.is_dir():
        return [], {}
    wait = PRUNE_WAIT if wait is None else wait
    gone: list[str] = []
    for d in sorted(lib_dir.glob(".tmp-*")):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(str(d))
    deadline = time.monotonic() + wait
    while True:
        old = [d for d in sorted(lib_dir.iterdir())
               if str(d) not in keep and d.is_dir() and not d.is_symlink()]
        used = inuse.users(old, bin_dir, switched) if old else {}
        for d in old:
            if str(d) not in used:
                shutil.rmtree(d)
                gone.append(str(d))
        if not used or time.monotonic() >= deadline:
            return gone, used
        time.sleep(0.1)
