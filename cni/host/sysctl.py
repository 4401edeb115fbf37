"""sysctls under /proc/sys/net, read and written in the caller's current network namespace.

Only net.* keys (read and write): outside net/ a key is the host's whatever namespace the
caller is in (kernel.*, vm.*, fs.*: a plugin writing one "in the pod" would change the node).
Under net/ the kernel itself keeps to the namespace: a network namespace other than the host's
shows only its own per-namespace keys (net.core.rmem_max, net.ipv4.tcp_mem and the other
global ones are absent there, nf_conntrack_max read-only), and in the host's namespace a net.*
key is the host's by definition. docs/PLUGINS.md states the rule for plugin authors."""

from __future__ import annotations

import locale
import os

from cni.host import procfs
from cni.host.errors import HostError

ROOT = "/proc/sys"
NET = ROOT + "/net/"


class KeyRefused(HostError, ValueError):
    """A sysctl key outside net.* (skel answers it as 999 with its message)."""


def _path(key: str) -> str:
    rel = key.replace(".", "/") if "/" not in key else key
    path = os.path.normpath(os.path.join(ROOT, rel))
    if not path.startswith(NET):
        raise KeyRefused(f"sysctl {key!r}: only net.* keys, which the kernel keeps per network "
                         "namespace, may be read or written")
    return path


# read and write do what open(path) / open(path, "w") and the text file's read / write did (the
# same flags, mode, encoding, newlines and errors), on the fd itself: no io objects, no isatty
# ioctl, no lseeks (a bridge ADD reads one sysctl and writes five).
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def read(key: str) -> str:
    path = _path(key)
    try:
        data = procfs.read(path)
    except IsADirectoryError as e:  # open() refuses a directory so, naming it
        raise IsADirectoryError(e.errno, e.strerror, path) from None
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()  # universal newlines


def write(key: str, value: str | int) -> None:
    fd = os.open(_path(key), _WRITE_FLAGS, 0o666)
    try:
        view = memoryview(str(value).encode(locale.getpreferredencoding(False)))
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def conf(family: int, ifname: str, name: str) -> str:
    """The per-interface key: conf(4, "eth0", "arp_notify") -> net/ipv4/conf/eth0/arp_notify.

    Interface names can contain dots, so keys are built as paths, never dotted names.
    """
    return f"net/ipv{family}/conf/{ifname}/{name}"


def read_file(path: str) -> str:
    """A sysctl file's content as the kernel gives it (trailing newline and all), read in the
    calling thread's network namespace (/proc/sys/net is the namespace of the reader)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    with open(fd, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def write_file(path: str, value: str) -> None:
    """Write one sysctl file; never creates a file (procfs has none to create, a typo must not
    make one elsewhere). OSError carries the kernel's refusal (EINVAL for a bad value)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        data = value.encode("utf-8", "surrogateescape")
        if os.write(fd, data) != len(data):
            raise OSError(f"{path}: short write")
    finally:
        os.close(fd)
