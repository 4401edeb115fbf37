"""pyroute2's IPRoute without an event loop (see nlsync.py), on the socket of a netns.iproute()
NetlinkSocket: the oracle that tests/test_rtnl_encoding.py and test_tc_encoding.py compare
rtnl.py's requests with (netlink_spy.py builds it). No plugin path uses pyroute2's IPRoute.
"""

from __future__ import annotations

import errno

from cni.host import lean_pyroute2

lean_pyroute2.install()  # before any pyroute2 import: its submodules only

from nlsync import _Driven, _LoopFree  # noqa: E402
from pyroute2.iproute.linux import AsyncIPRoute, IPRoute  # noqa: E402

from cni.host.rtnl import Rtnl  # noqa: E402


class _AsyncIPRoute(_LoopFree, AsyncIPRoute):
    pass


class SyncIPRoute(_Driven, IPRoute):
    """IPRoute's API (link, addr, route, get_links, vlan_filter ...) with no event loop
    behind it, on `raw`'s socket. pyroute2's side of it (its request and message machinery,
    ~0.3 ms of CPU and more in a fresh child) is built on the first call that needs it."""

    def __init__(self, raw: Rtnl) -> None:  # not super().__init__(): it would build the loop
        # Sequence numbers: pyroute2's (AddrPool: 0xff-0xffff) stay below raw's (from 1 << 20),
        # and each side reads its replies to the end.
        self.raw = raw
        self._core: _AsyncIPRoute | None = None

    @property
    def asyncore(self) -> _AsyncIPRoute:
        if self._core is None:  # no events; flags=0: never O_CREAT a namespace
            self._core = _AsyncIPRoute(groups=0, flags=0, use_socket=self.raw.sock)
        return self._core

    def close(self, code: int = errno.ECONNRESET) -> None:
        if self._core is None:
            self.raw.sock.close()
        else:
            super().close(code)
