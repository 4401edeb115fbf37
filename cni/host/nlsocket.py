"""The rtnetlink socket netns.iproute() hands out: rtnl.py's client on a socket of its own.

The plugins' verbs send every request with rtnl.py (bridge VLANs included), so they never
import pyroute2.iproute (~50 ms without the daemon) nor build its request machinery (~5-8 ms of
a bridge ADD in the daemon's child). Kernel errors are pyroute2's NetlinkError (its module
alone: lean_pyroute2 keeps pyroute2.netlink's __init__ out), with the errno in `.code`: one
type for callers, and the type the tests' pyroute2 oracle (tests/nlsync_iproute.py) raises.
"""

from __future__ import annotations

import socket
from typing import Any

from cni.host import lean_pyroute2
from cni.host.rtnl import Rtnl

lean_pyroute2.install()  # before any pyroute2 import: its submodules only

from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402

_BUFSIZE = 1 << 20  # pyroute2's own socket buffer sizes
RAW_SEQ = 1 << 20  # above pyroute2's (AddrPool: 0xff-0xffff), which tests drive on the socket


class NetlinkSocket:
    """A NETLINK_ROUTE socket, made at once in the namespace the thread is in."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                             socket.NETLINK_ROUTE)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, _BUFSIZE)
        self.raw = Rtnl(sock, seq=RAW_SEQ)

    def __enter__(self) -> NetlinkSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.raw.sock.close()

    def request_raw(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """One request built with rtnl.py; a kernel error is NetlinkError."""
        try:
            return self.raw.request(kind, flags, body)
        except OSError as e:
            if e.errno is None:
                raise
            raise NetlinkError(e.errno) from None

    def link_fields(self, name: str | None = None, index: int = 0) -> dict[str, Any] | None:
        """A link's fields (links.Link) without pyroute2's decoder; None if it is missing.
        Other errors are NetlinkError."""
        try:
            return self.raw.link_fields(name, index)
        except OSError as e:
            if e.errno is None:
                raise
            raise NetlinkError(e.errno) from None
