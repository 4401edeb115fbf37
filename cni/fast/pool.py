"""The spare pool: children forked and warmed ahead of requests (child.spare_main), each serving
request after request. The server asks it for a spare and tells it each turn of its loop what
runs; it never calls the server: the server takes the pids of the spares back from their
request (take_back: that request is over) and asks it whether a request's child has answered
(answered) and until when a request waits for a spare (wait_ends). Its rules:

- `--spares` warm ones at rest, asked of the zygote (zygote.py) at idle priority, or forked
  here while no request runs (refill);
- a request takes the spare back last (serve): it has the request paths in its pages, and the
  others go idle long enough to retire;
- with none warm, a request waits up to `--spare-wait` for a spare that has answered its
  request and is on its way back (waits): it is back sooner than a fork, and requests that
  follow one another (a pod's plugins, pod after pod) never grow the pool beyond `--spares`;
  a spare a request waits for goes home at normal priority (child.back_home runs at
  SCHED_IDLE, for the caller's next plugin: here that one is waiting for it);
- with none warm and none on its way back, a request's own child is forked as one more spare
  (grow), up to `--max-spares`: a burst of pods pays a fork per spare, not per request;
- with `--max-spares` all busy, a request waits up to `--spare-wait` for one to come back
  (waits);
- a request whose caller is inside a running request never waits (that request holds a spare
  until it is answered: waiting could deadlock);
- the spares beyond `--spares` retire once idle for `--spare-linger` seconds (shrink).
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from cni.fast.child import (
    READY_SIZE,
    Runner,
    hand_over,
    has_answered,
    has_answered_by,
    name_fd,
    ready_pid,
    spare_main,
)
from cni.fast.preload import private_netns
from cni.fast.procs import (
    become_subreaper,
    fork_with_socket,
    normal_priority,
    own_group,
    parent_only,
)
from cni.fast.state import Options
from cni.fast.zygote import take_spare_sockets, zygote_main

log = logging.getLogger("pycni.daemon")

# procs.fork_with_socket (the child drops what only the parent holds); tests pass a fake
Fork = Callable[[str], "tuple[int, socket.socket] | None"]
Request = tuple[socket.socket, bytes, list[int]]  # a request's connection, bytes and fds


@dataclass
class Spare:
    """A child forked and warmed ahead of time, waiting on `ctl` for a request; it says when it
    is ready again after one (child.back_home), or exits."""

    ctl: socket.socket
    pid: int = 0  # known once it is ready (the zygote's spares say it then)
    ready: bool = False  # warmed (it said so on ctl): a request handed to it runs at once
    serving: bool = False  # running a request (the server's Job under its pid)
    idle_since: float = 0.0  # when it last said it is ready
    hurried: bool = False  # moved to normal priority on its way home from this request
    name: int | None = None  # its /proc/PID/comm held open (child.name_fd), once pid is known


class SparePool:
    def __init__(self, opts: Options, sel: selectors.BaseSelector, runner: Runner | None, *,
                 fork: Fork = fork_with_socket,
                 clock: Callable[[], float] = time.monotonic,
                 has_answered: Callable[[int], bool] | None = None,
                 hurry: Callable[[int], None] = normal_priority) -> None:
        self.opts = opts
        self.sel = sel  # the server's: ctl and zygote sockets are served by its loop
        self.fork = fork
        self.runner = runner
        self.clock = clock
        # whether child pid sent its reply: child.has_answered, a spare's by its name held open
        # (_has_answered); tests pass a fake
        self.has_answered = has_answered
        self.hurry = hurry  # a spare going home that a request waits for: at normal priority
        self.back: list[int] = []  # spares back from their request since take_back
        self.spares: dict[int, Spare] = {}  # by the fd of their ctl
        self.zygote: socket.socket | None = None  # the spare maker's socket (zygote.py)
        self.ordered = 0  # spares asked of the zygote and not received yet
        self.warm_netns: int | None = None  # where spares warm up (preload.private_netns)
        self.retired = 0  # spares gone: exited (not back, MAX_SERVED), died, or dropped
        self.stopping = False
        self.metrics = None  # metrics.Metrics, counting spares retired
        # the spares going home, read once a turn of the server's loop (None: not yet this
        # turn): each is a /proc read, and a burst queues dozens of requests that each ask
        self._going_home: list[Spare] | None = None
        parent_only(self.close_in_child)

    def start(self) -> None:
        """Before the server serves: the namespace spares warm up in, and the zygote."""
        if self.opts.spares > 0:
            self.warm_netns = private_netns()
            self._start_zygote()

    # What the server asks -----------------------------------------------------------------------
    def serve(self, request: Request) -> int | None:
        """Hand `request` to a warm spare, the one back last first; -> its pid, or None if none
        is warm (a spare found gone on the way is dropped)."""
        conn, data, fds = request
        while True:
            spare = None  # the warm one back last (the first of equals)
            for other in self.spares.values():
                if other.ready and (spare is None or other.idle_since > spare.idle_since):
                    spare = other
            if spare is None:
                return None
            if hand_over(spare.ctl, conn, data, fds):
                spare.ready, spare.serving, spare.hurried = False, True, False
                return spare.pid
            self.drop(spare)

    def may_grow(self) -> bool:
        """Whether a request with no spare warm gets a new spare (--spares 0: no pool)."""
        return (self.opts.spares > 0 and not self.stopping
                and len(self.spares) + self.ordered < self.opts.max_spares)

    def grow(self, request: Request, label: str) -> int | None:
        """Fork a spare that serves `request` at once and then stays (child.spare_main with
        `first`); -> its pid, or None if the pool is full or the fork failed (the server then
        forks a one-request child, or not)."""
        if not self.may_grow():
            return None
        forked = self.fork("spare fork")
        if forked is None:
            return None
        pid, end = forked
        if pid == 0:
            spare_main(end, self.opts.timeout, self.runner, self.warm_netns,
                       first=request)  # never returns
        own_group(pid)
        log.debug("%s: every spare busy, forked spare %d for it", label, pid)
        spare = self._add(end)
        spare.pid, spare.serving = pid, True
        self._name(spare)
        return pid

    def waits(self, received: float, nested: Callable[[], bool]) -> bool:
        """Whether a request complete since `received` waits for a busy spare to come back
        rather than fork: no spare is warm, and one has answered its request (it is only
        going home) or the pool is full; for less than spare_wait. Never a request from inside
        a running job (`nested`, asked last: it walks /proc): that job holds a spare until it
        is answered."""
        spares = self.spares.values()
        if not self.opts.spares or any(s.ready for s in spares) or self.wait_ends(received) is None:
            return False
        if self._going_home is None:
            self._going_home = [s for s in spares if s.serving and self._has_answered(s.pid)]
        going_home = self._going_home
        if not (going_home or not self.may_grow() and any(s.serving for s in spares)):
            return False
        if nested():
            return False
        for spare in going_home:
            if not spare.hurried:  # once: a syscall per waiting request and turn adds up
                self.hurry(spare.pid)
                spare.hurried = True
        return True

    def wait_ends(self, received: float) -> float | None:
        """When a request complete since `received` stops waiting for a spare (waits), on the
        pool's clock; None once that is past (it then waits for its attachment alone, if at all:
        the server's loop must not wake for it)."""
        end = received + self.opts.spare_wait
        return end if end > self.clock() else None

    def answered(self, pid: int) -> bool:
        """Whether the child running as `pid` (a spare or a one-request child) has sent its
        request's reply: by its name (child.has_answered), or, a spare, by its saying it is back
        (read already, or waiting on its control socket)."""
        return pid in self.back or self._has_answered(pid) or self.said_ready(pid)

    def _has_answered(self, pid: int) -> bool:
        if self.has_answered is not None:
            return self.has_answered(pid)
        for spare in self.spares.values():
            if spare.pid == pid and spare.name is not None:
                return has_answered_by(spare.name)  # (a hang-up's check: one pread)
        return has_answered(pid)

    def take_back(self) -> list[int]:
        """The pids of the spares back from their request since the last call: those requests
        are over (the server finishes their jobs)."""
        back, self.back = self.back, []
        return back

    def said_ready(self, pid: int) -> bool:
        """Whether the spare running as `pid` has said it is back (not yet read here)."""
        for spare in self.spares.values():
            if spare.pid == pid and spare.serving:
                try:
                    return spare.ctl.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
                except OSError:
                    return False
        return False

    def gone(self, pid: int) -> None:
        """A child `pid` was reaped: a spare that died is forgotten (a request it was serving
        is the server's to answer)."""
        for spare in [s for s in self.spares.values() if s.pid == pid]:
            self.drop(spare)

    def tend(self, running: int, queued: bool) -> None:
        """A turn of the server's loop, `running` requests in children and `queued` waiting:
        refill to --spares, retire the extra spares idle for --spare-linger."""
        self._going_home = None  # read again next turn
        self._refill(running, queued)
        self._shrink()

    def stop(self) -> None:
        """The daemon stops: idle spares go now (EOF: they exit without running anything),
        serving ones once back; no more are made."""
        self.stopping = True
        for spare in [s for s in self.spares.values() if not s.serving]:
            self.drop(spare)
        self._retire_zygote()

    def warm(self) -> int:
        return sum(s.ready and not s.serving for s in self.spares.values())

    def status(self) -> dict:
        spares = self.spares.values()
        return {"configured": self.opts.spares, "max": self.opts.max_spares,
                "warm": self.warm(), "serving": sum(s.serving for s in spares),
                "retired": self.retired,
                "ordered": self.ordered}  # asked of the zygote, not yet here

    def close_in_child(self) -> None:
        """A forked child drops the pool's sockets (procs.parent_only): spares and the zygote
        must see EOF when the parent dies, not wait on a copy."""
        for spare in self.spares.values():
            spare.ctl.close()
            if spare.name is not None:
                os.close(spare.name)
        self.spares.clear()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    # Size ---------------------------------------------------------------------------------------
    def _refill_wanted(self, running: int, queued: bool) -> bool:
        """Whether to make a spare: asked of the zygote at once (it works at SCHED_IDLE);
        forked here only while no request runs. Spares serving a request count: they come
        back (a pod's next plugin finds the other one)."""
        have = len(self.spares) + self.ordered
        if self.stopping or have >= self.opts.spares:  # (most turns: no count of the idle)
            return False
        idle = have - sum(s.serving for s in self.spares.values())
        return (running + idle < self.opts.max_children
                and (self.zygote is not None or not (queued or running)))

    def _refill(self, running: int, queued: bool) -> None:
        """Keep `spares` children warmed and waiting, within max_children. Forking and warming
        one costs ~5 ms of CPU: the zygote's take only CPU nothing else wants, so they are
        asked for at once; without it the parent forks them only while no request runs, which
        a running request on a small box would wait for. Requests go to warm spares only; with
        none, a request forks a child of its own (no warm-up: less CPU)."""
        while self._refill_wanted(running, queued):
            if self.zygote is not None:
                try:
                    self.zygote.send(b"S")
                    self.ordered += 1
                    continue
                except OSError:
                    self._retire_zygote()
            forked = self.fork("spare fork")
            if forked is None:
                return
            pid, end = forked
            if pid == 0:
                self._spare_main(end)  # never returns
            own_group(pid)
            self._add(end)

    def _shrink(self) -> None:
        """Retire the spares beyond `spares` that have been idle for spare_linger seconds
        (the pool grew for a burst that is over), the longest idle first."""
        extra = len(self.spares) + self.ordered - self.opts.spares
        if extra <= 0:
            return
        since = self.clock() - self.opts.spare_linger
        idle = sorted((s for s in self.spares.values()
                       if s.ready and not s.serving and s.idle_since <= since),
                      key=lambda s: s.idle_since)
        for spare in idle[:extra]:
            log.debug("spare %d retires: idle for %gs", spare.pid, self.opts.spare_linger)
            self.drop(spare)

    def drop(self, spare: Spare) -> None:
        """Forget a spare and close its ctl (it exits on that EOF)."""
        if self.spares.pop(spare.ctl.fileno(), None) is not None:
            self.sel.unregister(spare.ctl)
            self.retired += 1
            if self.metrics:
                self.metrics.retired.inc()
        spare.ctl.close()
        if spare.name is not None:
            os.close(spare.name)
            spare.name = None

    def _name(self, spare: Spare) -> None:
        """Hold the spare's name open (a hang-up asks it whether its request was answered)."""
        if self.has_answered is None and spare.name is None:
            spare.name = name_fd(spare.pid)

    # Spares talking ------------------------------------------------------------------------------
    def _add(self, ctl: socket.socket) -> Spare:
        spare = self.spares[ctl.fileno()] = Spare(ctl)
        self.sel.register(ctl, selectors.EVENT_READ, lambda _c, spare=spare: self._says(spare))
        return spare

    def _says(self, spare: Spare) -> None:
        """A spare says when it is warm, with its pid, and again once it has served a request
        and is back (that request is then over); EOF: it died (reaped as a child)."""
        try:
            said = spare.ctl.recv(READY_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            said = b""
        pid = ready_pid(said)
        if not pid:
            self.drop(spare)
            return
        if spare.serving:
            spare.serving = False
            self.back.append(spare.pid)
        elif not spare.pid:
            log.debug("spare %d is warm", pid)  # requests from now on skip the fork
        spare.pid, spare.ready, spare.idle_since = pid, True, self.clock()
        self._name(spare)
        if self.stopping:
            self.drop(spare)

    # The zygote ---------------------------------------------------------------------------------
    def _spare_main(self, ctl: socket.socket) -> None:
        spare_main(ctl, self.opts.timeout, self.runner, self.warm_netns)

    def _start_zygote(self) -> None:
        """Fork the spare maker (zygote.py), if we can adopt its grandchildren; else the
        parent forks its spares itself."""
        if not become_subreaper():
            return
        forked = self.fork("zygote fork")
        if forked is None:
            return
        pid, end = forked
        if pid == 0:
            zygote_main(end, self._spare_main)
            os._exit(0)
        self.zygote = end
        self.sel.register(end, selectors.EVENT_READ, lambda _c: self._zygote_says())

    def _zygote_says(self) -> None:
        assert self.zygote is not None
        socks = take_spare_sockets(self.zygote)
        if socks is None:
            log.warning("the spare maker is gone; forking spares here")
            self._retire_zygote()
            return
        for ctl in socks:
            self.ordered = max(0, self.ordered - 1)
            if self.stopping:
                ctl.close()
            else:
                self._add(ctl)

    def _retire_zygote(self) -> None:
        if self.zygote is not None:
            self.sel.unregister(self.zygote)
            self.zygote.close()  # EOF: it exits
            self.zygote = None
            self.ordered = 0
