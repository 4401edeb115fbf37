"""pycni's own lock files: an exclusive flock on a file in a directory of root's (/run/pycni and
below: /run is root's), taken by whatever runs a verb, in the caller's mount namespace, so that
the daemon's children and the shim's in-process fallback take the same one. Every wait is
bounded: a holder stuck inside (a netlink answer that never comes) costs the others an error
they can retry (Busy: CNI error 11), not a request that hangs until the runtime gives up."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator

from cni.host.errors import Busy


def open_file(path: str) -> int:
    """The lock file at `path`, made if missing (with its directory, 0700; the file 0600),
    never through a symlink; OSError if it cannot be opened (not root: /run is root's)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        return os.open(path, flags, 0o600)


def try_lock(fd: int) -> bool:
    """flock LOCK_EX without waiting: whether it is ours now."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def wait_lock(fd: int, deadline: float) -> bool:
    """try_lock until it succeeds or `deadline` (time.monotonic) passes. Polled: flock itself
    cannot time out without a signal, and a daemon's child keeps SIGALRM as its backstop. The
    pause doubles from 1 ms to 50 ms: a lock held for a moment is taken soon after."""
    pause = 0.001
    while not try_lock(fd):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)
    return True


def take(path: str, wait: float) -> int:
    """open_file(path) locked, waiting up to `wait` seconds: -> the fd, whose close releases
    the lock. OSError if it cannot be opened; Busy, naming the file, if it stays taken."""
    fd = open_file(path)
    try:
        if not wait_lock(fd, time.monotonic() + wait):
            raise Busy(f"the lock {path} is still held by another request after {wait:g}s; "
                       "try again later")
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def held(path: str, wait: float) -> Iterator[None]:
    """take(path, wait) for a `with` block."""
    fd = take(path, wait)
    try:
        yield
    finally:
        os.close(fd)  # releases the flock
