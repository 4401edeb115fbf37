"""pyroute2's netlink sockets without an asyncio event loop: the same API and the same
messages, driven synchronously over a plain blocking netlink socket.

pyroute2 0.9 builds every socket class on asyncio: a new event loop, a datagram transport and a
queue per socket, and run_until_complete around every call. For a plugin that makes a handful
of netlink calls and exits, that machinery costs more than the kernel work (~5 ms of CPU for
loopback's three calls). Its request methods are coroutines whose only real suspension point is
waiting for the reply; here that wait is a blocking recv, so each coroutine runs to completion
in one step and no loop is needed. Everything else (request building, NLA encoding, message
parsing, NetlinkError) is pyroute2's own code.

The mixins here import no pyroute2 (its classes come with the module that uses them:
nlsync_iproute.py, the tests' IPRoute on a netns.iproute() socket).
They subscribe to no multicast group: the only messages a socket receives are replies to its
own requests.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

NLM_F_MULTI = 0x2  # pyroute2.netlink's, without importing its message classes here
_NLMSG_HEADER = struct.Struct("IHHII")  # length, type, flags, sequence number, port id
_RCVSIZE = 1 << 16


def run(coro: Coroutine) -> Any:
    """Run a coroutine that never suspends (our `get` never waits on a future) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("netlink: a pyroute2 call waited on the event loop (unsupported here)")


def iterate(agen: AsyncIterator) -> Iterator[Any]:
    """The items of an async generator that never suspends."""
    while True:
        try:
            yield run(agen.__anext__())
        except StopAsyncIteration:
            return


class _Queue:
    """Replies already read but meant for another request, by sequence number (a batch sends
    several requests before reading), and what pyroute2 itself queues (its request proxy)."""

    def __init__(self) -> None:
        self.tags: dict[int, list[bytes]] = {}

    def ensure_tag(self, tag: int) -> None:
        self.tags.setdefault(tag, [])

    def free_tag(self, tag: int) -> None:
        self.tags.pop(tag, None)

    async def put(self, tag: int, data: bytes) -> None:
        self.tags.setdefault(tag, []).append(data)

    def put_nowait(self, tag: int, data: bytes) -> None:
        self.tags.setdefault(tag, []).append(data)

    def pop(self, tag: int) -> bytes | None:
        waiting = self.tags.get(tag)
        return waiting.pop(0) if waiting else None


class _LoopFree:
    """For a pyroute2 async netlink socket class: its socket a plain blocking one, and `get`
    reading it directly (mixed in before the pyroute2 class)."""

    def __init__(self, **kwarg: Any) -> None:
        self._sock: socket.socket | None = None
        self._queue = _Queue()
        super().__init__(**kwarg)

    @property
    def socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = self.setup_socket()
        return self._sock

    @property
    def msg_queue(self) -> _Queue:
        return self._queue

    async def setup_endpoint(self) -> None:
        self.socket  # noqa: B018 - creates the socket: there is no transport to set up

    def _read(self, seq: int) -> bytes:
        """The next datagram of messages for `seq`; others are kept for their own requests."""
        queued = self._queue.pop(seq)
        if queued is not None:
            return queued
        while True:
            data = self.socket.recv(_RCVSIZE)
            mine, offset = [], 0
            while offset + _NLMSG_HEADER.size <= len(data):
                length, _, _, msg_seq, _ = _NLMSG_HEADER.unpack_from(data, offset)
                if length < _NLMSG_HEADER.size:
                    break
                chunk = data[offset:offset + ((length + 3) & ~3)]
                if msg_seq == seq or seq == 0:
                    mine.append(chunk)
                else:
                    self._queue.put_nowait(msg_seq, chunk)
                offset += (length + 3) & ~3
            if mine:
                return b"".join(mine)

    async def get(self, msg_seq: int = 0, terminate: Any = None, callback: Any = None,
                  noraise: bool = False, exception_factory: Any = None) -> AsyncIterator[Any]:
        """pyroute2's AsyncCoreSocket.get, reading the socket instead of the loop's queue."""
        from pyroute2.netlink.core import Stats  # loaded with the socket class already

        if msg_seq == -1:
            msg_seq = 0
        enough = started = False
        error = msg = None
        while not enough:
            messages = tuple(self.marshal.parse(self._read(msg_seq), msg_seq, callback))
            if not messages:
                break
            for msg in messages:
                if msg.get("header", {}).get("error") is not None:
                    error = msg["header"]["error"]
                    enough = True
                    break
                if self.marshal.is_enough(msg):
                    enough = True
                    break
                msg["header"]["target"] = self.status["target"]
                msg["header"]["stats"] = Stats(0, 0, 0)
                started = True
                yield msg
            if started and (msg_seq == 0 or not msg["header"].get("flags", 0) & NLM_F_MULTI
                            or (callable(terminate) and terminate(msg))):
                enough = True
        if not noraise and error:
            if exception_factory is not None:
                raise exception_factory(error, msg)
            raise error

    def close(self, code: int = errno.ECONNRESET) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class _Driven:
    """For a pyroute2 sync class (SyncAPI): its calls drive the async core's coroutines
    directly instead of through an event loop."""

    asyncore: Any

    def _run_with_cleanup(self, func: Any, *argv: Any, **kwarg: Any) -> Any:
        return run(func(*argv, **kwarg))

    def _generate_with_cleanup(self, func: Any, *argv: Any, **kwarg: Any) -> Iterator[Any]:
        result = func(*argv, **kwarg)
        if not hasattr(result, "__anext__"):  # a coroutine that returns the iterable
            result = run(result)
        if hasattr(result, "__anext__"):
            yield from iterate(result)
        else:
            yield from result

    def nlm_request_batch(self, msgs: list, noraise: bool = False) -> list:
        return list(iterate(self.asyncore.nlm_request_batch(msgs, noraise)))

    def close(self, code: int = errno.ECONNRESET) -> None:
        self.asyncore.status["closed"] = True
        self.asyncore.close(code)
