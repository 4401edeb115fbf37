"""Which processes may still run a package copy (cni/install/copies.py), read from /proc.

A process uses a copy if it has a path under it open (/proc/<pid>/fd), mapped (maps) or as its
cwd. That misses the usual user: a plugin exec'd from the executable that named the copy, which
imports lazily and holds no file of it open between imports. Such a process runs
`<python> -IS <bin dir>/<name>` (the kernel's #! form), so one whose argv[1] or argv[2] is a path
in the bin dir and that was forked before the executable last changed (or was removed, by
uninstall) may run any copy an earlier executable named; forked after, it read the current
executable (exec reads the #! line, python then reads the script by path: both after the fork).
Not seen: a plugin exec'd through another mount of the bin dir (a container's bind mount, another
pid namespace); install's wait and the next install's prune are the margin there."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def now_ticks() -> int:
    """The boot clock in the unit of /proc/<pid>/stat's starttime."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICK)


def _start_ticks(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return int(rest[19])  # field 22, starttime; fields 3.. follow the comm's ")"
    except (OSError, IndexError, ValueError):
        return None


def _links(pid: str) -> list[str]:
    out = []
    for name in ("cwd", "root"):
        try:
            out.append(os.readlink(f"/proc/{pid}/{name}"))
        except OSError:
            pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    out.append(os.fsdecode(fields[5].rstrip(b"\n")))
    except OSError:
        pass
    return out


def _runs_from(pid: str, bin_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    for arg in argv[1:3]:
        path = os.path.join(cwd, os.fsdecode(arg))
        if arg and os.path.realpath(os.path.dirname(path)) == bin_dir:
            return True
    return False


def users(copies: list[Path], bin_dir: Path, switched: int) -> dict[str, int]:
    """copy -> a pid that may use it: one that has a path under it open, mapped or as its cwd,
    or (every copy) a plugin exec'd from `bin_dir` forked no later than `switched` (now_ticks()
    once the executable in place names the copy kept, or is gone)."""
    found: dict[str, int] = {}
    real = os.path.realpath(bin_dir)
    prefixes = {str(c): os.path.realpath(c) + "/" for c in copies}
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        start = _start_ticks(pid)
        if start is not None and start <= switched + 1 and _runs_from(pid, real):
            for c in prefixes:
                found.setdefault(c, int(pid))
            continue
        for link in _links(pid):
            for c, prefix in prefixes.items():
                if c not in found and (link + "/").startswith(prefix):
                    found[c] = int(pid)
        if len(found) == len(prefixes):
            break
    return found
