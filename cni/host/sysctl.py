"""sysctls under /proc/sys, read and written in the caller's current network namespace."""

from __future__ import annotations

import os

ROOT = "/proc/sys"


def _path(key: str) -> str:
    rel = key.replace(".", "/") if "/" not in key else key
    path = os.path.normpath(os.path.join(ROOT, rel))
    if not path.startswith(ROOT + "/"):
        raise ValueError(f"sysctl {key!r} is outside {ROOT}")
    return path


def read(key: str) -> str:
    with open(_path(key)) as f:
        return f.read().strip()


def write(key: str, value: str | int) -> None:
    with open(_path(key), "w") as f:
        f.write(str(value))


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
