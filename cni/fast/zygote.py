"""The spare maker: a child forked once, before the daemon serves, that forks the spares.

Why not the parent: a fork write-protects every page of the forking process, and the parent
then pays a copy-on-write fault for each page it writes again: ~300 faults, ~0.3-0.5 ms of
CPU on the next request's path (accept to hand-over), after every refill. Forked from this
child instead, the parent's pages stay its own after their first copy, and the fork's own cost
(the page tables of ~40 MB) leaves the parent too.

A spare must still be the parent's child (it reaps it for the exit code, answers for it, kills
it): the maker forks an intermediate that forks the spare and exits at once, and the parent is
a child subreaper (PR_SET_CHILD_SUBREAPER), so the orphaned spare becomes its child. The maker
runs at SCHED_IDLE: it only works when the CPUs are not wanted by anything else, e.g. the next
plugin's interpreter start-up; the parent hands requests only to spares that said they are warm.

Protocol on the maker's socket: the parent writes one byte per spare it wants; the maker sends
back, per spare, the parent's end of the spare's control socket (SCM_RIGHTS, one byte of data).
The spare itself says when it is warm (child.SPARE_READY and its pid) on that control socket.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Callable

from cni.fast.fds import fds_from
from cni.fast.procs import fork_with_socket, set_name

log = logging.getLogger("pycni.daemon")

NAME = "pycni-zygote"

SpareMain = Callable[[socket.socket], None]  # runs a spare on its control socket; never returns


def zygote_main(ctl: socket.socket, spare_main: SpareMain) -> None:
    """The maker's loop: a spare per byte asked; exits on EOF (the parent stopped or died)."""
    set_name(NAME)
    if os.geteuid() == 0:  # its spares must be allowed back to SCHED_OTHER (CAP_SYS_NICE)
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass  # only slower to refill
    while True:
        try:
            asked = ctl.recv(64)
        except InterruptedError:
            continue
        if not asked:
            os._exit(0)
        for _ in asked:
            fd = _make_spare(ctl, spare_main)
            if fd is None:
                continue
            try:
                ctl.sendmsg([b"S"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      struct.pack("i", fd))])
            except OSError:
                os._exit(0)  # the parent is gone
            finally:
                os.close(fd)


def _make_spare(ctl: socket.socket, spare_main: SpareMain) -> int | None:
    """Fork the intermediate, which forks the spare and exits; -> the parent's end of the
    spare's control socket."""
    forked = fork_with_socket("zygote fork")
    if forked is None:
        return None
    pid, end = forked
    if pid == 0:
        try:
            ctl.close()
            if os.fork() == 0:
                spare_main(end)  # never returns
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return end.detach()


def take_spare_sockets(ctl: socket.socket) -> list[socket.socket] | None:
    """The parent's side: control sockets of new spares; None when the maker is gone."""
    try:
        data, anc, _, _ = ctl.recvmsg(64, socket.CMSG_SPACE(4 * 64),
                                      socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
    except (BlockingIOError, InterruptedError):
        return []
    except OSError:
        return None
    fds = fds_from(anc)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return [socket.socket(fileno=fd) for fd in fds]
