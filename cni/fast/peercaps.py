"""Whom the daemon serves: a caller that could run the plugin itself. An exec'd plugin runs
with its caller's credentials, so the daemon (root, every capability) serves only a caller that
is uid 0 and holds, effective, in the daemon's own user namespace, the capabilities a plugin
needs: CAP_NET_ADMIN (links, addresses, routes, nftables, tc) and CAP_SYS_ADMIN (setns into the
pod's namespace). Anyone else (nobody; a container's root whose capabilities were dropped; root
of a user namespace, whose capabilities stop at its own namespaces) is refused before anything
runs, with the error an exec'd plugin would give it: the reference's EPERM from setns or
netlink, which its skel answers as code 999 ("... operation not permitted").

Read without a pid-reuse race: SO_PEERPIDFD (Linux 6.5) hands the daemon a pidfd of the process
that connected; its pid comes from the pidfd's fdinfo, /proc/<pid> is opened, and the pidfd's
fdinfo read again: the process still has that pid, so the directory is its own, and every read
through it is of that process (or fails, if it exits meanwhile). On an older kernel the pid of
SO_PEERCRED is opened with pidfd_open: a caller that exits between its connect and that open,
its pid taken by a new process that is root with those capabilities, would be judged by the new
one (the residual race; the caller was uid 0 at connect, SO_PEERCRED says, and a pid is reused
only after the whole pid space went round).

The capabilities are the process's (its thread group leader's /proc/<pid>/status CapEff), read
at accept, not at its connect: dropping them after connecting only gets a refusal; gaining them
takes an exec (of a setuid or file-capable binary) that grants them anyway."""

from __future__ import annotations

import errno
import os
import socket

from cni.host import procfs

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
    now = pidfd_pid(pidfd)
    if now <= 0:  # gone (-1), or not in the daemon's pid namespace (0)
        return denied(pid, "is gone or outside the daemon's pid namespace")
    try:
        proc = os.open(f"/proc/{now}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return denied(now, f"has no /proc entry ({e.strerror or e})")
    try:
        if pidfd_pid(pidfd) != now:  # exited between the two reads: the dir may be another's
            return denied(now, "exited while it was checked")
        try:
            status = procfs.read("status", dir_fd=proc)
            userns = os.stat("ns/user", dir_fd=proc)
        except OSError as e:
            return denied(now, f"cannot be read in /proc ({e.strerror or e})")
    finally:
        os.close(proc)
    if (userns.st_dev, userns.st_ino) != own_userns():
        return denied(now, "is in another user namespace than the daemon's (its capabilities "
                           "stop at that namespace's own objects)")
    missing = [name for name, bit in NEEDED.items() if not cap_eff(status) >> bit & 1]
    if missing:
        return denied(now, f"lacks {' and '.join(missing)} (effective)")
    return ""


def pidfd_pid(pidfd: int) -> int:
    """The pid of a pidfd's process in our pid namespace, from its fdinfo: -1 once it exited,
    0 if it is not in our namespace."""
    for line in procfs.read(f"/proc/self/fdinfo/{pidfd}").splitlines():
        if line.startswith(b"Pid:"):
            return int(line.split()[1])
    return -1


def cap_eff(status: bytes) -> int:
    """CapEff of a /proc/<pid>/status (0 if it has none)."""
    for line in status.splitlines():
        if line.startswith(b"CapEff:"):
            return int(line.split()[1], 16)
    return 0


def own_userns() -> tuple[int, int]:
    global _own_userns
    if _own_userns is None:
        st = os.stat("/proc/self/ns/user")
        _own_userns = (st.st_dev, st.st_ino)
    return _own_userns
