"""How install writes: every file under a temporary name in its dir, fsynced and renamed over the
path (a symlink made under a temporary name, then renamed), so a runtime exec'ing a plugin during
an install or an upgrade finds the old file or the new one, never a missing or partial one; the
file a --force install replaces kept as a backup; the dirs it had to make remembered."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cni.install import trust
from cni.install.errors import BACKUPS


def atomic_write(path: Path, data: bytes, mode: int) -> None:
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


def atomic_symlink(path: Path, target: str) -> None:
    tmp = path.parent / f".pycni-tmp-{os.getpid()}-{path.name}"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def keep_backup(bin_dir: Path, path: Path) -> str:
    """A second name for the file at path, in the bin dir's backups (uninstall restores it)."""
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


def make_dirs(d: Path) -> list[Path]:
    """mkdir -p, returning the dirs it created (outermost first) so uninstall can remove them.
    A name that appeared meanwhile (another install made it) must pass trust.walk itself."""
    missing = []
    p = d
    while not (p.exists() or p.is_symlink()):
        missing.append(p)
        p = p.parent
    made = []
    for m in reversed(missing):
        try:
            m.mkdir(mode=0o755)
            made.append(m)
        except FileExistsError:
            trust.walk(m, "dir made meanwhile")
    return made


def fsync_dir(path: Path) -> None:
    """A rename or a new name in path survives a power loss once this returns."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
