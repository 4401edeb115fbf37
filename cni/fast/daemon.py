"""`pycni daemon`: a forkserver that has the heavy modules imported once.

The parent imports pyroute2, pydantic, netaddr, nftables and every plugin module, then only
accepts connections and reads requests (non-blocking, each with a deadline, so idle or slow
clients block nobody). A complete request gets a forked child: it ACKs, enters the caller's mount
and network namespaces and working directory, takes the caller's environment and umask, runs
`skel.run(plugin, env, stdin, netns=fd)` and sends the Reply. The parent kills a child that
overruns its timeout and answers for it; a child that crashes gets an error reply; neither
touches the parent or any other request.

Listening: an inherited socket (systemd socket activation: LISTEN_FDS/LISTEN_PID), else a socket
it binds itself (default /run/pycni/pycni.sock; directory 0700, socket 0600). Peers must be root
(SO_PEERCRED). SIGTERM: stop accepting, close requests not yet started (their shims run them
in-process), let running children finish, exit.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import resource
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cni.fast import protocol as proto

log = logging.getLogger("pycni.daemon")

HEAVY_MODULES = ("pyroute2", "pyroute2.iproute", "pydantic", "netaddr", "nftables", "cni.skel")
# Imported inside functions on the request path: imported here, or every child pays for it
# (bandwidth's tc/ifb/peer alone cost ~3 ms a request: module bodies, dataclass builds).
LAZY_MODULES = ("pyroute2.conntrack", "pyroute2.netlink.exceptions",
                "pyroute2.netlink.nfnetlink.nfctsocket", "pyroute2.netlink.rtnl.tcmsg",
                "traceback")
PACKAGES = ("cni.spec", "cni.host", "cni.ipam", "cni.plugins")  # every module in them, too
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
EXIT_NOT_STARTED = 75  # the child could not ACK (the shim is gone): nothing ran
DONE = "pycni-done"  # a child's name once it has its reply (see Server._hangup)
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

Runner = Callable[[str, dict, bytes, "int | None"], object]  # skel.run's shape


@dataclass
class Options:
    socket_path: str = proto.DEFAULT_SOCKET
    timeout: float = 120.0  # per request, from fork to reply
    read_timeout: float = 10.0  # for a request to arrive completely after connect
    max_request: int = proto.MAX_REQUEST
    max_children: int = 64  # running at once; more wait in a queue
    spares: int = 2  # children forked and warmed ahead, so a request pays neither
    max_pending: int = 4096  # connections still sending; the oldest go first beyond this
    verbose: bool = False  # log every request served


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


@dataclass
class Spare:
    """A child forked and warmed ahead of time, waiting on `ctl` for the one request it runs."""

    pid: int
    ctl: socket.socket


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


# --- setting up -----------------------------------------------------------------------------------

def preimport(extra: tuple[str, ...] = ()) -> list[str]:
    """Import what requests need, once; returns what is missing (a plugin not written yet)."""
    from cni.plugins import MODULES

    missing = []
    for name in HEAVY_MODULES + tuple(MODULES.values()) + LAZY_MODULES + _modules_of(PACKAGES) \
            + extra:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(name)
            if e.name != name:
                log.warning("importing %s: %s", name, e)
        except Exception as e:  # a broken module must not stop the daemon: its requests fail
            missing.append(name)
            log.warning("importing %s failed: %s: %s", name, type(e).__name__, e)
    try:
        ctypes.CDLL("libnftables.so.1")  # dlopen once; each child makes its own context
    except OSError:
        pass
    from cni.host import netns

    netns.libc()
    return missing


def _modules_of(packages: tuple[str, ...]) -> tuple[str, ...]:
    import pkgutil

    names = []
    for package in packages:
        module = importlib.import_module(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(module.__path__)]
    return tuple(names)


def inherited_listener() -> socket.socket | None:
    """The socket systemd passed (LISTEN_FDS), if it passed one to this process."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for the children's environment
    if count < 1:
        return None
    sock = socket.socket(fileno=3)  # SD_LISTEN_FDS_START
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SystemExit("pycni daemon: the inherited socket is not a unix stream socket")
    os.set_inheritable(sock.fileno(), False)
    return sock


def bind(path: str) -> socket.socket:
    """Listen on `path`: its directory private (0700), the socket 0600 from the start."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SystemExit(f"pycni daemon: {directory} must belong to uid {os.geteuid()} and not "
                         "be writable by others (use a private directory for the socket)")
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(socket.SOMAXCONN)
    return sock


def _remove_stale(path: str) -> None:
    """A socket file nobody listens on is left from a crash: remove it; a live one is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"pycni daemon: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise SystemExit(f"pycni daemon: another daemon is listening on {path}")
    finally:
        probe.close()


def raise_fd_limit() -> None:
    """Every waiting connection is an fd: allow as many as the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- the server -----------------------------------------------------------------------------------

class Server:
    def __init__(self, listener: socket.socket, opts: Options, runner: Runner | None = None,
                 owned_path: str | None = None) -> None:
        self.listener = listener
        self.opts = opts
        self.runner = runner
        self.owned_path = owned_path  # the socket file to remove at exit (not systemd's)
        self.owned_ino = _inode(owned_path) if owned_path else None
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

    # The loop ----------------------------------------------------------------------------------
    def serve(self) -> None:
        self._install_signals()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._wake)
        log.info("pycni daemon %d listening on %s", os.getpid(), _name(self.listener))
        sd_notify(f"READY=1\nSTATUS=serving on {_name(self.listener)}\nMAINPID={os.getpid()}")
        while not (self.stopping and not self.jobs):
            for key, _ in self.sel.select(self._next_timeout()):
                key.data(key.fileobj)
            self._handle_signals()
            self._reap()
            self._expire()
            self._start_queued()
            self._refill_spares()
        self._close_listener()
        log.info("pycni daemon %d stopped", os.getpid())

    def _next_timeout(self) -> float:
        deadlines = [p.deadline for p in self.pending.values()]
        deadlines += [j.deadline for j in self.jobs.values() if not j.timed_out]
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
            _close_all(ready.fds)
            ready.conn.close()
        for spare in self.spares.values():
            spare.ctl.close()  # EOF: it exits without running anything
        self.spares.clear()

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
        if self.owned_path and _inode(self.owned_path) == self.owned_ino:
            os.unlink(self.owned_path)  # still ours: not replaced by a newer daemon
        self.listener.close()

    # Connections ------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: keep serving what we have
                log.warning("accept: %s", e)
                return
            pid, uid, _gid = _CRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            conn.setblocking(False)
            if len(self.pending) >= self.opts.max_pending:
                self._drop(next(iter(self.pending)))  # the oldest: most likely idle
            p = Pending(conn, time.monotonic() + self.opts.read_timeout, peer=pid)
            if uid != 0:
                log.warning("refused a connection from pid %d uid %d (root only)", pid, uid)
                p.refused = f"the pycni daemon serves root only (peer uid {uid})"
            self.pending[conn.fileno()] = p
            self.sel.register(conn, selectors.EVENT_READ, self._read)

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
        p.fds += _fds_from(anc)
        if not data or flags & socket.MSG_CTRUNC or len(p.fds) > proto.MAX_FDS:
            self._drop(fd)  # gone before sending it all, or too many fds: nothing to run
            return
        p.buf += data
        if not proto.MAGIC.startswith(bytes(p.buf[:len(proto.MAGIC)])):
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

    def _unregister(self, fd: int) -> socket.socket:
        p = self.pending.pop(fd)
        self.sel.unregister(p.conn)
        return p.conn

    def _drop(self, fd: int) -> None:
        _close_all(self.pending[fd].fds)
        self._unregister(fd).close()

    def _refuse(self, conn: socket.socket, why: str, fds: list[int] | None = None) -> None:
        """An answer without ACK: the request was not run."""
        _close_all(fds or [])
        _send_quietly(conn, proto.encode_reply(1, proto.error_reply(
            proto.IO_FAILURE, f"pycni daemon: {why}", b""), b""))
        _drain(conn)  # closing on unread bytes would reset the peer before it reads the answer
        conn.close()

    # Children ---------------------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Start what waits, in order; a request for an attachment that has one running waits
        for it (an ADD the runtime gave up on must be gone before its DEL runs)."""
        for ready in list(self.queue):  # what is not started stays queued (a fork closes it)
            if len(self.jobs) >= self.opts.max_children or self.stopping:
                return
            if _peer_gone(ready.conn):
                self.queue.remove(ready)
                _close_all(ready.fds)
                ready.conn.close()
            elif ready.key is not None and ready.key in self.busy and not self._nested(ready):
                if not ready.held:
                    log.debug("%s waits for the request running on its attachment",
                              ready.label)
                ready.held = True
            else:
                self.queue.remove(ready)
                self._start(ready)

    def _nested(self, ready: Ready) -> bool:
        """Whether the request comes from inside a job running on its attachment (bridge
        exec'ing a wrapper script around our host-local): that job waits for this one, so
        holding this one until that job ends would deadlock. Its caller is alive (connected)
        and the job unreaped, so neither pid can have been reused."""
        assert ready.key is not None
        owners = self.busy[ready.key]
        pid = ready.peer
        for _ in range(64):  # a bounded walk up the parent chain
            if pid in owners:
                log.debug("%s runs nested in its caller's request on the attachment",
                          ready.label)
                return True
            pid = _parent(pid)
            if pid <= 1:
                return False
        return False

    def _start(self, ready: Ready) -> None:
        stdin = proto.decode_request(ready.data)[2]
        while self.spares:
            spare = self.spares.pop(next(iter(self.spares)))
            handed = _hand_over(spare.ctl, ready)
            spare.ctl.close()
            if handed:
                self._started(spare.pid, ready, stdin)
                return
        plugin, env_block, stdin, roles, umask = proto.decode_request(ready.data)
        try:
            pid = os.fork()
        except OSError as e:
            log.error("fork: %s", e)
            _close_all(ready.fds)
            ready.conn.close()  # no ACK: the shim runs it in-process
            return
        if pid == 0:
            self._become_child()
            run_child(ready.conn, plugin, env_block, stdin, roles, umask, ready.fds,
                      self.opts.timeout, self.runner)  # never returns
        _own_group(pid)
        self._started(pid, ready, stdin)

    def _started(self, pid: int, ready: Ready, stdin: bytes) -> None:
        _close_all(ready.fds)
        job = Job(pid, ready.conn, time.monotonic() + self.opts.timeout, ready.label, stdin,
                  ready.key)
        self.jobs[pid] = job
        if job.key is not None:
            self.busy.setdefault(job.key, set()).add(pid)
        # The caller sends nothing more: readable means it hung up (killed by its runtime).
        self.sel.register(job.conn, selectors.EVENT_READ, lambda _c, job=job: self._hangup(job))

    def _hangup(self, job: Job) -> None:
        try:
            if job.conn.recv(4096, socket.MSG_DONTWAIT):
                return  # stray bytes: not a hang-up
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self.sel.unregister(job.conn)
        job.watched = False
        if self.jobs.get(job.pid) is not job or _comm(job.pid) == DONE:
            return  # it had answered: the caller read the reply and closed
        log.info("%s: the caller went away; stopping its request", job.label)
        job.abandoned = True
        self._kill(job)

    def _refill_spares(self) -> None:
        """Keep `spares` children warmed and waiting, within max_children, when not busy."""
        while (not self.stopping and not self.queue and len(self.spares) < self.opts.spares
               and len(self.jobs) + len(self.spares) < self.opts.max_children):
            parent_end, child_end = socket.socketpair()
            try:
                pid = os.fork()
            except OSError as e:
                log.error("fork: %s", e)
                parent_end.close()
                child_end.close()
                return
            if pid == 0:
                parent_end.close()
                self._become_child()
                spare_main(child_end, self.opts.timeout, self.runner)  # never returns
            child_end.close()
            _own_group(pid)
            self.spares[pid] = Spare(pid, parent_end)

    def _become_child(self) -> None:
        """Drop everything of the parent's: other clients must see EOF when the parent dies."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for sock in (self.listener, self.wake_r, self.wake_w):
            sock.close()
        for p in self.pending.values():
            p.conn.close()
            _close_all(p.fds)
        for job in self.jobs.values():
            job.conn.close()
        for other in self.queue:
            other.conn.close()
            _close_all(other.fds)
        for spare in self.spares.values():
            spare.ctl.close()
        self.sel.close()

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is not None:
                self._finish(job, os.waitstatus_to_exitcode(status))
            spare = self.spares.pop(pid, None)
            if spare is not None:  # died before it got work: nothing to answer
                spare.ctl.close()

    def _finish(self, job: Job, code: int) -> None:
        log.debug("served %s (child exit %d)", job.label, code)
        owners = self.busy.get(job.key) if job.key is not None else None
        if owners is not None:
            owners.discard(job.pid)
            if not owners:
                del self.busy[job.key]
        if job.watched:
            self.sel.unregister(job.conn)
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
            _send_quietly(job.conn, proto.encode_reply(1, out, b""))
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


# --- the child ------------------------------------------------------------------------------------

_JOB_HEADER = struct.Struct("!Q")


def _hand_over(ctl: socket.socket, ready: Ready) -> bool:
    """Give a request to a spare: the client connection and the request's fds ride along."""
    fds = [ready.conn.fileno(), *ready.fds]
    data = _JOB_HEADER.pack(len(ready.data)) + ready.data
    try:
        sent = ctl.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack(f"{len(fds)}i", *fds))])
        if sent < len(data):  # (sendall of nothing still sends: EPIPE once the spare has it)
            ctl.sendall(memoryview(data)[sent:])
    except OSError:
        return False  # the spare is gone (a spare only runs a job it got whole)
    return True


def _take_job(ctl: socket.socket) -> tuple[socket.socket, bytes, list[int]] | None:
    data, anc, _, _ = ctl.recvmsg(1 << 16, socket.CMSG_SPACE(4 * (proto.MAX_FDS + 1)))
    fds = _fds_from(anc)
    if not data or not fds:
        _close_all(fds)
        return None  # the daemon retired us (or died)
    size = _JOB_HEADER.unpack_from(data)[0] + _JOB_HEADER.size
    chunks, got = [data], len(data)
    while got < size:
        chunk = ctl.recv(min(size - got, 1 << 20))
        if not chunk:
            _close_all(fds)
            return None
        chunks.append(chunk)
        got += len(chunk)
    conn = socket.socket(fileno=fds[0])
    return conn, b"".join(chunks)[_JOB_HEADER.size:], fds[1:]


def spare_main(ctl: socket.socket, timeout: float, runner: Runner | None) -> None:
    """A spare child: warm up (the copy-on-write and first-use costs), wait, run, exit."""
    try:
        gc.disable()
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        _set_name("pycni-spare")  # tells idle spares from running requests in ps
        warm_up()
        job = _take_job(ctl)
        ctl.close()
        if job is None:
            os._exit(0)
        conn, data, fds = job
        plugin, env_block, stdin, roles, umask = proto.decode_request(data)
        run_child(conn, plugin, env_block, stdin, roles, umask, fds, timeout, runner)
    except BaseException:  # noqa: BLE001
        log.exception("spare child failed")
    finally:
        os._exit(3)


def warm_up() -> None:
    """Touch what every request touches: skel, and a netlink socket (read-only, own netns)."""
    from cni import skel
    from cni.host import netns
    from cni.plugins import MODULES

    for plugin in MODULES:
        skel.run(plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    try:
        with netns.iproute() as ipr:
            index = ipr.link_lookup(ifname="lo")
            ipr.get_links(*index)
            list(ipr.get_addr(index=index[0]))
    except Exception as e:  # warming is an optimisation only
        log.debug("warm-up: %s", e)


def run_child(conn: socket.socket, plugin: str, env_block: bytes, stdin: bytes, roles: int,
              umask: int, fds: list[int], timeout: float, runner: Runner | None) -> None:
    """Run one request and exit; never returns into the parent's loop."""
    code = 3
    try:
        gc.disable()  # short-lived: collection only costs time here
        _set_name(f"pycni-{plugin}")
        try:
            os.setpgid(0, 0)
        except OSError:
            pass  # the parent did it first
        signal.alarm(int(timeout) + 10)  # backstop should the parent be gone
        conn.setblocking(True)
        try:
            conn.sendall(proto.ACK)
        except OSError:
            os._exit(EXIT_NOT_STARTED)
        code = 4
        by_role = dict(zip([r for r in proto.ROLES if roles & r], fds, strict=True))
        env = proto.decode_env(env_block)
        try:
            enter_caller(by_role, env, umask)
        except OSError as e:
            out = proto.error_reply(proto.INTERNAL, f"pycni daemon: cannot take the caller's "
                                    f"namespaces: {e}", stdin)
            conn.sendall(proto.encode_reply(1, out, b""))
            os._exit(0)
        if runner is None:
            from cni import skel
            runner = skel.run
        reply = runner(plugin, env, stdin, by_role.get(proto.ROLE_NETNS))
        _set_name(DONE)  # the parent must not take the caller's close for a hang-up now
        conn.sendall(proto.encode_reply(reply.code, reply.stdout, reply.stderr))
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happened, the parent answers for us
        log.exception("request failed in the child")
    finally:
        os._exit(code)


def enter_caller(by_role: dict[int, int], env: dict[str, str], umask: int) -> None:
    """Become the caller: its mount and network namespaces, cwd, environment and umask."""
    mnt = by_role.get(proto.ROLE_CALLER_MNT)
    if mnt is not None and not _is_current(mnt, "mnt"):
        _setns(mnt, CLONE_NEWNS)
    net = by_role.get(proto.ROLE_CALLER_NET)
    if net is not None and not _is_current(net, "net"):
        _setns(net, CLONE_NEWNET)
    cwd = by_role.get(proto.ROLE_CWD)
    if cwd is not None:
        os.fchdir(cwd)
    os.environ.clear()  # what plugins exec (iptables, an IPAM plugin) inherits, as in-process
    for key, value in env.items():
        try:
            os.environ[key] = value
        except ValueError:
            continue  # a name putenv refuses: skel still sees it in `env`
    os.umask(umask)


def _is_current(fd: int, kind: str) -> bool:
    return os.fstat(fd).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino


_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _set_name(name: str) -> None:
    _libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME: what ps and /proc/PID/comm show


def _setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


# --- helpers --------------------------------------------------------------------------------------

def _fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += struct.unpack(f"{usable // 4}i", data[:usable])
    for fd in fds:
        os.set_inheritable(fd, False)
    return fds


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _parent(pid: int) -> int:
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


def _peer_gone(conn: socket.socket) -> bool:
    """The client hung up (while its request waited): EOF or an error on a peek."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _own_group(pid: int) -> None:
    try:
        os.setpgid(pid, pid)  # its own group: a timeout kills what it spawned too
    except OSError:
        pass  # it did it itself first


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(1.0)  # a small frame into an empty buffer: never really waits
        conn.sendall(data)
    except OSError:
        pass


def _drain(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.setblocking(False)
        for _ in range(64):
            if not conn.recv(1 << 16):
                return
    except OSError:
        pass


def _inode(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def _name(sock: socket.socket) -> str:
    try:
        return str(sock.getsockname())
    except OSError:
        return "?"


# --- entry ----------------------------------------------------------------------------------------

def sd_notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Tell systemd (Type=notify) how we are: READY=1 once the listener is served, so units
    ordered after pycni.service start when requests go through. No NOTIFY_SOCKET: no-op."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address.startswith(("/", "@")):
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), address)
    except OSError as e:
        log.warning("sd_notify: %s", e)
        return False
    return True


def run_daemon(opts: Options, runner: Runner | None = None) -> int:
    """Listen (inherited or bound), import the heavy modules once, serve until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s[%(process)d]: %(levelname)s %(message)s")
    log.setLevel(logging.DEBUG if opts.verbose else logging.INFO)  # ours only, not pyroute2's
    raise_fd_limit()
    listener = inherited_listener()
    owned = None
    if listener is None:
        listener = bind(opts.socket_path)
        owned = opts.socket_path
    missing = preimport()
    if missing:
        log.info("not available (requests for them fail as in-process): %s", ", ".join(missing))
    warm_up()  # first-use caches (pyroute2's among them) filled once, shared by every child
    gc.collect()
    gc.freeze()  # the imported world stays shared with the children, untouched by their GC
    Server(listener, opts, runner, owned_path=owned).serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cni.fast.daemon", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--socket", default=os.environ.get(proto.SOCKET_ENV)
                        or proto.DEFAULT_SOCKET, help="unix socket path (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=Options.timeout,
                        help="seconds a request may run before it is killed")
    parser.add_argument("--max-children", type=int, default=Options.max_children)
    parser.add_argument("--spares", type=int, default=Options.spares,
                        help="children forked and warmed ahead of requests")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    return run_daemon(Options(socket_path=args.socket, timeout=args.timeout,
                              max_children=args.max_children, spares=args.spares,
                              verbose=args.verbose))


if __name__ == "__main__":
    sys.exit(main())
