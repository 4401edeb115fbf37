"""The daemon's parent process: accepts connections, reads requests without blocking (each with
a deadline), queues them, one at a time per attachment, hands each to a spare (pool.py) or a
child forked for it, and answers for a child that times out, crashes or loses its caller. See
docs/DESIGN.md for the request's whole path.

Stopping (SIGTERM: systemd's stop; or handed over, handover.py) drains: no accept, every request
accepted still runs, and the drain is bounded (drain_bound: --timeout + the read timeout, 130 s
by default): a request started during the drain (it waited for its attachment) gets the rest of
it, not a full --timeout. conf/pycni.service's TimeoutStopSec exceeds it, so systemd never kills
a request mid-run, and the shim's ACCEPT_TIMEOUT exceeds stop + start (shim.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import socket
import struct
import time
from collections import deque

from cni import __version__, registry  # __version__ bound at start: the one this daemon runs
from cni.fast import attachlock, peercaps
from cni.fast import protocol as proto
from cni.fast.child import EXIT_ANSWERED, EXIT_NOT_STARTED, Runner, run_child
from cni.fast.fds import accept_one, close_all, drain, fds_from, peer_gone, send_quietly
from cni.fast.handover import Handover
from cni.fast.listener import inode, sd_notify, sock_name
from cni.fast.pool import SparePool
from cni.fast.procs import fork_child, own_group, parent, parent_only
from cni.fast.state import Counts, Job, Options, Pending, Ready

log = logging.getLogger("pycni.daemon")

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
LOOP_TICK = 5.0  # seconds the loop sleeps at most with nothing due (it has nothing periodic)
ANSWER_TIMEOUT = 1.0  # for an error reply sent for a child (its caller reads it, or is gone)
# What the parent reads of a request's environment (its child decodes the whole of it)
_RECV_FLAGS = socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT
_ENV_READ = ("CNI_CONTAINERID", "CNI_COMMAND", "CNI_IFNAME", attachlock.ENV)


def drain_bound(opts: Options) -> float:
    """How long a stopping daemon runs what it accepted, at most: a request still arriving
    (read_timeout) and then running (timeout)."""
    return opts.timeout + opts.read_timeout


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
        self.stopping = False
        self.drain_deadline = math.inf  # set by stop(): every accepted request ends by it
        # no read or job deadline comes before this (_next_timeout; lowered as they are added)
        self.expires = math.inf
        self.signals = 0  # SIGTERM/SIGINT seen; acted on in the loop, never inside the handler
        self.children_exited = True  # a SIGCHLD since the last _reap (at first: not known)
        self.wake_r, self.wake_w = socket.socketpair()
        self.pool = SparePool(opts, self.sel, runner)
        self.counts = Counts()
        self.metrics = None  # metrics.Metrics when --metrics-listen is set
        self.handover = Handover(self)  # to a successor, when pycni install asks (upgrades)
        parent_only(self._close_in_child)

    # The loop ----------------------------------------------------------------------------------
    def serve(self) -> None:
        self._install_signals()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._wake)
        if self.opts.metrics_listen:  # before any fork: children inherit its outcome socket
            from cni.fast.metrics import Metrics
            self.metrics = self.pool.metrics = Metrics(self, self.opts.metrics_listen)
        self.pool.start()
        log.info("pycni daemon %d listening on %s", os.getpid(), sock_name(self.listener))
        sd_notify(f"READY=1\nSTATUS=serving on {sock_name(self.listener)}\nMAINPID={os.getpid()}")
        while not (self.stopping and not (self.jobs or self.pending or self.queue)):
            for key, _ in self.sel.select(self._next_timeout()):
                key.data(key.fileobj)
            # The rest of a turn, each part when its cause is there (a wake is mostly one
            # event: a connection, a caller hanging up, a spare back)
            if self.pool.back:
                for pid in self.pool.take_back():
                    self._spare_back(pid)
            if self.signals:
                self._handle_signals()
            if self.children_exited:
                self._reap()
            self._expire()
            if self.metrics:
                self.metrics.expire()
            if self.queue:
                self._start_queued()
            self.pool.tend(len(self.jobs), bool(self.queue))
        self._close_listener()
        log.info("pycni daemon %d stopped", os.getpid())

    def _next_timeout(self) -> float:
        """Seconds until something is due, LOOP_TICK at most: a read's or a job's deadline (the
        first is kept in self.expires: _expire looks only once it has come), or the end of a
        request's wait for a spare (the pool's rule)."""
        due = math.inf
        for p in self.pending.values():
            if p.deadline < due:
                due = p.deadline
        for job in self.jobs.values():
            if not job.timed_out and job.deadline < due:
                due = job.deadline
        self.expires = due
        for ready in self.queue:
            end = self.pool.wait_ends(ready.received)
            if end and end < due:
                due = end
        if due == math.inf:
            return LOOP_TICK
        return max(0.0, min(due - time.monotonic(), LOOP_TICK))

    def _install_signals(self) -> None:
        for sock in (self.wake_r, self.wake_w):
            sock.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, self._on_child)  # wakes select through the wakeup fd
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)

    def _on_stop(self, _signum: int, _frame) -> None:
        self.signals += 1

    def _on_child(self, _signum: int, _frame) -> None:
        self.children_exited = True

    def _handle_signals(self) -> None:
        if self.signals > 1:  # the second time: do not wait for the children
            for job in self.jobs.values():
                if not job.timed_out:
                    self._kill(job)
            for fd in list(self.pending):
                self._drop(fd)  # not started: their shims see EOF before ACK (not run)
            while self.queue:
                ready = self.queue.popleft()
                close_all(ready.fds)
                ready.conn.close()
        if self.signals:
            self.stop("SIGTERM")

    def stop(self, why: str) -> None:
        """Stop accepting; what was accepted still runs (a shim with the fallback off has no
        other daemon to go to: systemd restarts and handovers lose no request), and the loop
        ends once the last of it is answered. Connections not accepted wait in the socket."""
        if self.stopping:
            return
        accepted = len(self.jobs) + len(self.pending) + len(self.queue)
        log.info("pycni daemon: %s: stopping, finishing %d accepted requests", why, accepted)
        sd_notify(f"STOPPING=1\nSTATUS=finishing {accepted} accepted requests")
        self.stopping = True
        self.drain_deadline = time.monotonic() + drain_bound(self.opts)
        self.handover.cancel("the daemon is stopping")
        self._close_listener()
        self.pool.stop()

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
        """One connection a wake: the selector is level-triggered, so with more waiting the
        next select returns at once; a caller alone (the common case) saves an accept that
        fails (EAGAIN)."""
        conn = accept_one(listener)
        if conn is None:
            return
        pid, uid, _gid = _CRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        if len(self.pending) >= self.opts.max_pending:
            self._drop(next(iter(self.pending)))  # the oldest: most likely idle
        p = Pending(conn, time.monotonic() + self.opts.read_timeout, peer=pid)
        self.expires = min(self.expires, p.deadline)
        p.refused = peercaps.refusal(conn, pid, uid)  # who may have a plugin run: peercaps
        if p.refused:
            log.warning("refused a connection from pid %d uid %d: %s", pid, uid, p.refused)
        fd = conn.fileno()
        self.pending[fd] = p
        # The shim sends its request right after connect: it is usually here already, and
        # reading it now saves a trip around the loop (select, reap, expire, ...); the
        # connection is watched only if it is still arriving.
        self._read(conn)
        if fd in self.pending and not p.buf:
            # Not sent yet: its connect woke us, and we most often took the CPU from the
            # shim between its connect and its send (it asks who listens first). Let it
            # run on and send: the request is then read here, not after a turn of the loop
            # (select, the bookkeeping, register and unregister: ~80 us of CPU a request).
            os.sched_yield()
            self._read(conn)
        if fd in self.pending:
            self.sel.register(conn, selectors.EVENT_READ, self._read)
            p.watched = True

    def _read(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        p = self.pending[fd]
        try:
            data, anc, flags, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * proto.MAX_FDS),
                                               _RECV_FLAGS)  # (a blocking socket: accept_one)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fd)
            return
        p.fds += fds_from(anc)
        if not data or flags & socket.MSG_CTRUNC or len(p.fds) > proto.MAX_FDS:
            self._drop(fd)  # gone before sending it all, or too many fds: nothing to run
            return
        if p.buf:
            p.buf += data
            buf = p.buf
        else:
            buf = data  # the usual: all of it in one read (kept in p.buf only if not all)
        head = bytes(buf[:len(proto.MAGIC)])
        if head == proto.STATUS_MAGIC:
            self._answer_status(self._unregister(fd), p.refused or (
                "a status query carries no fds" if p.fds else ""), p.fds)
            return
        if head == proto.HANDOVER_MAGIC:
            self.handover.ask(self._unregister(fd), p.refused, p.fds)
            return
        if not (proto.MAGIC.startswith(head) or proto.STATUS_MAGIC.startswith(head)):
            self._refuse(self._unregister(fd), "not a pycni request", fds=p.fds)
            return
        if len(buf) < proto.REQ_PREFIX:
            if buf is data:
                p.buf += data
            return
        size = proto.request_size(bytes(buf[:proto.REQ_PREFIX]))
        if size > self.opts.max_request:
            self._refuse(self._unregister(fd), f"request of {size} bytes is larger than the "
                         f"daemon's limit of {self.opts.max_request}", fds=p.fds)
            return
        if len(buf) < size:
            if buf is data:
                p.buf += data
            return
        data = bytes(buf[:size])
        self._unregister(fd)
        parts = proto.decode_request(data)
        if p.refused:  # final: the caller could not run it itself (no fallback, no retry)
            self._refuse(conn, p.refused, p.fds, proto.error_reply(
                proto.INTERNAL, f"pycni daemon: {p.refused}", parts[2]))
            return
        plugin, env_block, _, roles, _ = parts
        if len(p.fds) != bin(roles).count("1"):
            self._refuse(conn, "the request's fds do not match its header", fds=p.fds)
            return
        env = proto.env_values(env_block, _ENV_READ)
        cid = env.get("CNI_CONTAINERID", "")
        self.queue.append(Ready(conn, data, p.fds,
                                f"{plugin} {env.get('CNI_COMMAND', '?')} {cid}".rstrip(),
                                (cid, env.get("CNI_IFNAME", "")) if cid else None, parts,
                                peer=p.peer, holder=attachlock.holder(env.get(attachlock.ENV, ""))))

    def status(self) -> dict:
        """The figures a status query answers (status.query). The version is the one this
        daemon imported when it started: a newer pycni installed since does not change it.
        "answered" counts the requests whose reply was sent, also those whose spare is still on
        its way home (at idle priority: its job ends when it is back), so a caller that has its
        reply never sees a count without it."""
        by_plugin = dict(self.counts.by_plugin)
        replied = [job for job in self.jobs.values()
                   if not job.abandoned and self.pool.answered(job.pid)]
        for job in replied:
            name = self._plugin_name(job)
            by_plugin[name] = by_plugin.get(name, 0) + 1
        return {"version": __version__, "pid": os.getpid(), "started": self.counts.started,
                "answered": self.counts.answered + len(replied), "forked": self.counts.forked,
                "running": len(self.jobs), "queued": len(self.queue),
                "stopping": self.stopping, "spares": self.pool.status(),
                "by_plugin": by_plugin,
                "plugins": {"served": list(registry.names()),
                            "refused": dict(registry.REFUSED)}}

    def warm_spares(self) -> int:
        """Spares warm and waiting (metrics' gauge)."""
        return self.pool.warm()

    def _answer_status(self, conn: socket.socket, refused: str, fds: list[int]) -> None:
        """A status query: answered here, no child, no ACK (root only, as every request)."""
        if refused:
            self._refuse(conn, refused, fds=fds)
            return
        send_quietly(conn, proto.encode_reply(0, json.dumps(self.status()).encode(), b""))
        conn.close()

    def _unregister(self, fd: int) -> socket.socket:
        p = self.pending.pop(fd)
        if p.watched:
            self.sel.unregister(p.conn)
        return p.conn

    def _drop(self, fd: int) -> None:
        close_all(self.pending[fd].fds)
        self._unregister(fd).close()

    def _refuse(self, conn: socket.socket, why: str, fds: list[int] | None = None,
                final: bytes = b"") -> None:
        """An answer without ACK: the request was not run. `final`: the caller's answer
        (protocol.DENIED), not a refusal the shim may run in-process or retry."""
        close_all(fds or [])
        send_quietly(conn, proto.DENIED + proto.encode_reply(1, final, b"") if final else
                     proto.encode_reply(1, proto.error_reply(
                         proto.IO_FAILURE, f"pycni daemon: {why}", b""), b""))
        drain(conn)  # closing on unread bytes would reset the peer before it reads the answer
        conn.close()

    # Children ---------------------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Start what waits, in order; a request for an attachment that has one running waits
        for it (an ADD the runtime gave up on must be gone before its DEL runs)."""
        for ready in list(self.queue):  # what is not started stays queued (a fork closes it)
            if len(self.jobs) >= self.opts.max_children:
                return
            fresh, ready.fresh = ready.fresh, False
            if not fresh and peer_gone(ready.conn):
                self.queue.remove(ready)
                close_all(ready.fds)
                ready.conn.close()
            elif ready.key is not None and ready.key in self.busy and not self._nested(ready):
                if not ready.held:
                    log.debug("%s waits for the request running on its attachment",
                              ready.label)
                ready.held = True
            elif self.pool.waits(ready.received, lambda ready=ready: self._inside_job(ready)):
                continue
            else:
                self.queue.remove(ready)
                self._start(ready)

    def _inside_job(self, ready: Ready) -> bool:
        """Whether the request's caller descends from a running job (an IPAM plugin that bridge
        exec'd): asked once per request, its caller being alive (connected)."""
        if ready.inside_job is None:
            ready.inside_job = self._descends_from(ready.peer, self.jobs.keys())
        return ready.inside_job

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
        and the job unreaped, so neither pid can have been reused. Also from inside a request
        another daemon runs (a handover's old one): the holder its attachment lock names."""
        assert ready.key is not None
        if self._descends_from(ready.peer, self.busy[ready.key] | {ready.holder}):
            log.debug("%s runs nested in its caller's request on the attachment", ready.label)
            return True
        return False

    def _start(self, ready: Ready) -> None:
        """To a warm spare; else to a new spare (the pool grows); else to a child of its own."""
        plugin, env_block, stdin, roles, umask = ready.parts
        request = (ready.conn, ready.data, ready.fds)
        pid = self.pool.serve(request)
        if pid is not None:
            self.counts.started += 1
            if self.metrics:
                self.metrics.spare_served.inc()
            self._started(pid, ready, stdin)
            return
        pid = self.pool.grow(request, ready.label)
        if pid is not None:
            self._started_forked(pid, ready, stdin)
            return
        pid = fork_child("fork")
        if pid is None:
            close_all(ready.fds)
            ready.conn.close()  # no ACK: the shim runs it in-process
            return
        if pid == 0:
            run_child(ready.conn, plugin, env_block, stdin, roles, umask, ready.fds,
                      self.opts.timeout, self.runner)  # never returns
        own_group(pid)
        self._started_forked(pid, ready, stdin)

    def _started_forked(self, pid: int, ready: Ready, stdin: bytes) -> None:
        """A request started in a child forked for it (a one-request child or a new spare)."""
        self.counts.started += 1
        self.counts.forked += 1
        if self.metrics:
            self.metrics.forks.inc()
        self._started(pid, ready, stdin)

    def _started(self, pid: int, ready: Ready, stdin: bytes) -> None:
        close_all(ready.fds)
        deadline = min(time.monotonic() + self.opts.timeout, self.drain_deadline)
        job = Job(pid, ready.conn, deadline, ready.label, stdin, ready.key,
                  received=ready.received)
        self.jobs[pid] = job
        self.expires = min(self.expires, deadline)
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
        if self.pool.answered(job.pid):
            self._release(job)  # it had answered: the caller read the reply and closed
            return
        log.info("%s: the caller went away; stopping its request", job.label)
        job.abandoned = True
        self._kill(job)

    def _spare_back(self, pid: int) -> None:
        """The spare serving the job of `pid` is back: that request is over."""
        job = self.jobs.pop(pid, None)
        if job is not None:
            self._finish(job, EXIT_ANSWERED, "the spare is back")

    def _close_in_child(self) -> None:
        """In every child forked (procs.parent_only): drop everything of the parent's loop, so
        that other clients see EOF when the parent dies. The pool and the metrics drop theirs."""
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
        self.pending.clear()  # (raw fds: never closed twice, in a grandchild, by number)
        self.jobs.clear()
        self.queue.clear()
        self.sel.close()

    def _reap(self) -> None:
        """Every child that has exited: a request's (answered here by its exit code), and
        those no job waits for (a spare that died idle, the zygote, an orphan the subreaper
        adopted), which would stay zombies until some request's child exited. Only after a
        SIGCHLD (a waitid a turn saved): one that comes after the flag is cleared sets it again,
        and its wakeup fd makes the next select return at once."""
        if not self.children_exited:
            return
        self.children_exited = False
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
            self.pool.gone(pid)  # a spare that died before it got work: nothing to answer

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

    @staticmethod
    def _plugin_name(job: Job) -> str:
        """The plugin a job runs, as status counts it ("other": a name the registry lacks)."""
        name = job.label.partition(" ")[0]
        # (a built-in's name is one of names(): no tuple of them built a request)
        return name if name in registry.PLUGINS or name in registry.names() else "other"

    def _finish(self, job: Job, code: int, how: str = "") -> None:
        log.debug("served %s (%s)", job.label, how or f"child exit {code}")
        self._release(job)
        if code != EXIT_NOT_STARTED and not job.abandoned:
            self.counts.answered += 1
            name = self._plugin_name(job)
            self.counts.by_plugin[name] = self.counts.by_plugin.get(name, 0) + 1
        if self.metrics:
            self.metrics.finished(job, code)
        if job.watched:
            self.sel.unregister(job.conn)
            job.watched = False
        if code not in (EXIT_ANSWERED, EXIT_NOT_STARTED) and not job.abandoned:
            if job.timed_out and job.deadline >= self.drain_deadline:
                why, err = "stopped: the daemon's drain ended (it stops)", proto.TRY_AGAIN_LATER
            elif job.timed_out:
                why, err = f"timed out after {self.opts.timeout:g}s", proto.TRY_AGAIN_LATER
            elif code < 0:
                why, err = f"crashed (signal {-code})", proto.INTERNAL
            else:
                why, err = f"failed (exit {code})", proto.INTERNAL
            log.error("%s: %s", job.label, why)
            out = proto.error_reply(err, f"pycni daemon: {job.label} {why}",
                                    job.stdin)
            job.conn.settimeout(ANSWER_TIMEOUT)
            send_quietly(job.conn, proto.encode_reply(1, out, b""))
        job.conn.close()

    def _expire(self) -> None:
        now = time.monotonic()
        if now >= self.expires:  # (else none is due: no walk over what is pending or runs)
            for fd in [fd for fd, p in self.pending.items() if p.deadline <= now]:
                self._drop(fd)
            for job in self.jobs.values():
                if not job.timed_out and not job.abandoned and job.deadline <= now:
                    self._kill(job)
        self.handover.expire()

    def _kill(self, job: Job) -> None:
        job.timed_out = not job.abandoned
        for kill, target in ((os.killpg, job.pid), (os.kill, job.pid)):
            try:
                kill(target, signal.SIGKILL)
                return
            except ProcessLookupError:
                continue
