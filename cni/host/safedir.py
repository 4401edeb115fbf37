"""Directories root writes into, trusted only if no one but root can change what they hold.

The rule (shared with cni.install.trust, which applies it to what install reads and writes): every
component of the path is owned by root (or by the euid, for a user's own scratch run) and is not
writable by group or others, except a root-owned sticky dir (/tmp) as an ancestor, where no one
but root can rename or remove root's entries.

open_dir() applies it while it walks: from / one component at a time, each opened relative to the
one before with O_NOFOLLOW|O_DIRECTORY, so a symlink (planted, or swapped in after a check) is
refused, never followed, and the fd it returns is the dir that was checked: files are then made,
renamed and unlinked relative to it, never by a path someone could redirect.
"""

from __future__ import annotations

import os
import posixpath
import pwd
import stat

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDir(Exception):
    """A component root must not trust (or cannot reach without following a link)."""


def trusted_uids() -> set[int]:
    return {0, os.geteuid()}


def owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def why_untrusted(st: os.stat_result, *, ancestor: bool) -> str | None:
    """Why a component with this stat must not be trusted; None if it may. ancestor: only a dir
    something below it is looked up in (a root-owned sticky dir passes). A symlink's own mode
    means nothing: its owner is all that is checked here."""
    if st.st_uid not in trusted_uids():
        return "root must own it"
    if stat.S_ISLNK(st.st_mode):
        return None
    if st.st_mode & 0o022:
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
        if not (ancestor and sticky):
            return "group or others can write it"
    return None


def describe(path: str, st: os.stat_result, why: str) -> str:
    return (f"{path} is owned by {owner(st.st_uid)} with mode "
            f"{stat.S_IMODE(st.st_mode):04o}: {why}")


def open_dir(path: str, *, create: bool, mode: int = 0o700) -> int:
    """An fd of the absolute dir path, walked as the module says. create: missing components
    are made with `mode` whatever the umask (else FileNotFoundError). UnsafeDir names the
    component, its owner and mode; nothing is made below a component that fails."""
    path = posixpath.normpath(path)  # no link is followed, so '..' is only lexical
    if not path.startswith("/"):
        raise UnsafeDir(f"{path}: not an absolute path")
    names = [c for c in path.split("/") if c]
    fd = os.open("/", _OPEN_DIR)
    try:
        cur = "/"
        _check(fd, cur, ancestor=bool(names))
        for i, name in enumerate(names):
            cur = posixpath.join(cur, name)
            nfd = _open_or_make(fd, name, cur, create, mode)
            os.close(fd)
            fd = nfd
            _check(fd, cur, ancestor=i < len(names) - 1)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check(fd: int, path: str, *, ancestor: bool) -> None:
    st = os.fstat(fd)
    why = why_untrusted(st, ancestor=ancestor)
    if why:
        raise UnsafeDir(describe(path, st, why))


def _open_or_make(parent: int, name: str, path: str, create: bool, mode: int) -> int:
    for _ in range(2):  # a dir someone else made between our open and mkdir: opened, checked
        try:
            return os.open(name, _OPEN_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as e:  # ELOOP: a symlink; ENOTDIR: a file
            raise UnsafeDir(f"{path}: {e.strerror}: not a directory of its own (a symlink is "
                            "never followed)") from None
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            continue
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)  # mkdir's mode went through the umask
        return fd
    raise UnsafeDir(f"{path}: appeared and vanished while it was being made")
