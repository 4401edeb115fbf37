"""pyroute2's Conntrack without an event loop, as nlsync.py does IPRoute. Apart from nlsync:
pyroute2.conntrack costs ~25 ms to import, and only portmap's UDP flush needs it."""

from __future__ import annotations

from cni.host import lean_pyroute2

lean_pyroute2.install()  # before any pyroute2 import: its submodules only

from pyroute2.conntrack import AsyncConntrack, Conntrack  # noqa: E402

from cni.host.nlsync import _Driven, _LoopFree  # noqa: E402


class _AsyncConntrack(_LoopFree, AsyncConntrack):
    pass


class SyncConntrack(_Driven, Conntrack):
    """pyroute2's Conntrack (dump_entries, delete ...) with no event loop behind it."""

    def __init__(self, nfgen_family: int) -> None:  # not super().__init__(), as SyncIPRoute
        self.asyncore = _AsyncConntrack(nfgen_family=nfgen_family, flags=0)
        self.asyncore.socket  # noqa: B018 - opened now, in the namespace we are in
