"""Namespace fds, stdlib only: shared by the shim, the daemon, host/netns.py and doctor.

Importing it costs nothing (os only, not even __future__): ctypes loads on the first
setns/unshare/prctl, fcntl on the first check, so the shim's fast paths never pay for either.
"""

import os

TYPE_CHECKING = False  # typing itself costs the shim ~7 ms
if TYPE_CHECKING:
    import ctypes

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs fd: which kind of namespace it is
_libc: "ctypes.CDLL | None" = None


def libc() -> "ctypes.CDLL":
    """libc by name: ctypes.util.find_library would fork ldconfig."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


def check(rc: int, what: str) -> None:
    """Raise OSError with errno for a libc call that returned non-zero."""
    if rc != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    check(libc().setns(fd, nstype), "setns")


def is_netns(fd: int) -> bool:
    """Whether `fd` is a network namespace (an nsfs fd of that kind)."""
    import fcntl

    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:
        return False
