"""Small socket and fd helpers of the daemon: fds that came with a message, closing quietly."""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Iterator


def fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds of a message's SCM_RIGHTS. Every recvmsg that takes fds passes MSG_CMSG_CLOEXEC:
    they arrive close-on-exec (a spawned tool or a successor daemon never inherits them), with
    no syscall per fd to make them so."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += struct.unpack(f"{usable // 4}i", data[:usable])
    return fds


def accepted(listener: socket.socket) -> Iterator[socket.socket]:
    """Every connection waiting on a non-blocking listener, made non-blocking. An accept error
    (EMFILE and friends) is logged and ends this round: keep serving what we have."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            logging.getLogger("pycni.daemon").warning("accept: %s", e)
            return
        conn.setblocking(False)
        yield conn


def accept_one(listener: socket.socket) -> socket.socket | None:
    """A connection waiting on a non-blocking listener, or None. It is left blocking (no ioctl):
    its reader passes MSG_DONTWAIT, and what sends on it sets its own timeout (send_quietly,
    drain, the child's setblocking). An accept error (EMFILE and friends) is logged: keep
    serving what we have."""
    try:
        return listener.accept()[0]
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as e:
        logging.getLogger("pycni.daemon").warning("accept: %s", e)
        return None


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def peer_gone(conn: socket.socket) -> bool:
    """The client hung up (while its request waited): EOF or an error on a peek."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(1.0)  # a small frame into an empty buffer: never really waits
        conn.sendall(data)
    except OSError:
        pass


def drain(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.setblocking(False)
        for _ in range(64):
            if not conn.recv(1 << 16):
                return
    except OSError:
        pass
