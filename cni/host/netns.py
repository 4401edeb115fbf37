"""Network namespaces: open one by path or fd, enter it briefly, open netlink sockets in it.

We setns the calling thread and switch back rather than use pyroute2's netns helpers: those fork
a child per socket and default to O_CREAT, which would create a namespace for a bad path.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cni.spec.errors import CNIError, Code

if TYPE_CHECKING:
    from pyroute2 import IPRoute

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs fd: which kind of namespace it is
_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """libc by name: ctypes.util.find_library would fork ldconfig."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


class NetnsMissing(CNIError):
    """The path does not exist: code 4 naming CNI_NETNS (DEL treats it as success)."""

    def __init__(self, target: int | str) -> None:
        super().__init__(Code.INVALID_ENV, f"CNI_NETNS {target!r}: no such network namespace")


def open_ns(target: int | str) -> int:
    """A new fd for the namespace at `target` (path or fd); checks that it is a network ns."""
    try:
        fd = os.dup(target) if isinstance(target, int) else os.open(target, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise NetnsMissing(target) from None
    except OSError as e:
        raise CNIError(Code.INVALID_ENV,
                       f"CNI_NETNS {target!r}: cannot open: {e.strerror or e}") from None
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        kind = 0
    if kind != CLONE_NEWNET:
        os.close(fd)
        raise CNIError(Code.INVALID_ENV, f"CNI_NETNS {target!r} is not a network namespace")
    return fd


def setns(fd: int) -> None:
    if libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(target: int | str) -> Iterator[None]:
    """Run the block inside the namespace, then return to the one we came from."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = open_ns(target)
    try:
        setns(fd)
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(fd)
        os.close(home)


def same_as_current(target: int | str) -> bool:
    """Whether `target` is the namespace this thread is in (CNI_NETNS_OVERRIDE guard)."""
    fd = open_ns(target)
    try:
        return os.fstat(fd).st_ino == os.stat("/proc/thread-self/ns/net").st_ino
    finally:
        os.close(fd)


def iproute(target: int | str | None = None) -> IPRoute:
    """An IPRoute whose netlink socket lives in `target` (None: the current namespace)."""
    from pyroute2 import IPRoute

    if target is None:
        return IPRoute()
    with entered(target):
        return IPRoute()
