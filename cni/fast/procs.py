"""What the daemon reads of its children from /proc, and their process groups."""

from __future__ import annotations

import os


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def parent(pid: int) -> int:
    """The parent pid of `pid`; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return 0
    try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        return int(stat_line[stat_line.rindex(b")") + 2:].split(None, 2)[1])
    except (ValueError, IndexError):
        return 0


def own_group(pid: int) -> None:
    try:
        os.setpgid(pid, pid)  # its own group: a timeout kills what it spawned too
    except OSError:
        pass  # it did it itself first
