"""The code the installed plugin executables run when pycni is installed from a wheel: a copy of
the cni package for each version installed, in the bin dir (`.pycni-lib/<version>-<digest>`),
never changed once in place.

pip upgrades a package in place: it moves the old files away, then writes the new ones one by
one. A plugin exec'd meanwhile that imported cni from site-packages would find it missing or
half-written (ModuleNotFoundError: the runtime's ADD or DEL fails). The executables import this
copy instead (their root line names it, cni.install): a version's copy is made under a temporary
name, compiled, and renamed into place before the executable is switched to it by a rename; the
copy the replaced executable used stays for execs still running it, older ones go. The daemon
runs from site-packages: it starts (or hands over, cni.fast.handover) once pip is done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

LIB = ".pycni-lib"
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


def make(dest: Path, package: Path, python: Path) -> bool:
    """Copy `package` (as dest/cni) and compile it with `python`, then rename it into place;
    False if it is there already (a copy in place is complete: renamed last)."""
    if dest.is_dir():
        return False
    dest.parent.mkdir(mode=0o755, exist_ok=True)
    tmp = dest.parent / f".tmp-{os.getpid()}-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(package, tmp / "cni", ignore=_SKIP)  # links followed: cni/data's
        if failed := compile_tree(python, tmp):
            raise LibError(failed)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def prune(lib_dir: Path, keep: set[str]) -> list[str]:
    """Remove the copies (and interrupted temporary ones) not in keep; the dirs removed."""
    if not lib_dir.is_dir():
        return []
    gone = []
    for d in sorted(lib_dir.iterdir()):
        if str(d) not in keep and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
            gone.append(str(d))
    return gone


def remove(lib_dir: Path) -> list[str]:
    """Every copy, and the dir once empty (uninstall)."""
    gone = prune(lib_dir, set())
    try:
        lib_dir.rmdir()
    except OSError:
        pass  # absent, or holds something not ours
    return gone
