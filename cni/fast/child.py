"""A forked child of the daemon: takes a request (from the parent's fork, or handed to a warm
spare over its control socket), becomes the caller (its namespaces, cwd, environment, umask),
runs skel.run, sends the Reply. A child the parent forked for one request then exits, unless
it was forked as a spare because every spare was busy (spare_main's `first`). A spare
goes back to what it was before the request (back_home) and says it is ready again: a process
that has run a plugin's path before runs it again without the copy-on-write and first-touch
page faults a fresh fork pays (bridge CHECK ~4-5 ms in a fresh child, ~1.4 in a used one). It
goes home whatever the request did (setns to the namespaces it holds fds of: nothing read from
the caller's /proc decides it), and serves again only if it is provably back: its own
namespaces (checked after it is home), the same open fds by identity, one thread, no process
left (a spare is a child subreaper: what a request left is killed and reaped), no module
imported by the request (from the caller's mount namespace), the same signal handlers and mask,
credentials, capabilities, nice value, CPU affinity and resource limits (process_state),
cwd and umask, and the environment as the request was given it (kept until the next request's
replaces it exactly); else, and after MAX_SERVED requests, it exits as a one-request child
does. It never returns into the parent's loop."""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from cni import registry
from cni.fast import attachlock
from cni.fast import protocol as proto
from cni.fast.fds import close_all, fds_from
from cni.fast.preload import keep_home_sockets, set_environ, warm_requests, warm_up
from cni.fast.procs import become_subreaper, comm, set_name
from cni.fast.procstate import describe_change, process_state
from cni.host import netns, nsfd, procfs

log = logging.getLogger("pycni.daemon")

# A child's exit code tells the parent how its request ended (Server._finish):
EXIT_ANSWERED = 0  # it sent the reply; a spare leaving between requests (nothing to answer)
EXIT_CRASHED = 3  # failed before it ran a request, or outside one: the parent answers for it
EXIT_FAILED = 4  # failed after the ACK: the parent answers for it (error 999)
EXIT_NOT_STARTED = 75  # the child could not ACK (the shim is gone): nothing ran
ALARM_MARGIN = 10  # seconds past --timeout a child kills itself, should the parent be gone
DONE = "pycni-done"  # a child's name once it has sent its reply (has_answered)
SPARE = "pycni-spare"  # an idle spare's name
MAX_SERVED = 64  # requests a spare serves before it exits: bounds what a process accumulates
# (a spare's warm-up costs 20-50 ms of CPU, ~0.25-0.8 ms a request at 64; at 256 make bench's
# PSS at rest was 81.3 MB, over the 80 MB line, against 77.7 at 64: a used spare grows)
CARRY_IDLE = 0.1  # seconds a spare keeps its last request's pod socket for the next request
# (netns.carry_sockets): a pod's next plugin comes within a few ms; the socket pins the pod's
# namespace, which must not outlive the pod by more than this
THREADS_WAIT = 10.0  # for a request's helper threads to end (linkgone's waits ~10-30 ms)
Runner = Callable[[str, dict, bytes, "int | None"], object]  # skel.run's shape
_JOB_HEADER = struct.Struct("!Q")
SPARE_READY = b"W"  # a spare to the parent, with its pid: warm (or back), hand me a request
_PID = struct.Struct("!I")
READY_SIZE = len(b"W") + _PID.size
Job = tuple[socket.socket, bytes, list[int]]  # a request's connection, bytes and fds
after_reply: Callable[[object], None] | None = None  # told each reply sent (metrics.py)


def has_answered(pid: int) -> bool:
    """Whether child `pid` has sent its request's reply (by its name: run_request names it DONE
    before the reply; a spare renames itself once the parent has its SPARE_READY)."""
    return comm(pid) == DONE


def name_fd(pid: int) -> int | None:
    """Child `pid`'s /proc/PID/comm held open (has_answered_by reads it), or None. Pinned to
    that process: once it is reaped, reads fail (no pid reuse), as has_answered's open does."""
    try:
        return os.open(f"/proc/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def has_answered_by(fd: int) -> bool:
    """has_answered by a child's name_fd: one pread, not an open, two reads and a close."""
    try:
        return os.pread(fd, 64, 0).decode(errors="surrogateescape").strip() == DONE
    except OSError:
        return False


def ready_pid(message: bytes) -> int | None:
    """The pid in a spare's ready message; None if it is not one."""
    if len(message) != READY_SIZE or not message.startswith(SPARE_READY):
        return None
    return _PID.unpack_from(message, 1)[0]


def hand_over(ctl: socket.socket, conn: socket.socket, request: bytes, fds: list[int]) -> bool:
    """Give a request to a spare (the parent's side of take_job): the client connection and the
    request's fds ride along."""
    fds = [conn.fileno(), *fds]
    data = _JOB_HEADER.pack(len(request)) + request
    try:
        sent = ctl.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack(f"{len(fds)}i", *fds))])
        if sent < len(data):  # (sendall of nothing still sends: EPIPE once the spare has it)
            ctl.sendall(memoryview(data)[sent:])
    except OSError:
        return False  # the spare is gone (a spare only runs a job it got whole)
    return True


def take_job(ctl: socket.socket) -> Job | None:
    data, anc, _, _ = ctl.recvmsg(1 << 16, socket.CMSG_SPACE(4 * (proto.MAX_FDS + 1)),
                                  socket.MSG_CMSG_CLOEXEC)
    fds = fds_from(anc)
    if not data or not fds:
        close_all(fds)
        return None  # the daemon retired us (or died)
    size = _JOB_HEADER.unpack_from(data)[0] + _JOB_HEADER.size
    chunks, got = [data], len(data)
    while got < size:
        chunk = ctl.recv(min(size - got, 1 << 20))
        if not chunk:
            close_all(fds)
            return None
        chunks.append(chunk)
        got += len(chunk)
    # (the listener is AF_UNIX, SOCK_STREAM: listener.py checks; said here, the socket is not
    # asked three syscalls' worth of what it is)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fds[0])
    return conn, b"".join(chunks)[_JOB_HEADER.size:], fds[1:]


def spare_main(ctl: socket.socket, timeout: float, runner: Runner | None,
               warm_netns: int | None = None, first: Job | None = None) -> None:
    """A spare child: warm up (the copy-on-write and first-use costs), say so, wait, run, and
    again while it can (back_home). Forked by the zygote it warms up at SCHED_IDLE, and leaves
    it before waiting: a request must not run at idle priority (if it cannot, it exits
    unused). With `first`, it was forked for that request while every spare was busy (the
    pool grows under load, pool.SparePool.grow): no warm-up, it serves the request at once and joins
    the pool after it, as a used spare."""
    code = EXIT_CRASHED
    try:
        gc.disable()
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        set_name(SPARE)  # tells idle spares from running requests in ps
        # What a request leaves running (a double-forking IPAM plugin) is re-parented to us,
        # so back_home sees it, kills and reaps it.
        become_subreaper()
        if first is None:
            warm_up(netlink=False)
            warm_requests(warm_netns)
        else:
            keep_home_sockets()  # what warm_up keeps: made before Home records the fds
        if warm_netns is not None:
            os.close(warm_netns)  # not for the request's child (a plugin may fork)
        # glibc installs a signal handler of its own (SIGSETXID) at a process's first thread
        # (a request's linkgone helper): here, so that back_home sees no change from it.
        helper = threading.Thread(target=int)
        helper.start()
        helper.join()
        # (still idle: it collects garbage) Not the first request's fds: it closes them.
        home = Home.here(() if first is None else (first[0].fileno(), *first[2]))
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if runner is None:  # once: not on each request's path (importlib's _handle_fromlist)
            runner = plugin_runner()
        ready = SPARE_READY + _PID.pack(os.getpid())
        job = first
        for served in range(1, MAX_SERVED + 1):
            if job is None:
                try:
                    ctl.sendall(ready)
                except OSError:
                    os._exit(EXIT_ANSWERED)  # the daemon retired us, or it stopped
                set_name(SPARE)  # after READY: until the parent has it, our name says DONE
                if netns.carried_fd() is not None and not _readable(ctl, CARRY_IDLE):
                    _drop_carried()
                job = take_job(ctl)
                if job is None:
                    os._exit(EXIT_ANSWERED)
            conn, data, fds = job
            job = None
            code = run_request(conn, *proto.decode_request(data), fds, timeout, runner, home)
            if code != EXIT_ANSWERED or served == MAX_SERVED or not back_home(home):
                break
    except BaseException:  # noqa: BLE001
        log.exception("spare child failed")
    finally:
        os._exit(code)


def _readable(sock: socket.socket, timeout: float) -> bool:
    return bool(select.select([sock], [], [], timeout)[0])


def _drop_carried() -> None:
    """The pod socket closed while idle, and what it left in cycles collected (back_home did not
    freeze while it was carried: frozen, its garbage would stay until the spare exits)."""
    netns.drop_carried()
    gc.collect()
    gc.freeze()


def run_child(conn: socket.socket, plugin: str, env_block: bytes, stdin: bytes, roles: int,
              umask: int, fds: list[int], timeout: float, runner: Runner | None) -> None:
    """Run one request and exit; never returns into the parent's loop."""
    code = EXIT_CRASHED
    try:
        code = run_request(conn, plugin, env_block, stdin, roles, umask, fds, timeout, runner)
    finally:
        os._exit(code)


def run_request(conn: socket.socket, plugin: str, env_block: bytes, stdin: bytes, roles: int,
                umask: int, fds: list[int], timeout: float, runner: Runner | None,
                home: Home | None = None) -> int:
    """ACK, become the caller, run, reply; -> the exit code the parent reads it by:
    EXIT_ANSWERED, EXIT_NOT_STARTED (nothing ran), else it failed and the parent answers.
    `home`: a spare's (it leads its own process group already, and is at home: back_home)."""
    code = EXIT_CRASHED
    try:
        gc.disable()  # collection only costs time here (a spare collects after the reply)
        set_name(f"pycni-{plugin}")
        if home is None:
            try:
                os.setpgid(0, 0)
            except OSError:
                pass  # the parent did it first
        signal.alarm(int(timeout) + ALARM_MARGIN)  # backstop should the parent be gone
        conn.setblocking(True)
        try:
            conn.sendall(proto.ACK)
        except OSError:
            return EXIT_NOT_STARTED
        code = EXIT_FAILED
        by_role = dict(zip([r for r in proto.ROLES if roles & r], fds, strict=True))
        env = proto.decode_env(env_block)
        refused = registry.refusal(plugin)  # the table fixed at start: before becoming the caller
        if refused is not None:
            set_name(DONE)
            conn.sendall(proto.encode_reply(1, proto.error_reply(*refused, stdin), b""))
            return EXIT_ANSWERED
        # A spare's pod socket may serve the next request in the same namespace; not after a
        # DEL (the pod is going away: its namespace must not be pinned)
        netns.carry_sockets(home is not None and env.get("CNI_COMMAND") != "DEL")
        attachlock.vouch(env, lambda: peer_pid(conn))  # (a nested call) in the daemon's /proc
        try:
            enter_caller(by_role, env, umask, home)
        except OSError as e:
            out = proto.error_reply(proto.INTERNAL, f"pycni daemon: cannot take the caller's "
                                    f"namespaces: {e}", stdin)
            set_name(DONE)
            conn.sendall(proto.encode_reply(1, out, b""))
            return EXIT_ANSWERED
        if runner is None:
            runner = plugin_runner()
        # The attachment's lock: given up a little before the parent's kill at `timeout`
        reply = attachlock.run(runner, plugin, env, stdin, netns_fd(by_role),
                               wait=max(timeout - 1.0, timeout / 2))
        set_name(DONE)  # the parent must not take the caller's close for a hang-up now
        conn.sendall(proto.encode_reply(reply.code, reply.stdout, reply.stderr))
        code = EXIT_ANSWERED
        if after_reply is not None:
            after_reply(reply)
    except BaseException:  # noqa: BLE001 - whatever happened, the parent answers for us
        log.exception("request failed in the child")
    finally:
        conn.close()
        close_all(fds)
    return code


def plugin_runner() -> Runner:
    """skel.run, for a process that replies before it is done."""
    from cni import skel
    from cni.host import conntrack

    conntrack.linger_after_reply()  # closed after the reply (see conntrack)
    return skel.run


FdId = tuple[int, int, int]  # what an open fd is: st_dev, st_ino, file type


class Home(NamedTuple):
    """A spare between requests: what back_home returns it to and checks."""

    net: int  # fds of its own network and mount namespaces and cwd (O_PATH)
    mnt: int
    cwd: int
    umask: int
    environ: dict[str, str]
    fds: dict[int, FdId]  # every fd it has open, these three included, by identity
    modules: tuple[str, ...]  # sys.modules' names, in its order
    state: dict[str, object]  # process_state: signals, credentials, capabilities, limits

    @classmethod
    def here(cls, request_fds: tuple[int, ...] = ()) -> Home:
        drop_request_state()  # none between requests (warm-ups make none today)
        gc.collect()  # garbage in cycles (the parent's, or a warm-up's) can hold fds: freed
        # now, not by back_home's collect, where they would look closed by the request
        gc.freeze()  # and what the warm-up keeps is out of back_home's collections, as the
        # parent's imports are (~0.1 ms of CPU a request)
        flags = os.O_RDONLY | os.O_CLOEXEC
        net = os.open("/proc/thread-self/ns/net", flags)
        mnt = os.open("/proc/thread-self/ns/mnt", flags)
        cwd = os.open(".", flags | os.O_PATH | os.O_DIRECTORY)
        umask = os.umask(0o022)
        os.umask(umask)
        fds = {fd: what for fd, what in open_fds().items() if fd not in request_fds}
        return cls(net, mnt, cwd, umask, dict(os.environ), fds, tuple(sys.modules),
                   process_state())


def back_home(home: Home) -> bool:
    """After a request's reply: free what it left for after the reply, go home and be the spare
    of before it again. False if that cannot be shown (the caller then exits). Runs at
    SCHED_IDLE where allowed: the caller's next plugin is starting on the same CPUs."""
    idle = _set_policy(os.SCHED_IDLE)
    if idle:
        # The caller, woken by the reply on this CPU, runs now: a task that turns SCHED_IDLE is
        # not preempted until the next tick (its priority number does not change), and it held
        # the CPU from the caller for ~0.3 ms of a 0.7 ms trip (bench/hop_trip.py, 2 CPUs).
        os.sched_yield()
    signal.alarm(0)
    drop_request_state()
    if not _threads_done():  # (setns into a mount namespace needs this thread alone)
        return _not_back("a thread of the request is still running")
    # Home first, unconditionally: until then /proc is the caller's, whatever it says.
    setns_mnt(home.mnt)  # before cwd: it moves the cwd to its root
    nsfd.setns(home.net, nsfd.CLONE_NEWNET)
    os.fchdir(home.cwd)
    os.umask(home.umask)
    # The environment stays the request's (the next one's replaces it exactly: enter_caller),
    # put back as it was given if the request changed it. Not home's: with the daemon's and the
    # callers' environments apart (a DaemonSet's service variables, a runtime's own), going home
    # and back out cost ~0.3 ms a request of os.environ's key-by-key sets and deletes.
    given = _given_env if _given_env is not None else home.environ
    now_env = dict(os.environ)  # (read at once, not key by key through os.environ.get)
    if now_env != given and set_environ(given, now_env) != given:
        return _not_back("its environment cannot be put back as it was given")
    ended = end_descendants()
    if ended:
        return _not_back(f"the request left {ended} process(es) (killed and reaped)")
    gc.collect()  # what the request left in reference cycles (collection is off in requests)
    if netns.carried_fd() is None:  # (a carried socket stays collectable: _drop_carried)
        gc.freeze()  # and what it left that lives on is out of the next request's collection, as
    # the warm-up's is (Home.here): each collection then walks only its own request's objects,
    # not every survivor since the spare started (portmap CHECK's ~50 -> ~7 us, loopback
    # CHECK's ~85 -> ~37 over 62 requests; a survivor that turns into garbage in a cycle
    # later stays until the spare exits, MAX_SERVED at most: none found in those 62)
    if not (same_ns(home.mnt, "mnt") and same_ns(home.net, "net")):
        return _not_back("not back in its own namespaces")
    # (the names as they were, in the same order: nothing imported, shown by a comparison of
    # the two sequences, mostly by identity (~35 -> ~17 us cold); else whether a name is new)
    if tuple(sys.modules) != home.modules and not frozenset(home.modules).issuperset(
            sys.modules):
        imported = sorted(set(sys.modules) - set(home.modules))
        return _not_back(f"the request imported {', '.join(imported[:5])}")
    state = process_state()
    if state != home.state:
        changed = sorted(k for k in state.keys() | home.state.keys()
                         if state.get(k) != home.state.get(k))
        return _not_back("the request changed what the process holds: " + ", ".join(
            describe_change(k, home.state.get(k), state.get(k)) for k in changed))
    now = open_fds()
    now.pop(netns.carried_fd(), None)  # the pod socket kept for the next request
    if now != home.fds:  # (the fds that differ are only worked out to be named)
        left = {fd for fd in now.keys() | home.fds.keys() if now.get(fd) != home.fds.get(fd)}
        return _not_back(f"its open fds differ from before the request: {_describe(left)}")
    return not idle or _set_policy(os.SCHED_OTHER)


def same_ns(held: int, kind: str) -> bool:
    """Whether this thread is in the namespace `held` is an fd of: by a fresh look at our own
    /proc (back_home asks once it is in its own mount namespace), device and inode."""
    # (stat follows the /proc link to the namespace itself: one syscall, not open, fstat, close)
    return _identity(os.stat(f"/proc/thread-self/ns/{kind}")) == _identity(os.fstat(held))


def _identity(st: os.stat_result) -> FdId:
    return st.st_dev, st.st_ino, st.st_mode & _S_IFMT


_S_IFMT = 0o170000  # the file type bits: stat.S_IFMT(mode) is mode & this


def end_descendants() -> int:
    """Kill and reap every process the request left: our children, and their orphans, which
    come to us (a subreaper) as their parents die. -> how many there were."""
    ended = 0
    for _ in range(1000):  # each round ends a generation: bounded by a fork bomb's patience
        kids = _children()
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        ended += len(kids)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            ended += 1  # one that exited between the listing and here
    except ChildProcessError:
        pass
    return ended


def _children() -> list[int]:
    return [int(pid) for pid in procfs.read("/proc/thread-self/children").split()]


def drop_request_state() -> None:
    """What plugins make lazily in a request and keep for after its reply: nftables contexts,
    conntrack's lingering sockets (each pins a namespace, and holds an fd)."""
    if "cni.host.nft" in sys.modules:
        sys.modules["cni.host.nft"].drop_contexts()
    if "cni.host.conntrack" in sys.modules:
        sys.modules["cni.host.conntrack"].close_lingering()


def _describe(fds: set[int]) -> str:
    def what(fd: int) -> str:
        try:
            return f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}"
        except OSError:
            return f"{fd} (closed since)"
    return ", ".join(what(fd) for fd in sorted(fds))


def _not_back(why: str) -> bool:
    log.warning("a spare exits instead of serving again: %s", why)
    return False


def open_fds() -> dict[int, FdId]:
    """The fds open in this process, each by what it is (the listing's own is closed by the
    time it would be looked at: left out)."""
    out = {}
    fstat = os.fstat
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = fstat(fd)
        except OSError:
            continue
        out[fd] = (st.st_dev, st.st_ino, st.st_mode & _S_IFMT)  # _identity's, inline: a call
        # per fd costs ~0.5 us, and a spare holds ~30 (its kept netlink and nftables sockets)
    return out


def _threads_done() -> bool:
    """Only this thread left: a request's helpers (linkgone's) finish their waits alone."""
    threading = sys.modules.get("threading")
    if threading is None or threading.active_count() == 1:  # (none: no list of them made)
        return True
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join(THREADS_WAIT)
    return threading.active_count() == 1


def setns_mnt(fd: int) -> None:
    """setns into the mount namespace `fd`, retried for up to THREADS_WAIT while the kernel
    refuses it (EINVAL) because a thread that has ended still shares our fs: Thread.join returns
    a moment before the thread has exited, and the kernel releases its fs late in the exit (a
    spare's start-up thread, a DEL's linkgone thread). Nothing is read from /proc, which may be
    the caller's; an fd that is not a mount namespace fails at once."""
    deadline = time.monotonic() + THREADS_WAIT
    while True:
        try:
            nsfd.setns(fd, nsfd.CLONE_NEWNS)
            return
        except OSError as e:
            if (e.errno != errno.EINVAL or time.monotonic() > deadline
                    or fcntl.ioctl(fd, nsfd.NS_GET_NSTYPE) != nsfd.CLONE_NEWNS):
                raise
        time.sleep(0.0002)


_PRIORITY_0 = os.sched_param(0)  # (made once: two a request)


def _set_policy(policy: int) -> bool:
    if os.geteuid() != 0:  # back from SCHED_IDLE needs CAP_SYS_NICE: stay as we are
        return False
    try:
        os.sched_setscheduler(0, policy, _PRIORITY_0)
    except OSError:
        return False
    return True


def enter_caller(by_role: dict[int, int], env: dict[str, str], umask: int,
                 home: Home | None = None) -> None:
    """Become the caller: its mount and network namespaces, cwd, environment and umask. Both
    namespaces are compared while still in our own mount namespace (its /proc is ours; the
    caller's may say anything). A spare at `home` (back_home showed it) compares them with its
    own namespaces' fds and changes the environment from its last request's (or home's) to
    the caller's; a child forked for the request asks its /proc and os.environ."""
    mnt = by_role.get(proto.ROLE_CALLER_MNT)
    net = by_role.get(proto.ROLE_CALLER_NET)
    if home is None:
        enter_mnt = mnt is not None and not same_ns(mnt, "mnt")
        enter_net = net is not None and not same_ns(net, "net")
    else:
        enter_mnt = mnt is not None and _identity(os.fstat(mnt)) != home.fds[home.mnt]
        enter_net = net is not None and _identity(os.fstat(net)) != home.fds[home.net]
    if enter_mnt:
        setns_mnt(mnt)
    if enter_net:
        nsfd.setns(net, nsfd.CLONE_NEWNET)
    cwd = by_role.get(proto.ROLE_CWD)
    if cwd is not None:
        os.fchdir(cwd)
    # what plugins exec (iptables, an IPAM plugin) inherit, as in-process
    global _given_env
    if home is None:
        set_environ(env)
    else:
        _given_env = set_environ(env, _given_env if _given_env is not None else home.environ)
    os.umask(umask)


# A spare's environment as its last request was given it (enter_caller), which it keeps until
# the next (back_home); None: its home environment, before its first request.
_given_env: dict[str, str] | None = None


def peer_pid(conn: socket.socket) -> int:
    """The caller's pid (SO_PEERCRED), as the daemon's pid namespace sees it."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def netns_fd(by_role: dict[int, int]) -> int | None:
    """The shim's open CNI_NETNS if it is a network namespace; else None: the plugin opens the
    path itself and answers exactly as in-process (the shim does not check, to stay cheap)."""
    fd = by_role.get(proto.ROLE_NETNS)
    return fd if fd is not None and nsfd.is_netns(fd) else None
