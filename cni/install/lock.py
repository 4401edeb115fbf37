"""One install or uninstall at a time in a bin dir: an exclusive flock on `.pycni-install.lock`
there, held from the first write to the last (the copies in `.pycni-lib/` are made, checked and
pruned under it, so one install's prune never meets another's fresh copy or temporary dir).

Uninstall removes the lock file while it holds it; whoever waited on that file then finds its
lock is on a name no longer there and takes the lock again on the file now at the path."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = ".pycni-install.lock"


@contextmanager
def held(bin_dir: Path) -> Iterator[Path]:
    """The bin dir's install lock, waited for; yields the lock file's path."""
    path = bin_dir / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            break
        os.close(fd)  # removed (uninstall) while we waited: lock the file there now
    try:
        yield path
    finally:
        os.close(fd)
