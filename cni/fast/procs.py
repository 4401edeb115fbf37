"""What the daemon reads of its children from /proc, their process groups, forking one with a
control socket, and what a process of the daemon sets about itself (its name, subreaper)."""

from __future__ import annotations

import logging
import os
import socket
import weakref
from collections.abc import Callable

from cni.host import nsfd, procfs

log = logging.getLogger("pycni.daemon")

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15


# What only the parent's loop may hold (the listener, clients' connections, spares' control
# sockets, the metrics endpoint): each owner registers how to drop its own (parent_only), and
# every child the daemon forks (fork_child) drops them all, so that clients and spares see EOF
# when the parent dies, not wait on a copy. Weak: an owner gone (a test's) is skipped.
_parent_only: list[weakref.WeakMethod] = []


def parent_only(drop: Callable[[], None]) -> None:
    """`drop` (a bound method) runs in every child forked by fork_child, before it returns."""
    _parent_only.append(weakref.WeakMethod(drop))


def fork_child(what: str) -> int | None:
    """os.fork, the child dropping what only the parent holds (parent_only); None (logged) if
    the fork failed. Not for a fork that execs at once (handover.spawn: it keeps the listener)."""
    try:
        pid = os.fork()
    except OSError as e:
        log.error("%s: %s", what, e)
        return None
    if pid == 0:
        for ref in _parent_only:
            drop = ref()
            if drop is not None:
                drop()
    return pid


def fork_with_socket(what: str) -> tuple[int, socket.socket] | None:
    """fork_child with a socketpair between the two: (child's pid, the parent's end) in the
    parent, (0, the child's end) in the child; None (logged) if the fork failed."""
    parent_end, child_end = socket.socketpair()
    pid = fork_child(what)
    if pid is None:
        parent_end.close()
        child_end.close()
        return None
    if pid == 0:
        parent_end.close()
        return 0, child_end
    child_end.close()
    return pid, parent_end


def comm(pid: int) -> str:
    """Process `pid`'s name ("" if it is gone)."""
    try:
        return procfs.read(f"/proc/{pid}/comm").decode(errors="surrogateescape").strip()
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


def set_name(name: str) -> None:
    nsfd.libc().prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)  # what ps and comm show


def become_subreaper() -> bool:
    """Orphans of our descendants come to us (to be reaped, or adopted as spares)."""
    return nsfd.libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def normal_priority(pid: int) -> None:
    """Move process `pid` from SCHED_IDLE back to SCHED_OTHER (needs CAP_SYS_NICE: the daemon
    runs as root); quietly nothing if it may not."""
    try:
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass
