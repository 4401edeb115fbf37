"""A path root is about to read, run or write into, walked by safedir's rule before it does.

Every component from / is lstat'ed in turn, each symlink followed hop by hop (its target's
components walked too), and each must pass cni.host.safedir.why_untrusted. Unlike
safedir.open_dir, links are followed, not refused: install walks what a venv or a checkout
holds (the interpreter is a link), and a plugin's files from another package. Used by
`pycni install` (cni.install.trust adds its own words) and by cni.plugload before a plugin of
another package is imported.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cni.host import safedir

MAX_HOPS = 40  # symlinks followed in one path, as the kernel's ELOOP limit


class Untrusted(Exception):
    """A path that fails the walk. `rule` is True when a component breaks safedir's rule (its
    owner or mode), False when the path cannot be walked at all (missing, a loop)."""

    def __init__(self, message: str, *, rule: bool) -> None:
        super().__init__(message)
        self.rule = rule


def check(what: str, path: str, st: os.stat_result, ancestor: bool) -> None:
    """One component by the rule; a link passes on its owner alone (its target is walked)."""
    why = safedir.why_untrusted(st, ancestor=ancestor)
    if why:
        raise Untrusted(f"{what}: {safedir.describe(path, st, why)}", rule=True)


def walk(path: Path | str, what: str, *, ancestor: bool = False) -> str:
    """Check every component of path (absolute, or relative to the cwd) and of every symlink on
    the way; -> the real path. ancestor: path is only a dir something below it is looked up in
    (a root-owned sticky dir passes). Untrusted if a component fails or does not exist."""
    pending = [c for c in os.path.abspath(path).split("/") if c]
    cur = "/"
    check(what, cur, os.lstat(cur), ancestor or bool(pending))
    hops = 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            raise Untrusted(f"{what}: {nxt} does not exist", rule=False) from None
        except OSError as e:
            raise Untrusted(f"{what}: {nxt}: {e.strerror}", rule=False) from None
        check(what, nxt, st, ancestor or bool(pending))
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_HOPS:
                raise Untrusted(f"{what}: {path}: too many symlinks", rule=False)
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            pending = [c for c in target.split("/") if c] + pending
            continue
        cur = nxt
    return cur


def check_tree(top: Path, what: str) -> None:
    """top walked, then every dir and file under it: root's and writable by root alone (a
    package's files; a link in it walked to where it points)."""
    walk(top, what)
    for dirpath, dirs, names in os.walk(top):
        for name in dirs + names:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            check(what, path, st, ancestor=False)
            if stat.S_ISLNK(st.st_mode):
                walk(path, what)
