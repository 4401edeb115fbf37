"""One of pycni's own lock files: an exclusive flock on a file in a directory of root's
(/run/pycni and below: /run is root's), taken by whatever runs a verb, in the caller's mount
namespace, so that the daemon's children and the shim's in-process fallback take the same one."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


def take(path: str) -> int:
    """Open (made if missing, with its directory, 0700; never through a symlink) and flock
    LOCK_EX the file at `path`, waiting for it: -> the fd, whose close releases the lock.
    OSError if it cannot be opened."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
    """take(path) for a `with` block."""
    fd = take(path)
    try:
        yield
    finally:
        os.close(fd)  # releases the flock
