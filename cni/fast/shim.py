"""The executables' fast path. Stdlib only, and only the cheap parts of it (_socket, loaded on
the daemon path only: VERSION does not import it).

- VERSION: answered here without importing json, re, dataclasses or cni.skel (they cost more
  than the interpreter's own start-up); anything unusual on stdin is left to skel.
- DEL with an empty CNI_NETNS of an attachment a DEL already cleaned (cni.deleted): success.
- ADD/CHECK/DEL/GC/STATUS: sent to the daemon (protocol.py) with the netns fd and the caller's
  namespaces, once SO_PEERCRED shows root listens on the socket (a listener of another uid
  gets nothing: not the request, its environment, nor root's namespaces); its reply is relayed
  as is.
- Everything else, and any request the daemon never accepted (no ACK: nothing ran; a refusal
  is a reply without ACK): skel.run in-process, same result (unless PYCNI_SHIM_FALLBACK=0:
  then error 11 naming the socket and why, see no_daemon).

How long the shim waits for the ACK (ACCEPT_TIMEOUT): a request sits in the socket's backlog
while the daemon restarts (systemd: `systemctl restart pycni.service` after an upgrade, the
socket unit holding the socket), and after accept it may wait for a request running on its
attachment. The longest of these is a restart: the old daemon's stop (it runs what it accepted:
server.py's drain, at most --timeout + the request read timeout, 130 s, and systemd's
TimeoutStopSec=150 in conf/pycni.service kills what is left) and the new one's start (imports
and warm-up, at most TimeoutStartSec=120, as a handover's successor: handover.READY_TIMEOUT).
ACCEPT_TIMEOUT exceeds their sum, so no call made during an upgrade times out here. (A handover
without systemd keeps a request in the backlog for no time: the old daemon accepts until its
successor serves.) Waiting long costs nothing: a runtime that gives up kills the shim, and the
daemon never starts a request whose caller hung up.

posix, not os: os is posix with Python around it, and importing it (os.environ decoding every
variable, _collections_abc, stat, posixpath) costs 1-2 ms of CPU, a fifth of the shim's own; the
paths that go on to import skel or cni.deleted (which import os anyway) use os.
"""

import posix
import sys

DAEMON_COMMANDS = ("ADD", "CHECK", "DEL", "GC", "STATUS")
# Copies of cni.spec.version.SUPPORTED / CURRENT and skel.MAX_STDIN: importing those modules
# costs ~10 ms (json, re, enum). tests/test_shim.py asserts the copies are equal.
SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT = "1.1.0"
MAX_STDIN = 16 * 1024 * 1024
# How long a daemon may take to accept (ACK) a request: a systemd restart's stop and start
# (TimeoutStopSec=150 + TimeoutStartSec=120 in conf/pycni.service) and a margin; see above.
ACCEPT_TIMEOUT = 300.0
_JSON_WS = b" \t\n\r"

Reply = tuple[bytes, bytes, int]  # stdout, stderr, exit code
NotRun = str  # why the daemon did not take a request (nothing ran): for no_daemon's message


Installed = dict[str, tuple[str, str]]  # the executable's entry-point plugins (registry.INSTALLED)


def main(argv0: str, installed: Installed | None = None, daemon: bool = True) -> int:
    """daemon False: pycni-forwarder's in-process path (it asked the daemon already)."""
    plugin = argv0.rpartition("/")[2]  # os.path.basename
    command = getenv("CNI_COMMAND")
    stdin = read_stdin()
    reply: Reply | None = None
    if command == "VERSION":
        out = fast_version(plugin, stdin, installed)
        reply = None if out is None else (out, b"", 0)
    elif command == "DEL" and not getenv("CNI_NETNS") and _already_clean(plugin):
        reply = (b"", b"", 0)  # containerd's second DEL: skel.run would answer the same
    elif daemon and command in DAEMON_COMMANDS and len(stdin) <= MAX_STDIN:
        from cni.fast import protocol as proto  # off VERSION's path: it loads _struct

        path = getenv(proto.SOCKET_ENV) or proto.DEFAULT_SOCKET
        answer = call_daemon(plugin, stdin, path)
        if not isinstance(answer, str):
            reply = answer
        elif getenv(proto.FALLBACK_ENV) == "0":
            reply = no_daemon(stdin, path, answer)
    if reply is None:
        reply = in_process(plugin, stdin, installed)
    write(1, reply[0])
    write(2, reply[1])
    return reply[2]


def getenv(name: str) -> str:
    """os.environ.get(name, ""), from posix.environ's bytes decoded as os.fsdecode does."""
    value = posix.environ.get(name.encode(), b"")
    return value.decode(sys.getfilesystemencoding(), "surrogateescape")


def _already_clean(plugin: str) -> bool:
    """Only asked for a DEL without CNI_NETNS (the only DEL a marker answers): importing os,
    time and cni.deleted costs ~1 ms of CPU, which a DEL with a namespace never needs."""
    import os
    import time

    from cni import deleted

    return deleted.already_clean(plugin, os.environ, time.time())


def leave(code: int) -> None:  # never returns (typing.NoReturn: importing typing costs 7 ms)
    """Exit with `code`, skipping interpreter finalization: module teardown and a last GC cost
    ~1 ms after the shim alone and ~60 ms after an in-process run (pyroute2, pydantic ...).
    Nothing is lost: replies go out through posix.write, plugin code writes files through fds or
    `with` blocks, and no atexit handler but logging's (no handlers configured) is registered."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass  # closed or None: nothing buffered there
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    posix._exit(code)


def registry_with(installed: Installed | None):  # -> the cni.registry module
    """cni.registry, with the executable's table in INSTALLED: imported only on the paths that
    read it (VERSION, in-process), not on a call to the daemon."""
    from cni import registry  # imports nothing

    if installed:
        registry.INSTALLED.update(installed)
    return registry


def in_process(plugin: str, stdin: bytes, installed: Installed | None = None) -> Reply:
    import os

    registry_with(installed)  # before skel finds the plugin's module by it
    from cni import skel
    from cni.fast import attachlock

    reply = attachlock.run(skel.run, plugin, dict(os.environ), stdin)  # one per attachment
    return reply.stdout, reply.stderr, reply.code


# --- VERSION ------------------------------------------------------------------------------------

def fast_version(plugin: str, stdin: bytes, installed: Installed | None = None) -> bytes | None:
    """skel.version_info's exact bytes for the stdin runtimes send; None: ask skel."""
    speaks = registry_with(installed).supported(plugin, SUPPORTED)
    asked = asked_version(stdin, speaks)
    if asked is None:
        return None
    listed = ", ".join(f'"{v}"' for v in speaks)
    return f'{{"cniVersion": "{asked}", "supportedVersions": [{listed}]}}'.encode()


def asked_version(stdin: bytes, speaks: tuple[str, ...] = SUPPORTED) -> str | None:
    """The version VERSION echoes, for stdin '', '{}' or '{"cniVersion": "<plain>"}'; else None.

    skel reads it with json.loads: a cniVersion in `speaks` is echoed, anything else CURRENT.
    Only shapes whose JSON meaning is certain without a parser are decided here.
    """
    body = stdin.strip(_JSON_WS)
    if not body:
        return CURRENT  # b"" reads as {}; whitespace only is a decode error: CURRENT either way
    if body[:1] != b"{" or body[-1:] != b"}":
        return None
    inner = body[1:-1].strip(_JSON_WS)
    if not inner:
        return CURRENT
    key, sep, value = inner.partition(b":")
    value = value.strip(_JSON_WS)
    if not sep or key.rstrip(_JSON_WS) != b'"cniVersion"' or len(value) < 2:
        return None
    text = value[1:-1]
    if value[:1] != b'"' or value[-1:] != b'"' or b'"' in text or b"\\" in text:
        return None
    if not all(0x20 <= c < 0x7F for c in text):
        return None
    version = text.decode("ascii")
    return version if version in speaks else CURRENT


# --- the daemon ---------------------------------------------------------------------------------

def call_daemon(plugin: str, stdin: bytes, path: str) -> Reply | NotRun:
    """The daemon's reply, or why it never accepted the request (then nothing ran)."""
    import _socket

    # Built before connecting: the request is then in the socket the moment the daemon
    # accepts, and the daemon reads it in the same step.
    roles, fds = open_fds(getenv("CNI_NETNS"))
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        data = _request(plugin, stdin, roles)
        sock.settimeout(ACCEPT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as e:  # missing, refused, not allowed, backlog full: no daemon for us
            return f"connect: {e.strerror or e}"
        try:
            uid = peer_uid(sock)
        except OSError as e:
            return f"cannot tell who listens: {e.strerror or e}"
        if uid != 0:  # whoever could bind the path (a directory others may write): not ours
            return f"the socket's listener runs as uid {uid}, not root"
        if not _send(sock, data, fds):
            return "the daemon hung up before it took the request"
        return _receive(sock, stdin)
    finally:
        sock.close()
        for fd in fds:
            posix.close(fd)


def peer_uid(sock) -> int:
    """The listener's uid (SO_PEERCRED: struct ucred's pid, uid, gid, each a native int)."""
    import _socket

    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def _request(plugin: str, stdin: bytes, roles: int) -> bytes:
    from cni.fast import protocol as proto

    env = proto.encode_env(posix.environ)  # os.environb's bytes
    umask = posix.umask(0o022)
    posix.umask(umask)
    return proto.encode_request(plugin, env, stdin, roles, umask)


def _send(sock, data: bytes, fds: list[int]) -> bool:
    """Send the request with its fds; False if the daemon hung up first (it cannot have run)."""
    import _socket

    packed = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)  # int[]
    try:
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)])
        view = memoryview(data)
        while sent < len(data):  # fds went with the first bytes; the rest is plain data
            sent += sock.send(view[sent:])
    except OSError:
        return False
    return True


def open_fds(netns: str) -> tuple[int, list[int]]:
    """The fds a request carries, and their roles (protocol.ROLE_*)."""
    from cni.fast import protocol as proto

    roles, fds = 0, []
    if netns:
        fd = open_netns(netns)
        if fd is not None:
            roles, fds = proto.ROLE_NETNS, [fd]
    flags = posix.O_RDONLY | posix.O_CLOEXEC
    for role, path, extra in ((proto.ROLE_CALLER_NET, "/proc/thread-self/ns/net", 0),
                              (proto.ROLE_CALLER_MNT, "/proc/thread-self/ns/mnt", 0),
                              (proto.ROLE_CWD, ".", posix.O_PATH | posix.O_DIRECTORY)):
        try:
            fds.append(posix.open(path, flags | extra))
        except OSError:
            continue
        roles |= role
    return roles, fds


def open_netns(path: str) -> int | None:
    """CNI_NETNS as an fd; None leaves the error to the plugin. Whether it is a network
    namespace is the daemon's child's to check (fcntl is loaded there, not here): one that is
    not is dropped and the plugin opens the path itself, as in-process."""
    try:
        # O_NONBLOCK: never block on a FIFO
        return posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except OSError:
        return None


def _receive(sock, stdin: bytes) -> Reply | NotRun:
    from cni.fast import protocol as proto

    try:
        first = sock.recv(1)
    except TimeoutError:
        # It has the whole request and may still start it: never run it a second time here.
        return lost(stdin, "the pycni daemon did not accept the request in time")
    except OSError as e:
        return f"it reset the connection before it took the request: {e.strerror or e}"
    if first == b"":
        return "it closed the connection before it took the request"  # stopping: not run
    if first == proto.REPLY:
        return _refusal(sock)  # an answer without ACK: the daemon refused, nothing ran
    sock.settimeout(None)  # accepted: the daemon's own timeout bounds the run
    try:
        head = _read_exact(sock, proto.REPLY_PREFIX)
        code, out_len, err_len = proto.reply_sizes(head)
        body = _read_exact(sock, out_len + err_len)
    except (OSError, ValueError, EOFError):
        return lost(stdin, "the pycni daemon stopped while running the request")
    return body[:out_len], body[out_len:], code


def _refusal(sock) -> NotRun:
    """Why the daemon refused (its CNI error's msg), as far as it could be read."""
    import json

    from cni.fast import protocol as proto

    try:
        head = proto.REPLY + _read_exact(sock, proto.REPLY_PREFIX - 1)
        _, out_len, _ = proto.reply_sizes(head)
        why = json.loads(_read_exact(sock, min(out_len, 1 << 16)))["msg"]
    except (OSError, ValueError, EOFError, TypeError, KeyError):
        why = "(unreadable)"
    return f"it refused the request: {why}"


def _read_exact(sock, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("short reply")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def lost(stdin: bytes, why: str) -> Reply:
    """A request that may have run but whose answer was lost: 11, so the runtime retries."""
    from cni.fast import protocol as proto

    return proto.error_reply(proto.TRY_AGAIN_LATER, why, stdin), b"", 1


def no_daemon(stdin: bytes, path: str, why: str) -> Reply:
    """No daemon took the request and the fallback is off: 11 (try again later), because it
    provably did not run (no ACK) and a daemon that is restarting or socket-activated will
    take the retry; 5 (I/O) would tell the runtime the failure is final. A daemon's refusal
    too: its own error is 5, but it ran nothing, and the runtime's retry may find a daemon that
    takes the request (a successor; a root listener in place of a stranger's)."""
    from cni.fast import protocol as proto

    why = (f"no pycni daemon took the request on {path} ({why}), and {proto.FALLBACK_ENV}=0 "
           "forbids running it in-process")
    return proto.error_reply(proto.TRY_AGAIN_LATER, why, stdin), b"", 1


# --- I/O ----------------------------------------------------------------------------------------

def read_stdin() -> bytes:
    try:
        if posix.isatty(0):
            return b""
        chunks = []
        # 64 KiB a read: a config fits in one, and a buffer that size comes from the heap, where
        # 1 MiB is an mmap, a shrink and an munmap (~17 us more an exec, VERSION's too)
        while chunk := posix.read(0, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""  # no stdin at all


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[posix.write(fd, view):]
    except OSError:
        pass  # the reader went away; the exit code still tells
