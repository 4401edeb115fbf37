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
