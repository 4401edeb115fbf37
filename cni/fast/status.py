"""Ask a running daemon for its own figures: version, pid, requests started and answered since
it started, how many had to fork a child because no spare was warm, and its spares. A status
query is never a plugin run (protocol.STATUS_MAGIC); like every request it is root only.

Tests use it to prove that the daemon, not the shim's in-process fallback, served a request;
`pycni doctor` prints it. A handover request (handover.py) goes the same way."""

from __future__ import annotations

import json
import os
import socket
import sys

from cni.fast import protocol as proto


def socket_path(path: str | None = None) -> str:
    """The daemon's socket as the shims find it: `path`, else PYCNI_SOCKET, else the default."""
    return path or os.environ.get(proto.SOCKET_ENV) or proto.DEFAULT_SOCKET


def ask(magic: bytes, path: str | None = None, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """Send a query the daemon answers itself (STATUS_MAGIC, HANDOVER_MAGIC): its reply's code
    and stdout; None if nothing answers a pycni reply on the socket, or if what listens there
    is not root's (sent nothing)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(timeout)
            s.connect(socket_path(path))
            if peer_uid(s) != 0:  # whoever could bind the path: nothing it says is an answer
                return None
            s.sendall(magic)
            answer = _read_all(s)
    except OSError:
        return None
    try:
        code, out_len, _ = proto.reply_sizes(answer[:proto.REPLY_PREFIX])
    except ValueError:
        return None
    return code, answer[proto.REPLY_PREFIX:proto.REPLY_PREFIX + out_len]


def peer_uid(s: socket.socket) -> int:
    """The uid of the process listening on the socket (SO_PEERCRED: pid, uid, gid)."""
    cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def query(socket_path: str | None = None, timeout: float = 2.0) -> dict | None:
    """The daemon's figures; None if no daemon answers on the socket (none there, refused
    the connection or the query, or it is not a pycni daemon that knows the query)."""
    answer = ask(proto.STATUS_MAGIC, socket_path, timeout)
    if answer is None:
        return None
    code, out = answer
    try:
        figures = json.loads(out)
    except ValueError:
        return None
    if code != 0 or not isinstance(figures, dict) or "answered" not in figures:
        return None  # a refusal (not root), or an older daemon's "not a pycni request"
    return figures


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)
