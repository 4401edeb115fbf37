"""Handing the daemon over to a successor: how a daemon without systemd takes up new code after an
upgrade, with no request refused, dropped or run twice.

`pycni install` asks (HANDOVER_MAGIC on the daemon's socket, root only as every request). The
daemon forks and execs its own command line again (sys.executable, sys.orig_argv: once the venv
holds the new version, that is the new code) with its listening socket as fd 3 (LISTEN_FDS, as
systemd passes one) and one end of a socketpair as fd 4 (listener.HANDOVER_ENV). The successor
imports and warms up as any daemon, serves the socket, and says READY=1 on fd 4 (what it would
tell systemd: listener.sd_notify). Meanwhile the old daemon serves as before; a successor that
exits or is not ready within READY_TIMEOUT is killed and the request answered with why, the old
daemon going on. Once the successor is ready, the old daemon answers the request with the
successor's pid and stops as on SIGTERM: it stops accepting (a connection in the backlog is the
successor's: the socket stays open there), runs every request it accepted, waits for them, and
exits, leaving the socket file to the successor.

A daemon on systemd's socket refuses: there `systemctl restart pycni.service` does the same
(the socket unit holds the socket while the service restarts; SIGTERM runs what was accepted).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from cni.fast import protocol as proto
from cni.fast.fds import close_all, send_quietly
from cni.fast.listener import HANDOVER_ENV

log = logging.getLogger("pycni.daemon")

LISTEN_FD = 3  # SD_LISTEN_FDS_START: where inherited_listener looks
READY_FD = 4
READY_TIMEOUT = 120.0  # a successor imports and warms up as any daemon: seconds on a busy node


@dataclass
class Successor:
    pid: int
    ctl: socket.socket  # its READY=1 arrives here; EOF before it: it died
    asker: socket.socket  # the handover request's connection, answered when it is over
    deadline: float
    said: bytes = b""


class Daemon(Protocol):
    """What a handover reads and sets of the daemon's parent (server.Server)."""

    listener: socket.socket  # passed to the successor
    sel: selectors.BaseSelector  # its loop: the successor's READY=1 is heard there
    stopping: bool
    owned_path: str | None  # the socket file to remove at exit: the successor's once it serves

    def stop(self, why: str) -> None: ...


class Handover:
    """The daemon's side, one successor at a time (Server.handover)."""

    def __init__(self, server: Daemon) -> None:
        self.server = server
        self.successor: Successor | None = None
        # A child forked meanwhile (a spare, a request's) must not hold these: the asker waits
        # for EOF, and a successor's death shows as EOF on ctl.
        os.register_at_fork(after_in_child=self._close_in_child)

    def ask(self, conn: socket.socket, refused: str, fds: list[int]) -> None:
        """A handover request arrived complete on conn."""
        close_all(fds)
        why = refused or ("a handover request carries no fds" if fds else "") or self._refusal()
        if why:
            _answer(conn, 1, why)
            return
        try:
            successor = spawn(self.server.listener, conn)
        except OSError as e:
            _answer(conn, 1, f"cannot start a successor: {e}")
            return
        self.successor = successor
        self.server.sel.register(successor.ctl, selectors.EVENT_READ, lambda _c: self._hear())
        log.info("handing over to successor %d: %s", successor.pid, " ".join(_argv()))

    def _refusal(self) -> str:
        if self.server.stopping:
            return "the daemon is stopping"
        if self.successor is not None:
            return f"a handover to {self.successor.pid} is under way"
        if self.server.owned_path is None:
            return ("the daemon serves systemd's socket (socket activation): "
                    "`systemctl restart pycni.service` hands it over there")
        return ""

    def _hear(self) -> None:
        assert self.successor is not None
        try:
            data = self.successor.ctl.recv(4096, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._fail("the successor exited before it was ready (its log is the daemon's)")
            return
        self.successor.said += data
        if b"READY=1" in self.successor.said:
            self._ready()

    def expire(self) -> None:
        """Called from the daemon's loop: a successor that is not ready in time is killed."""
        if self.successor is not None and time.monotonic() >= self.successor.deadline:
            self.cancel(f"the successor {self.successor.pid} was not ready within "
                        f"{READY_TIMEOUT:g}s")

    def cancel(self, why: str) -> None:
        """Kill a successor not ready yet (the daemon stops, or it took too long)."""
        if self.successor is None:
            return
        try:
            os.kill(self.successor.pid, signal.SIGKILL)  # our child: reaped by the loop
        except ProcessLookupError:
            pass
        self._fail(why)

    def _end(self) -> Successor:
        successor, self.successor = self.successor, None
        assert successor is not None
        self.server.sel.unregister(successor.ctl)
        successor.ctl.close()
        return successor

    def _fail(self, why: str) -> None:
        successor = self._end()
        log.error("handover: %s; serving on", why)
        _answer(successor.asker, 1, why)

    def _ready(self) -> None:
        successor = self._end()
        log.info("handed over to successor %d: finishing what was accepted", successor.pid)
        self.server.owned_path = None  # the socket file is the successor's now
        self.server.stop(f"handed over to {successor.pid}")  # no accept after this answer
        _answer(successor.asker, 0, json.dumps({"pid": os.getpid(),
                                                "successor": successor.pid}))

    def _close_in_child(self) -> None:
        if self.successor is not None:
            self.successor.ctl.close()
            self.successor.asker.close()
            self.successor = None


def _argv() -> list[str]:
    """The daemon's own command line, run by the interpreter path it was started with (a venv's
    python: the venv's packages, upgraded since)."""
    return [sys.executable, *sys.orig_argv[1:]]


def spawn(listener: socket.socket, asker: socket.socket) -> Successor:
    """Fork and exec the daemon's command line with the listener as fd 3 and a ready channel as
    fd 4, and no other fd but 0-2; the caller watches the channel."""
    argv = _argv()
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env |= {"LISTEN_FDS": "1", HANDOVER_ENV: str(READY_FD)}
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # nothing but fd moves and exec here: the loop's state is the parent's
        try:
            # Copies clear of fds 3 and 4 (either may be taken: a successor's own listener is
            # fd 3), close-on-exec: only the dup2'd fds 3 and 4 are inheritable.
            listen = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
            ready = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(listen, LISTEN_FD)
            os.dup2(ready, READY_FD)
            # Nothing else goes along, whatever a library left inheritable (libnftables'
            # netlink socket, a stray copy from an older daemon's handover): every fd a
            # successor gets beyond 0-2 stays in its process for life, and each copy of the
            # listener keeps a stopped daemon's queued connections from being reset.
            os.closerange(READY_FD + 1, _fd_limit())
            env["LISTEN_PID"] = str(os.getpid())
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    theirs.close()
    ours.setblocking(False)
    return Successor(pid, ours, asker, time.monotonic() + READY_TIMEOUT)


def _fd_limit() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")  # closerange's end: close_range(2) on Linux, one call
    except (OSError, ValueError):
        return 1 << 20


def _answer(conn: socket.socket, code: int, text: str) -> None:
    out = text.encode() if code == 0 else proto.error_reply(
        proto.IO_FAILURE, f"pycni daemon: no handover: {text}", b"")
    send_quietly(conn, proto.encode_reply(code, out, b""))
    conn.close()
