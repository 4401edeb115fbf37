"""Hold running processes at a syscall of our choosing (ptrace), for a kill that must land at a
moment a process reaches by itself however short it is (a warm spare's loopback ADD takes well
under a millisecond, less than the poller of a loaded machine may wait for a CPU). The kernel
stops the traced process at each syscall's entry and exit; between those it runs as ever."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable

PTRACE_SYSCALL, PTRACE_DETACH = 24, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_O_TRACESYSGOOD = 1
WALL = 0x40000000  # __WALL: wait for a tracee whatever it is
SYSCALL_STOP = signal.SIGTRAP | 0x80  # what TRACESYSGOOD makes a syscall stop say

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, pid: int, data: int = 0) -> None:
    if _libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"ptrace({request:#x}, {pid}): {os.strerror(e)}")


def _resume_signal(status: int) -> int:
    """The signal to pass on when resuming from this stop: none for a syscall stop or a ptrace
    event (an INTERRUPT, a group stop), the one it stopped for otherwise."""
    sig = os.WSTOPSIG(status)
    return 0 if sig == SYSCALL_STOP or status >> 16 else sig


class SyscallStops:
    """Processes traced from now on (PTRACE_SEIZE, not our children): `hold_when` runs them
    until one stops at a syscall where a predicate holds, and keeps that one stopped there;
    `release` lets every one go on (or reaps it for its parent, if it was killed)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids: list[int] = []
        self.stopped: set[int] = set()
        for pid in pids:
            try:
                _ptrace(PTRACE_SEIZE, pid, PTRACE_O_TRACESYSGOOD)
                _ptrace(PTRACE_INTERRUPT, pid)
            except OSError as e:
                if e.errno != errno.ESRCH:
                    raise
                continue
            self.pids.append(pid)  # its interrupt stop is collected by _next_stop

    def hold_when(self, proc: subprocess.Popen, holds: Callable[[int], bool],
                  limit: float) -> int | None:
        """Run the traced processes syscall by syscall until, stopped at one, `holds(pid)`:
        -> that pid, kept stopped. None if `proc` ended first (or `limit` seconds passed)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            seen = False
            for pid in list(self.pids):
                status = self._next_stop(pid)
                if status is None:
                    continue
                seen = True
                if holds(pid):
                    return pid
                self._resume(pid, _resume_signal(status))
            if not seen:
                if proc.poll() is not None:
                    return None
                time.sleep(0.0002)
        return None

    def _next_stop(self, pid: int) -> int | None:
        """The status of pid's next stop, if it has stopped (None: running, or it exited)."""
        try:
            got, status = os.waitpid(pid, os.WNOHANG | WALL)
        except ChildProcessError:
            got, status = 0, 0
        if not got:
            return None
        if not os.WIFSTOPPED(status):  # exited (reaped here: its parent hears of it now)
            self.pids.remove(pid)
            return None
        self.stopped.add(pid)
        return status

    def _resume(self, pid: int, sig: int) -> None:
        self.stopped.discard(pid)
        with contextlib.suppress(ProcessLookupError):
            _ptrace(PTRACE_SYSCALL, pid, sig)

    def release(self) -> None:
        """Detach from every traced process: a stopped one goes on, a running one is stopped
        first (a detach needs a stop), a killed one is reaped for its parent."""
        for pid in self.pids:
            if pid not in self.stopped:
                with contextlib.suppress(OSError):
                    _ptrace(PTRACE_INTERRUPT, pid)
            sig = 0
            while True:
                try:
                    _ptrace(PTRACE_DETACH, pid, sig)
                    break
                except OSError as e:
                    if e.errno != errno.ESRCH:
                        raise
                try:  # not in a stop yet (or killed): wait for it
                    _, status = os.waitpid(pid, WALL)
                except ChildProcessError:
                    break
                if not os.WIFSTOPPED(status):
                    break  # exited: reaped
                sig = _resume_signal(status)
        self.pids.clear()
        self.stopped.clear()
