"""Whom the daemon serves: a caller that could run the plugin itself. An exec'd plugin runs
with its caller's credentials, so the daemon (root, every capability) serves only a caller that
is uid 0 and holds, effective, in the daemon's own user namespace, the capabilities a plugin
needs: CAP_NET_ADMIN (links, addresses, routes, nftables, tc) and CAP_SYS_ADMIN (setns into the
pod's namespace). Anyone else (nobody; a container's root whose capabilities were dropped; root
of a user namespace, whose capabilities stop at its own namespaces) is refused before anything
runs, with the error an exec'd plugin would give it: the reference's EPERM from setns or
netlink, which its skel answers as code 999 ("... operation not permitted").

Read without a pid-reuse race: SO_PEERPIDFD (Linux 6.5) hands the daemon a pidfd of the process
that connected, the one SO_PEERCRED's pid names (both are the socket's peer, taken at connect).
Its capabilities (capget(2) by pid: the process's effective set, no /proc text to format) and its
user namespace (/proc/<pid>/ns/user) are read by that pid, and then the pidfd is asked whether
its process still exists (pidfd_send_signal, signal 0): it does, so it held the pid throughout
and both reads were its own. On an older kernel SO_PEERCRED's pid is opened with pidfd_open: a
caller that exits between its connect and that open, its pid taken by a new process that is
root with those capabilities, would be judged by the new one (the residual race; the caller was
uid 0 at connect, SO_PEERCRED says, and a pid is reused only after the pid space went round).

The capabilities are read at accept, not at the caller's connect: dropping them after
connecting only gets a refusal; gaining them takes an exec (of a setuid or file-capable binary)
that grants them anyway. They are the thread group leader's (capget of the pid): threads of one
process share its memory, so a thread with fewer capabilities than its leader is no boundary.
About 15-30 us of the parent's CPU a request (five syscalls and a ctypes call). Reading a
caller's ns/user takes ptrace read access: the daemon as root with CAP_SYS_PTRACE (the unit and
the privileged DaemonSet keep every capability), or a caller holding no capability the daemon
lacks; without it the caller is refused ("cannot be read"), never served unchecked. Callers
must be visible in the daemon's pid namespace (SO_PEERCRED's pid 0 is refused): the DaemonSet
runs with hostPID."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket

from cni.host import nsfd

SO_PEERPIDFD = 77  # socket.SO_PEERPIDFD from Python 3.13 on
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
NEEDED = {"CAP_NET_ADMIN": CAP_NET_ADMIN, "CAP_SYS_ADMIN": CAP_SYS_ADMIN}
EPERM = "operation not permitted"  # Go's syscall.EPERM text, as the reference's errors end
_own_userns: tuple[int, int] | None = None


def refusal(conn: socket.socket, pid: int, uid: int, peerpidfd: bool = True) -> str:
    """Why the daemon must not serve the peer of `conn` ("": serve it). `pid` and `uid` are
    its SO_PEERCRED (in the daemon's pid and user namespaces); `peerpidfd`=False takes the
    older kernels' path (tests)."""
    if uid != 0:
        return denied(pid, f"runs as uid {uid}, not root")
    try:
        pidfd = _pidfd(conn, pid, peerpidfd)
    except OSError as e:
        return denied(pid, f"cannot be identified ({e.strerror or e})")
    try:
        return _check(pidfd, pid)
    finally:
        os.close(pidfd)


def denied(pid: int, why: str) -> str:
    return (f"the caller (pid {pid}) {why}; running a plugin needs uid 0 with "
            f"{' and '.join(NEEDED)} in the daemon's user namespace: {EPERM}")


def _pidfd(conn: socket.socket, pid: int, peerpidfd: bool) -> int:
    if peerpidfd:
        try:
            return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as e:
            if e.errno not in (errno.ENOPROTOOPT, errno.EINVAL):
                raise
    return os.pidfd_open(pid)  # older kernels: see the residual race above


def _check(pidfd: int, pid: int) -> str:
    if pid <= 0:  # not in the daemon's pid namespace: nothing to read it by
        return denied(pid, "is outside the daemon's pid namespace")
    try:
        effective = cap_eff(pid)
        userns = os.stat(f"/proc/{pid}/ns/user")
        signal.pidfd_send_signal(pidfd, 0)  # still there: the pid was its own throughout
    except OSError as e:
        return denied(pid, f"exited or cannot be read ({e.strerror or e})")
    if (userns.st_dev, userns.st_ino) != own_userns():
        return denied(pid, "is in another user namespace than the daemon's (its capabilities "
                           "stop at that namespace's own objects)")
    missing = [name for name, bit in NEEDED.items() if not effective >> bit & 1]
    if missing:
        return denied(pid, f"lacks {' and '.join(missing)} (effective)")
    return ""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_CAP_V3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two _CapData, capabilities 0-31 and 32-63


def cap_eff(pid: int) -> int:
    """The effective capability set of process `pid` (capget(2))."""
    header, data = _CapHeader(_CAP_V3, pid), (_CapData * 2)()
    nsfd.check(nsfd.libc().capget(ctypes.byref(header), data), f"capget({pid})")
    return data[0].effective | data[1].effective << 32


def own_userns() -> tuple[int, int]:
    global _own_userns
    if _own_userns is None:
        st = os.stat("/proc/self/ns/user")
        _own_userns = (st.st_dev, st.st_ino)
    return _own_userns
