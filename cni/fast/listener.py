"""The daemon's listening socket: systemd's (socket activation) or one it binds itself, and
the systemd notifications about it."""

from __future__ import annotations

import logging
import os
import resource
import socket
import stat

log = logging.getLogger("pycni.daemon")

# The fd on which a daemon started by a handover tells its predecessor it serves (handover.py).
HANDOVER_ENV = "PYCNI_HANDOVER_FD"
_predecessor: socket.socket | None = None


def inherited_listener() -> tuple[socket.socket, str | None] | None:
    """The socket systemd passed (LISTEN_FDS), or a predecessor handing over (handover.py), if
    passed to this process; with the socket file's path when it is this daemon's to remove at
    exit (a predecessor's own socket, never systemd's)."""
    handover = os.environ.pop(HANDOVER_ENV, "")
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
    if not handover.isdigit():
        return sock, None
    global _predecessor
    _predecessor = socket.socket(fileno=int(handover))
    os.set_inheritable(_predecessor.fileno(), False)
    os.register_at_fork(after_in_child=_forget_predecessor)  # children never hold it
    name = sock.getsockname()
    return sock, name if isinstance(name, str) and name else None


def _forget_predecessor() -> None:
    global _predecessor
    if _predecessor is not None:
        _predecessor.close()
        _predecessor = None


def bind(path: str, take_over: bool = False) -> socket.socket:
    """Listen on `path`: its directory private (0700), the socket 0600 from the start. A live
    daemon on `path` is an error, unless `take_over` (a DaemonSet's rolling update: the new
    pod's daemon starts while the old one serves): then the socket is bound beside `path` and
    renamed onto it, so every connect finds one of the two listening; the old daemon serves
    what it accepted until it is stopped, and leaves the path alone (server.py: not its inode)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SystemExit(f"pycni daemon: {directory} must belong to uid {os.geteuid()} and not "
                         "be writable by others (use a private directory for the socket)")
    live = _remove_stale(path, take_over)
    target = f"{path}.{os.getpid()}" if live else path
    if live:
        _remove_stale(target, False)  # a crashed predecessor's of this pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(target)
    finally:
        os.umask(old)
    sock.listen(socket.SOMAXCONN)
    if live:
        os.rename(target, path)
        log.info("took %s over from the daemon listening there", path)
    return sock


def _remove_stale(path: str, live_ok: bool) -> bool:
    """A socket file nobody listens on is left from a crash: remove it; a live one is an error
    unless live_ok (-> True)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"pycni daemon: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return False
    finally:
        probe.close()
    if live_ok:
        return True
    raise SystemExit(f"pycni daemon: another daemon is listening on {path}")


def inode(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def sock_name(sock: socket.socket) -> str:
    try:
        return str(sock.getsockname())
    except OSError:
        return "?"


def raise_fd_limit() -> None:
    """Every waiting connection is an fd: allow as many as the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def sd_notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Tell systemd (Type=notify) how we are: READY=1 once the listener is served, so units
    ordered after pycni.service start when requests go through. No NOTIFY_SOCKET: no-op.
    A daemon started by a handover tells its READY=1 to its predecessor too (handover.py)."""
    if _predecessor is not None and state.startswith("READY=1"):
        try:
            _predecessor.sendall(state.encode())
        except OSError as e:
            log.warning("telling the predecessor we serve: %s", e)
        _forget_predecessor()
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
