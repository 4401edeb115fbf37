"""The daemon's parent process: accepts connections, reads requests without blocking (each with
a deadline), queues them, one at a time per attachment, hands each to a forked child, and answers
for a child that times out, crashes or loses its caller. See daemon.py for the whole picture."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass, field

from cni import __version__  # bound at start: the version this daemon runs
from cni.fast import protocol as proto
from cni.fast.child import (
    DONE,
    EXIT_NOT_STARTED,
    READY_SIZE,
    Runner,
    hand_over,
    ready_pid,
    run_child,
    spare_main,
)
from cni.fast.fds import accepted, close_all, drain, fds_from, peer_gone, send_quietly
from cni.fast.listener import inode, sd_notify, sock_name
from cni.fast.preload import private_netns
from cni.fast.procs import comm, fork_with_socket, own_group, parent
from cni.fast.zygote import become_subreaper, take_spare_sockets, zygote_main

log = logging.getLogger("pycni.daemon")

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class Options:
    socket_path: str = proto.DEFAULT_SOCKET
    timeout: float = 120.0  # per request, from fork to reply
    read_timeout: float = 10.0  # for a request to arrive completely after connect
    max_request: int = proto.MAX_REQUEST
    max_children: int = 64  # running at once; more wait in a queue
    spares: int = 2  # children forked and warmed ahead, so a request pays neither; reused
    # Under load (every spare busy) a request's child becomes a spare too, up to max_spares:
    # a burst of pods then pays a fork per spare, not per request. The spares beyond `spares`
    # retire once idle for spare_linger seconds.
    max_spares: int = 8
    spare_linger: float = 10.0
    # With max_spares busy, a request waits this long for one to come back before it forks a
    # child of its own (a spare is back within milliseconds; a fork costs more CPU than that).
    spare_wait: float = 0.5
    max_pending: int = 4096  # connections still sending; the oldest go first beyond this
    verbose: bool = False  # log every request served
    metrics_listen: str = ""  # HOST:PORT serving GET /metrics (metrics.py); "" = off


@dataclass
class Counts:
    """The daemon's own figures since it started: the status query's (status.py), for tests
    to prove the daemon served (the shim may fall back to in-process) and for metrics."""

    started: int = 0  # requests handed to a child: a warm spare, or one forked for it
    answered: int = 0  # started requests that got a reply (from their child, or for it)
    forked: int = 0  # started requests that forked a child of their own (no spare was warm)
    spares_retired: int = 0  # spares gone: exited (not back, MAX_SERVED), died, or dropped


@dataclass
class Pending:
    """A connection whose request is still arriving."""

    conn: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    peer: int = 0  # the client's pid (SO_PEERCRED), to tell a nested call
    refused: str = ""  # answered with this error once its request is in (so it reads it)


@dataclass
class Ready:
    """A complete request, waiting for a child."""

    conn: socket.socket
    data: bytes
    fds: list[int]
    label: str  # "plugin COMMAND containerid", for logs and error messages
    key: tuple[str, str] | None  # (container ID, ifname): one request at a time per attachment
    peer: int = 0  # the client's pid
    held: bool = False  # waiting for a request on the same attachment
    inside_job: bool | None = None  # its caller descends from a running job (_waits_for_spare)
    received: float = field(default_factory=time.monotonic)  # complete (metrics' latency)


@dataclass
class Spare:
    """A child forked and warmed ahead of time, waiting on `ctl` for a request; it says when it
    is ready again after one (child.back_home), or exits."""

    ctl: socket.socket
    pid: int = 0  # known once it is ready (the zygote's spares say it then)
    ready: bool = False  # warmed (it said so on ctl): a request handed to it runs at once
    serving: bool = False  # running a request (its Job is in Server.jobs under its pid)
    idle_since: float = 0.0  # when it last said it is ready


@dataclass
class Job:
    """A request a child is running; the parent keeps the connection to answer if it dies."""

    pid: int
    conn: socket.socket
    deadline: float
    label: str
    stdin: bytes
    key: tuple[str, str] | None = None
    timed_out: bool = False
    abandoned: bool = False  # its caller went away (the runtime killed the plugin)
    watched: bool = True  # its connection is in the selector (for the caller hanging up)
    received: float = 0.0  # when its request was complete (Ready.received)


class Server:
    def __init__(self, listener: socket.socket, opts: Options, runner: Runner | None = None,
                 owned_path: str | None = None) -> None:
        self.listener = listener
        self.opts = opts
        self.runner = runner
        self.owned_path = owned_path  # the socket file to remove at exit (not systemd's)
        self.owned_ino = inode(owned_path) if owned_path else None
        self.sel = selectors.DefaultSelector()
        self.pending: dict[int, Pending] = {}
        self.queue: deque[Ready] = deque()
        self.jobs: dict[int, Job] = {}
        # attachment -> pids of its running jobs: one, plus the nested calls it made itself
        self.busy: dict[tuple[str, str], set[int]] = {}
        self.spares: dict[int, Spare] = {}
        self.stopping = False
        self.signals = 0  # SIGTERM/SIGINT seen; acted on in the loop, never inside the handler
        self.wake_r, self.wake_w = socket.socketpair()
        self.zygote: socket.socket | None = None  # the spare maker's socket (zygote.py)
        self.ordered = 0  # spares asked of the zygote and not received yet
        self.warm_netns: int | None = None  # where spares warm up (preload.private_netns)
        self.counts = Counts()
        self.metrics = None  # metrics.Metrics when --metrics-listen is set

    # The loop ----------------------------------------------------------------------------------
    def serve(self) -> None:
        self._install_signals()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._wake)
        if self.opts.spares > 0:
            self.warm_netns = private_netns()
        if self.opts.metrics_listen:  # before any fork: children inherit its outcome socket
            from cni.fast.metrics import Metrics
            self.metrics = Metrics(self, self.opts.metrics_listen)
        self._start_zygote()
        log.info("pycni daemon %d listening on %s", os.getpid(), sock_name(self.listener))
        sd_notify(f"READY=1\nSTATUS=serving on {sock_name(self.listener)}\nMAINPID={os.getpid()}")
        while not (self.stopping and not self.jobs):
            for key, _ in self.sel.select(self._next_timeout()):
                key.data(key.fileobj)
            self._handle_signals()
            self._reap()
            self._expire()
            if self.metrics:
                self.metrics.expire()
            self._start_queued()
            self._refill_spares()
            self._shrink_spares()
        self._close_listener()
        log.info("pycni daemon %d stopped", os.getpid())

    def _next_timeout(self) -> float:
        deadlines = [p.deadline for p in self.pending.values()]
        deadlines += [j.deadline for j in self.jobs.values() if not j.timed_out]
        # when a request waiting for a spare stops waiting (_waits_for_spare); not those past
        # it, which wait for their attachment alone (held): they would spin the loop
        now = time.monotonic()
        deadlines += [r.received + self.opts.spare_wait for r in self.queue
                      if r.received + self.opts.spare_wait > now]
        if not deadlines:
            return 5.0
        return max(0.0, min(min(deadlines) - time.monotonic(), 5.0))

    def _install_signals(self) -> None:
        for sock in (self.wake_r, self.wake_w):
            sock.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)

    def _on_stop(self, _signum: int, _frame) -> None:
        self.signals += 1

    def _handle_signals(self) -> None:
        if self.signals > 1:  # the second time: do not wait for the children
            for job in self.jobs.values():
                if not job.timed_out:
                    self._kill(job)
        if not self.signals or self.stopping:
            return
        log.info("pycni daemon: stopping, finishing %d running requests", len(self.jobs))
        sd_notify(f"STOPPING=1\nSTATUS=finishing {len(self.jobs)} running requests")
        self.stopping = True
        self._close_listener()
        for fd in list(self.pending):
            self._drop(fd)  # not started: their shims see EOF before ACK and run in-process
        while self.queue:
            ready = self.queue.popleft()
            close_all(ready.fds)
            ready.conn.close()
        for spare in [s for s in self.spares.values() if not s.serving]:
            self._drop_spare(spare)  # EOF: it exits without running anything
        self._retire_zygote()

    def _wake(self, sock: socket.socket) -> None:
        try:
            while sock.recv(512):
                pass
        except BlockingIOError:
            pass

    def _close_listener(self) -> None:
        if self.listener.fileno() < 0:
            return
        self.sel.unregister(self.listener)
        if self.owned_path and inode(self.owned_path) == self.owned_ino:
            os.unlink(self.owned_path)  # still ours: not replaced by a newer daemon
        self.listener.close()

    # Connections ------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        for conn in accepted(listener):
            pid, uid, _gid = _CRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            if len(self.pending) >= self.opts.max_pending:
                self._drop(next(iter(self.pending)))  # the oldest: most likely idle
            p = Pending(conn, time.monotonic() + self.opts.read_timeout, peer=pid)
            if uid != 0:
                log.warning("refused a connection from pid %d uid %d (root only)", pid, uid)
                p.refused = f"the pycni daemon serves root only (peer uid {uid})"
            self.pending[conn.fileno()] = p
            self.sel.register(conn, selectors.EVENT_READ, self._read)
            # The shim sends its request right after connect: it is usually here already, and
            # reading it now saves a trip around the loop (select, reap, expire, ...).
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        p = self.pending[fd]
        try:
            data, anc, flags, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * proto.MAX_FDS))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fd)
            return
        p.fds += fds_from(anc)
        if not data or flags & socket.MSG_CTRUNC or len(p.fds) > proto.MAX_FDS:
            self._drop(fd)  # gone before sending it all, or too many fds: nothing to run
            return
        p.buf += data
        head = bytes(p.buf[:len(proto.MAGIC)])
        if head == proto.STATUS_MAGIC:
            self._answer_status(self._unregister(fd), p.refused or (
                "a status query carries no fds" if p.fds else ""), p.fds)
            return
        if not (proto.MAGIC.startswith(head) or proto.STATUS_MAGIC.startswith(head)):
            self._refuse(self._unregister(fd), "not a pycni request", fds=p.fds)
            return
        if len(p.buf) < proto.REQ_PREFIX:
            return
        size = proto.request_size(bytes(p.buf[:proto.REQ_PREFIX]))
        if size > self.opts.max_request:
            self._refuse(self._unregister(fd), f"request of {size} bytes is larger than the "
                         f"daemon's limit of {self.opts.max_request}", fds=p.fds)
            return
        if len(p.buf) < size:
            return
        data = bytes(p.buf[:size])
        self._unregister(fd)
        if p.refused:
            self._refuse(conn, p.refused, fds=p.fds)
            return
        plugin, env_block, _, roles, _ = proto.decode_request(data)
        if len(p.fds) != bin(roles).count("1"):
            self._refuse(conn, "the request's fds do not match its header", fds=p.fds)
            return
        env = proto.decode_env(env_block)
        cid = env.get("CNI_CONTAINERID", "")
        self.queue.append(Ready(conn, data, p.fds,
                                f"{plugin} {env.get('CNI_COMMAND', '?')} {cid}".rstrip(),
                                (cid, env.get("CNI_IFNAME", "")) if cid else None,
                                peer=p.peer))

    def status(self) -> dict:
        """The figures a status query answers (status.query). The version is the one this
        daemon imported when it started: a newer pycni installed since does not change it."""
        spares = self.spares.values()
        return {"version": __version__, "pid": os.getpid(), "started": self.counts.started,
                "answered": self.counts.answered, "forked": self.counts.forked,
                "running": len(self.jobs), "queued": len(self.queue),
                "stopping": self.stopping,
                "spares": {"configured": self.opts.spares, "max": self.opts.max_spares,
                           "warm": sum(s.ready and not s.serving for s in spares),
                           "serving": sum(s.serving for s in spares),
                           "retired": self.counts.spares_retired,
                           "ordered": self.ordered}}  # asked of the zygote, not yet here

    def _answer_status(self, conn: socket.socket, refused: str, fds: list[int]) -> None:
        """A status query: answered here, no child, no ACK (root only, as every request)."""
        if refused:
            self._refuse(conn, refused, fds=fds)
            return
        send_quietly(conn, proto.encode_reply(0, json.dumps(self.status()).encode(), b""))
        conn.close()

    def _unregister(self, fd: int) -> socket.socket:
        p = self.pending.pop(fd)
        self.sel.unregister(p.conn)
        return p.conn

    def _drop(self, fd: int) -> None:
        close_all(self.pending[fd].fds)
        self._unregister(fd).close()

    def _refuse(self, conn: socket.socket, why: str, fds: list[int] | None = None) -> None:
        """An answer without ACK: the request was not run."""
        close_all(fds or [])
        send_quietly(conn, proto.encode_reply(1, proto.error_reply(
            proto.IO_FAILURE, f"pycni daemon: {why}", b""), b""))
        drain(conn)  # closing on unread bytes would reset the peer before it reads the answer
        conn.close()

    # Children ---------------------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Start what waits, in order; a request for an attachment that has one running waits
        for it (an ADD the runtime gave up on must be gone before its DEL runs)."""
        for ready in list(self.queue):  # what is not started stays queued (a fork closes it)
            if len(self.jobs) >= self.opts.max_children or self.stopping:
                return
            if peer_gone(ready.conn):
                self.queue.remove(ready)
                close_all(ready.fds)
                ready.conn.close()
            elif ready.key is not None and ready.key in self.busy and not self._nested(ready):
                if not ready.held:
                    log.debug("%s waits for the request running on its attachment",
                              ready.label)
                ready.held = True
            elif self._waits_for_spare(ready):
                continue
            else:
                self.queue.remove(ready)
                self._start(ready)

    def _waits_for_spare(self, ready: Ready) -> bool:
        """Whether the request waits for a busy spare to come back rather than fork: every
        spare is busy, the pool is full, and it has waited less than spare_wait. Never a
        request from inside a running job (an IPAM plugin that bridge exec'd): that job holds
        a spare until it is answered."""
        spares = self.spares.values()
        if (not self.opts.spares or self._may_grow() or any(s.ready for s in spares)
                or not any(s.serving for s in spares)
                or time.monotonic() - ready.received >= self.opts.spare_wait):
            return False
        if ready.inside_job is None:
            ready.inside_job = self._descends_from(ready.peer, self.jobs.keys())
        return not ready.inside_job

    @staticmethod
    def _descends_from(pid: int, ancestors) -> bool:
        """Whether `pid` or one of its ancestors is in `ancestors` (pids)."""
        for _ in range(64):  # a bounded walk up the parent chain
            if pid in ancestors:
                return True
            pid = parent(pid)
            if pid <= 1:
                return False
        return False

    def _nested(self, ready: Ready) -> bool:
        """Whether the request comes from inside a job running on its attachment (bridge
        exec'ing a wrapper script around our host-local): that job waits for this one, so
        holding this one until that job ends would deadlock. Its caller is alive (connected)
        and the job unreaped, so neither pid can have been reused."""
        assert ready.key is not None
        if self._descends_from(ready.peer, self.busy[ready.key]):
            log.debug("%s runs nested in its caller's request on the attachment", ready.label)
            return True
        return False

    def _start(self, ready: Ready) -> None:
        stdin = proto.decode_request(ready.data)[2]
        # The spare back last first: it has the request paths in its pages, and the others go
        # idle long enough to retire when the pool has grown beyond --spares (_shrink_spares).
        for spare in sorted((s for s in self.spares.values() if s.ready),
                            key=lambda s: s.idle_since, reverse=True):
            if hand_over(spare.ctl, ready.conn, ready.data, ready.fds):
                spare.ready, spare.serving = False, True
                self.counts.started += 1
                if self.metrics:
                    self.metrics.spare_served.inc()
                self._started(spare.pid, ready, stdin)
                return
            self._drop_spare(spare)
        if self._may_grow() and self._grow(ready, stdin):
            return
        plugin, env_block, stdin, roles, umask = proto.decode_request(ready.data)
        try:
            pid = os.fork()
        except OSError as e:
            log.error("fork: %s", e)
            close_all(ready.fds)
            ready.conn.close()  # no ACK: the shim runs it in-process
            return
        if pid == 0:
            self._become_child()
            run_child(ready.conn, plugin, env_block, stdin, roles, umask, ready.fds,
                      self.opts.timeout, self.runner)  # never returns
        own_group(pid)
        self._started_forked(pid, ready, stdin)

    def _may_grow(self) -> bool:
        """Whether a request with no spare warm gets a new spare (--spares 0: no pool)."""
        return (self.opts.spares > 0 and not self.stopping
                and len(self.spares) + self.ordered < self.opts.max_spares)

    def _grow(self, ready: Ready, stdin: bytes) -> bool:
        """Fork a spare that serves `ready` at once and then stays (child.spare_main with
        `first`); False if the fork failed (the caller forks a one-request child, or not)."""
        forked = self._fork()
        if forked is None:
            return False
        pid, end = forked
        if pid == 0:
            spare_main(end, self.opts.timeout, self.runner, self.warm_netns,
                       first=(ready.conn, ready.data, ready.fds))  # never returns
        own_group(pid)
        log.debug("%s: every spare busy, forked spare %d for it", ready.label, pid)
        spare = self._add_spare(end)
        spare.pid, spare.serving = pid, True
        self._started_forked(pid, ready, stdin)
        return True

    def _started_forked(self, pid: int, ready: Ready, stdin: bytes) -> None:
        """A request started in a child forked for it (a one-request child or a new spare)."""
        self.counts.started += 1
        self.counts.forked += 1
        if self.metrics:
            self.metrics.forks.inc()
        self._started(pid, ready, stdin)

    def _shrink_spares(self) -> None:
        """Retire the spares beyond `spares` that have been idle for spare_linger seconds
        (the pool grew for a burst that is over), the longest idle first."""
        extra = len(self.spares) + self.ordered - self.opts.spares
        if extra <= 0:
            return
        since = time.monotonic() - self.opts.spare_linger
        idle = sorted((s for s in self.spares.values()
                       if s.ready and not s.serving and s.idle_since <= since),
                      key=lambda s: s.idle_since)
        for spare in idle[:extra]:
            log.debug("spare %d retires: idle for %gs", spare.pid, self.opts.spare_linger)
            self._drop_spare(spare)

    def _started(self, pid: int, ready: Ready, stdin: bytes) -> None:
        close_all(ready.fds)
        job = Job(pid, ready.conn, time.monotonic() + self.opts.timeout, ready.label, stdin,
                  ready.key, received=ready.received)
        self.jobs[pid] = job
        if job.key is not None:
            self.busy.setdefault(job.key, set()).add(pid)
        # The caller sends nothing more: readable means it hung up (killed by its runtime).
        self.sel.register(job.conn, selectors.EVENT_READ, lambda _c, job=job: self._hangup(job))

    def _hangup(self, job: Job) -> None:
        if not job.watched:  # finished by an event before this one, in the same round
            return
        try:
            if job.conn.recv(4096, socket.MSG_DONTWAIT):
                return  # stray bytes: not a hang-up
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self.sel.unregister(job.conn)
        job.watched = False
        if self.jobs.get(job.pid) is not job:
            return
        if comm(job.pid) == DONE or self._said_ready(job.pid):
            self._release(job)  # it had answered: the caller read the reply and closed
            return
        log.info("%s: the caller went away; stopping its request", job.label)
        job.abandoned = True
        self._kill(job)

    def _refill_wanted(self, zygote: bool) -> bool:
        """Whether to make a spare: asked of the zygote at once (it works at SCHED_IDLE);
        forked here only while no request runs. Spares serving a request count: they come
        back (a pod's next plugin finds the other one)."""
        have = len(self.spares) + self.ordered
        idle = have - sum(s.serving for s in self.spares.values())
        return (not self.stopping and have < self.opts.spares
                and len(self.jobs) + idle < self.opts.max_children
                and (zygote or not (self.queue or self.jobs)))

    def _refill_spares(self) -> None:
        """Keep `spares` children warmed and waiting, within max_children. Forking and warming
        one costs ~5 ms of CPU: the zygote's (zygote.py) take only CPU nothing else wants, so
        they are asked for at once; without it the parent forks them only while no request
        runs, which a running request on a small box would wait for. Requests go to warm
        spares only; with none, a request forks a child of its own (no warm-up: less CPU)."""
        while self._refill_wanted(bool(self.zygote)):
            if self.zygote is not None:
                try:
                    self.zygote.send(b"S")
                    self.ordered += 1
                    continue
                except OSError:
                    self._retire_zygote()
            forked = self._fork()
            if forked is None:
                return
            pid, end = forked
            if pid == 0:
                self._spare_main(end)  # never returns
            own_group(pid)
            self._add_spare(end)

    def _add_spare(self, ctl: socket.socket) -> Spare:
        spare = self.spares[ctl.fileno()] = Spare(ctl)
        self.sel.register(ctl, selectors.EVENT_READ,
                          lambda _c, spare=spare: self._spare_says(spare))
        return spare

    def _spare_says(self, spare: Spare) -> None:
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
            self._drop_spare(spare)
            return
        if spare.serving:
            spare.serving = False
            job = self.jobs.pop(spare.pid, None)
            if job is not None:
                self._finish(job, 0, "the spare is back")
        elif not spare.pid:
            log.debug("spare %d is warm", pid)  # requests from now on skip the fork
        spare.pid, spare.ready, spare.idle_since = pid, True, time.monotonic()
        if self.stopping:
            self._drop_spare(spare)

    def _said_ready(self, pid: int) -> bool:
        """Whether the spare running as `pid` has said it is back (not yet read here)."""
        for spare in self.spares.values():
            if spare.pid == pid and spare.serving:
                try:
                    return spare.ctl.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
                except OSError:
                    return False
        return False

    def _spare_main(self, ctl: socket.socket) -> None:
        spare_main(ctl, self.opts.timeout, self.runner, self.warm_netns)

    def _start_zygote(self) -> None:
        """Fork the spare maker (zygote.py), if spares are wanted and we can adopt its
        grandchildren; else the parent forks its spares itself."""
        if self.opts.spares <= 0 or not become_subreaper():
            return
        forked = self._fork()
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
                self._add_spare(ctl)

    def _retire_zygote(self) -> None:
        if self.zygote is not None:
            self.sel.unregister(self.zygote)
            self.zygote.close()  # EOF: it exits
            self.zygote = None
            self.ordered = 0

    def _drop_spare(self, spare: Spare, retire: bool = True) -> None:
        """Forget a spare; with retire, close its ctl too (it exits on that EOF)."""
        if self.spares.pop(spare.ctl.fileno(), None) is not None:
            self.sel.unregister(spare.ctl)
            self.counts.spares_retired += 1
            if self.metrics:
                self.metrics.retired.inc()
        if retire:
            spare.ctl.close()

    def _fork(self) -> tuple[int, socket.socket] | None:
        """fork_with_socket, the child leaving the parent's loop behind (_become_child)."""
        forked = fork_with_socket("fork")
        if forked is not None and forked[0] == 0:
            self._become_child()
        return forked

    def _become_child(self) -> None:
        """Drop everything of the parent's: other clients must see EOF when the parent dies."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for sock in (self.listener, self.wake_r, self.wake_w):
            sock.close()
        for p in self.pending.values():
            p.conn.close()
            close_all(p.fds)
        for job in self.jobs.values():
            job.conn.close()
        for other in self.queue:
            other.conn.close()
            close_all(other.fds)
        for spare in self.spares.values():
            spare.ctl.close()
        if self.zygote is not None:
            self.zygote.close()
        if self.metrics:
            self.metrics.close_in_child()
        self.sel.close()

    def _reap(self) -> None:
        """Every child that has exited: a request's (answered here by its exit code), and
        those no job waits for (a spare that died idle, the zygote, an orphan the subreaper
        adopted), which would stay zombies until some request's child exited."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if info.si_pid in self.jobs:  # what its request left in its group goes with it
                with contextlib.suppress(ProcessLookupError):  # (its zombie holds the id)
                    os.killpg(info.si_pid, signal.SIGKILL)
            pid, status = os.waitpid(info.si_pid, 0)
            job = self.jobs.pop(pid, None)
            if job is not None:
                self._finish(job, os.waitstatus_to_exitcode(status))
            for spare in [s for s in self.spares.values() if s.pid == pid]:
                self._drop_spare(spare)  # died before it got work: nothing to answer

    def _release(self, job: Job) -> None:
        """The job's attachment is free for the next request: the job is over (reaped), or it
        has answered and only exits. Exiting closes its sockets, and closing an nftables or
        conntrack socket waits for nf_tables' pending cleanup after a commit (an RCU grace
        period, 10-30 ms): the next plugin of the pod need not wait for that."""
        owners = self.busy.get(job.key) if job.key is not None else None
        if owners is not None:
            owners.discard(job.pid)
            if not owners:
                del self.busy[job.key]

    def _finish(self, job: Job, code: int, how: str = "") -> None:
        log.debug("served %s (%s)", job.label, how or f"child exit {code}")
        self._release(job)
        if code != EXIT_NOT_STARTED and not job.abandoned:
            self.counts.answered += 1
        if self.metrics:
            self.metrics.finished(job, code)
        if job.watched:
            self.sel.unregister(job.conn)
            job.watched = False
        if code not in (0, EXIT_NOT_STARTED) and not job.abandoned:
            if job.timed_out:
                why, err = f"timed out after {self.opts.timeout:g}s", proto.TRY_AGAIN_LATER
            elif code < 0:
                why, err = f"crashed (signal {-code})", proto.INTERNAL
            else:
                why, err = f"failed (exit {code})", proto.INTERNAL
            log.error("%s: %s", job.label, why)
            out = proto.error_reply(err, f"pycni daemon: {job.label} {why}",
                                    job.stdin)
            job.conn.settimeout(1.0)
            send_quietly(job.conn, proto.encode_reply(1, out, b""))
        job.conn.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for fd in [fd for fd, p in self.pending.items() if p.deadline <= now]:
            self._drop(fd)
        for job in self.jobs.values():
            if not job.timed_out and not job.abandoned and job.deadline <= now:
                self._kill(job)

    def _kill(self, job: Job) -> None:
        job.timed_out = not job.abandoned
        for kill, target in ((os.killpg, job.pid), (os.kill, job.pid)):
            try:
                kill(target, signal.SIGKILL)
                return
            except ProcessLookupError:
                continue
