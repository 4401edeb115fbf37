"""Record the netlink requests a socket of netns.iproute() sends (tests that keep pyroute2 as
the oracle of what rtnl.py encodes)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nlsync_iproute import SyncIPRoute

from cni.host import netns
from cni.host.nlsocket import NetlinkSocket

HEADER = 16  # nlmsghdr: its sequence number and port id differ between the two senders


class OracleSocket(NetlinkSocket):
    """netns.iproute()'s socket with pyroute2's IPRoute API (link, addr, vlan_filter, tc ...) on
    the same socket too, built on first use: the oracle beside rtnl.py's requests."""

    _pyroute2: SyncIPRoute | None = None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._pyroute2 is None:
            self._pyroute2 = SyncIPRoute(self.raw)
        return getattr(self._pyroute2, name)

    def close(self) -> None:
        if self._pyroute2 is not None:
            self._pyroute2.close()  # closes the socket too
        else:
            super().close()


class Spy:
    """A socket that records what is sent through it."""

    def __init__(self, sock) -> None:
        self.sock, self.sent = sock, []

    def __getattr__(self, name: str):
        return getattr(self.sock, name)

    def send(self, data, *args):
        self.sent.append(bytes(data))
        return self.sock.send(data, *args)

    def sendto(self, data, *args):
        self.sent.append(bytes(data))
        return self.sock.sendto(data, *args)


@contextmanager
def spied(host_path: str) -> Iterator[tuple[OracleSocket, list[bytes]]]:
    """A socket in the namespace at `host_path` (both sides of it: rtnl.py and pyroute2), and
    the list its requests are appended to as they are sent."""
    with netns.entered(host_path):
        ipr = OracleSocket()
    spy = Spy(ipr.raw.sock)
    ipr.raw.sock = spy
    try:
        yield ipr, spy.sent
    finally:
        spy.sock.close()


def without_ids(sent: list[bytes], types: tuple[int, ...] = ()) -> list[bytes]:
    """The requests (of `types`, or all), without their sequence number and port id."""
    return [m[:8] + m[HEADER:] for m in sent
            if not types or int.from_bytes(m[4:6], "little") in types]
