"""What root may read from and write into: only what root owns and no one else can change.

`pycni install` runs as root, and what it reads (the conflist it copies, the template of the
executables, the interpreter and the sys.path dirs it writes into them) ends up run by root for
every pod; what it writes into (the bin, conf and units dirs) is what the runtime execs. So every
such path is walked from / component by component, each symlink followed hop by hop, and every
component it meets must be:

- owned by root (or by the user running install, when that is not root: a user's own scratch
  install), symlinks included;
- not writable by group or others, except a root-owned sticky dir (/tmp) as an ancestor: there
  no one but root can rename or remove root's entries, and the entry below it must pass the rule
  itself. A sticky dir is never trusted as the path itself, nor as the dir a missing path would be
  created in by someone else (a sys.path dir that does not exist yet).

A dir install is about to create (its bin, conf or units dir) is checked through its nearest
existing ancestor, which may be a sticky dir: install makes each missing dir with mkdir, which
fails if someone made the name first. Everything is checked before the first write: a refusal
names the path, its owner and its mode, and leaves everything as it was.

The conflist given by path is opened with O_NOFOLLOW and checked on the open file (fstat), so a
symlink swapped in after the walk is never followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cni.host import safedir, safewalk
from cni.install.errors import InstallError

trusted_uids = safedir.trusted_uids  # the owners the rule accepts: root, and the euid
RULE = ("install reads and writes only what root owns and no one else can write (nothing was "
        "written)")


def _install_error(e: safewalk.Untrusted) -> InstallError:
    return InstallError(f"{e}; {RULE}" if e.rule else str(e))


def _check(what: str, path: str, st: os.stat_result, ancestor: bool) -> None:
    """The rule is cni.host.safedir's (tuning's dataDir walks by it too)."""
    try:
        safewalk.check(what, path, st, ancestor)
    except safewalk.Untrusted as e:
        raise _install_error(e) from None


def walk(path: Path | str, what: str, *, ancestor: bool = False) -> str:
    """cni.host.safewalk.walk (every component, every symlink hop); InstallError if it fails."""
    try:
        return safewalk.walk(path, what, ancestor=ancestor)
    except safewalk.Untrusted as e:
        raise _install_error(e) from None


def check_tree(top: Path, what: str) -> None:
    """top walked, then every dir and file under it (the package install copies and compiles;
    a link in it, as cni/data's in a checkout, walked)."""
    try:
        safewalk.check_tree(top, what)
    except safewalk.Untrusted as e:
        raise _install_error(e) from None


def walk_dir_to_make(path: Path, what: str) -> None:
    """A dir install writes into, made by install if missing: the dir itself if it exists, else
    its nearest existing ancestor, which install makes the rest in (mkdir: fails if taken)."""
    p = Path(os.path.abspath(path))
    if p.exists() or p.is_symlink():
        real = walk(p, what)
        if not os.path.isdir(real):
            raise InstallError(f"{what}: {path} is not a directory")
        return
    while not (p.exists() or p.is_symlink()):
        p = p.parent
    walk(p, what, ancestor=True)


def walk_maybe_missing(path: Path | str, what: str) -> None:
    """A path install names but does not make (a sys.path dir): if it is missing, whoever can
    make it could put code there, so its nearest existing ancestor must pass as a leaf."""
    p = Path(os.path.abspath(path))
    while not (p.exists() or p.is_symlink()):
        p = p.parent
    walk(p, what)


def read_file(path: Path, what: str) -> bytes:
    """A file given by path: its dir walked, the file itself opened without following a symlink
    and checked on the open file, then read."""
    path = Path(os.path.abspath(path))
    walk(path.parent, what, ancestor=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InstallError(f"{what}: {path} does not exist") from None
    except OSError as e:
        if os.path.islink(path):
            raise InstallError(f"{what}: {path} is a symlink: give the file's own path") \
                from None
        raise InstallError(f"{what}: cannot open {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InstallError(f"{what}: {path} is not a regular file")
        _check(what, str(path), st, ancestor=False)
        return f.read()
