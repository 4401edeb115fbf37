"""A forked child of the daemon: takes one request (from the parent's fork, or handed to a warm
spare over its control socket), becomes the caller (its namespaces, cwd, environment, umask),
runs skel.run, sends the Reply, exits. It never returns into the parent's loop."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import struct
from collections.abc import Callable

from cni.fast import protocol as proto
from cni.fast.fds import close_all, fds_from
from cni.fast.preload import set_environ, warm_requests, warm_up
from cni.host import nsfd

log = logging.getLogger("pycni.daemon")

EXIT_NOT_STARTED = 75  # the child could not ACK (the shim is gone): nothing ran
DONE = "pycni-done"  # a child's name once it has its reply (see Server._hangup)
Runner = Callable[[str, dict, bytes, "int | None"], object]  # skel.run's shape
_JOB_HEADER = struct.Struct("!Q")
SPARE_READY = b"W"  # a spare's one message to the parent, with its pid: warm, hand me a request
_PID = struct.Struct("!I")
READY_SIZE = len(b"W") + _PID.size


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


def take_job(ctl: socket.socket) -> tuple[socket.socket, bytes, list[int]] | None:
    data, anc, _, _ = ctl.recvmsg(1 << 16, socket.CMSG_SPACE(4 * (proto.MAX_FDS + 1)))
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
    conn = socket.socket(fileno=fds[0])
    return conn, b"".join(chunks)[_JOB_HEADER.size:], fds[1:]


def spare_main(ctl: socket.socket, timeout: float, runner: Runner | None,
               warm_netns: int | None = None) -> None:
    """A spare child: warm up (the copy-on-write and first-use costs), say so, wait, run,
    exit. Forked by the zygote it warms up at SCHED_IDLE, and leaves it before waiting: the
    request must not run at idle priority (if it cannot, it exits unused)."""
    try:
        gc.disable()
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        set_name("pycni-spare")  # tells idle spares from running requests in ps
        warm_up(netlink=False)
        warm_requests(warm_netns)
        if warm_netns is not None:
            os.close(warm_netns)  # not for the request's child (a plugin may fork)
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        ctl.sendall(SPARE_READY + _PID.pack(os.getpid()))
        job = take_job(ctl)
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


def run_child(conn: socket.socket, plugin: str, env_block: bytes, stdin: bytes, roles: int,
              umask: int, fds: list[int], timeout: float, runner: Runner | None) -> None:
    """Run one request and exit; never returns into the parent's loop."""
    code = 3
    try:
        gc.disable()  # short-lived: collection only costs time here
        set_name(f"pycni-{plugin}")
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
            from cni.host import conntrack

            conntrack.linger_until_exit()  # we exit right after the reply (see conntrack)
            runner = skel.run
        reply = runner(plugin, env, stdin, netns_fd(by_role))
        set_name(DONE)  # the parent must not take the caller's close for a hang-up now
        conn.sendall(proto.encode_reply(reply.code, reply.stdout, reply.stderr))
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happened, the parent answers for us
        log.exception("request failed in the child")
    finally:
        os._exit(code)


def enter_caller(by_role: dict[int, int], env: dict[str, str], umask: int) -> None:
    """Become the caller: its mount and network namespaces, cwd, environment and umask."""
    mnt = by_role.get(proto.ROLE_CALLER_MNT)
    if mnt is not None and not is_current(mnt, "mnt"):
        nsfd.setns(mnt, nsfd.CLONE_NEWNS)
    net = by_role.get(proto.ROLE_CALLER_NET)
    if net is not None and not is_current(net, "net"):
        nsfd.setns(net, nsfd.CLONE_NEWNET)
    cwd = by_role.get(proto.ROLE_CWD)
    if cwd is not None:
        os.fchdir(cwd)
    set_environ(env)  # what plugins exec (iptables, an IPAM plugin) inherit, as in-process
    os.umask(umask)


def netns_fd(by_role: dict[int, int]) -> int | None:
    """The shim's open CNI_NETNS if it is a network namespace; else None: the plugin opens the
    path itself and answers exactly as in-process (the shim does not check, to stay cheap)."""
    fd = by_role.get(proto.ROLE_NETNS)
    return fd if fd is not None and nsfd.is_netns(fd) else None


def is_current(fd: int, kind: str) -> bool:
    return os.fstat(fd).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino


def set_name(name: str) -> None:
    nsfd.libc().prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME: what ps and comm show
