"""Network namespaces: open one by path or fd, enter it briefly, open netlink sockets in it.

We setns the calling thread and build pyroute2's IPRoute there, then switch back, rather than
use IPRoute(netns=...): that forks a child per socket and defaults to O_CREAT, which would create
a namespace for a bad path. The socket stays in the namespace it was made in.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from cni.host import nsfd
from cni.host.errors import NamespaceError, NamespaceMissing
from cni.host.nsfd import is_netns, setns

if TYPE_CHECKING:
    import asyncio

    from pyroute2 import IPRoute as NetlinkSocket

# The request's sockets, set only inside shared_sockets(): namespace (st_dev, st_ino) -> the one
# socket for it. A context variable, so no state outlives the request or leaks across threads.
_shared: ContextVar[dict[tuple[int, int], NetlinkSocket] | None] = ContextVar(
    "pycni_shared_sockets", default=None)
F = TypeVar("F", bound=Callable[..., Any])


def open_ns(target: int | str) -> int:
    """A new fd for the namespace at `target` (path or fd); checks that it is a network ns."""
    try:
        fd = os.dup(target) if isinstance(target, int) else os.open(target, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise NamespaceMissing(f"CNI_NETNS {target!r}: no such network namespace") from None
    except OSError as e:
        raise NamespaceError(f"CNI_NETNS {target!r}: cannot open: {e.strerror or e}") from None
    if not is_netns(fd):
        os.close(fd)
        raise NamespaceError(f"CNI_NETNS {target!r} is not a network namespace")
    return fd


@contextmanager
def entered(target: int | str) -> Iterator[None]:
    """Run the block inside the namespace, then return to the one we came from."""
    fd = open_ns(target)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            setns(fd)
            try:
                yield
            finally:
                setns(home)
        finally:
            os.close(home)
    finally:
        os.close(fd)


def new_socket() -> NetlinkSocket:
    """pyroute2's IPRoute on a socket made now, in the calling thread's namespace: no multicast
    groups (a request socket: nothing queues up behind our answers), strict checking on so that
    a dump asked with a link's index is filtered by the kernel (dumps.py). In a process that
    keeps an event loop (keep_event_loop), on that loop."""
    from pyroute2 import IPRoute

    ipr = IPRoute(groups=0, strict_check=True, libc=nsfd.libc(), use_event_loop=_own_loop())
    # IPRoute's nlm_request reads this, which only NetlinkSocket's __init__ sets (pyroute2
    # 0.9.7): False returns the dump as a tuple.
    ipr.status.setdefault("nlm_generator", False)
    return ipr


# A spare's asyncio event loop for its IPRoutes, kept from request to request: (pid, thread,
# loop). Only that process's that thread uses it (a loop runs in one thread; a forked child
# would share its epoll instance and self-pipe with us).
_loop: tuple[int, int, asyncio.AbstractEventLoop] | None = None


def keep_event_loop() -> None:
    """Make one asyncio event loop now and build every IPRoute of this thread on it from now
    on (pyroute2's use_event_loop), never closed: for a daemon's spare, which records its fds
    after its warm-up (the loop's epoll fd and self-pipe among them). Without it each IPRoute
    makes its own loop and closes it with the socket (~50 us of CPU a socket). IPRoute.close
    leaves its transport's last callback (the socket is closed at once) to the loop's next
    run: one at most, nothing that grows."""
    global _loop
    if _loop is None:
        import asyncio

        _loop = (os.getpid(), threading.get_ident(), asyncio.new_event_loop())


def _own_loop() -> asyncio.AbstractEventLoop | None:
    kept = _loop
    if kept is None or kept[0] != os.getpid() or kept[1] != threading.get_ident():
        return None
    return kept[2]


def _new_iproute(target: int | str | None) -> NetlinkSocket:
    if target is None:
        return new_socket()
    with entered(target):
        return new_socket()


class _Borrowed(AbstractContextManager):
    """A shared socket handed out for a `with` block: leaving the block does not close it."""

    def __init__(self, ipr: NetlinkSocket) -> None:
        self.ipr = ipr

    def __enter__(self) -> NetlinkSocket:
        return self.ipr

    def __exit__(self, *exc: Any) -> None:
        return None


def ns_key(target: int | str | None = None) -> tuple[int, int]:
    """A namespace's identity, (st_dev, st_ino): `target`'s, or the calling thread's."""
    if target is None:
        st = os.stat("/proc/thread-self/ns/net")
    else:
        fd = open_ns(target)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    return st.st_dev, st.st_ino


def iproute(target: int | str | None = None) -> AbstractContextManager[NetlinkSocket]:
    """A pyroute2 IPRoute whose socket lives in `target` (None: the current namespace), for
    a `with` block. Inside shared_sockets() it is the request's one socket for that
    namespace; in a process that keeps one for its own namespace (keep_home_socket), that one
    for that namespace."""
    sockets = _shared.get()
    if sockets is None and _kept is None:
        return _new_iproute(target)
    # Keyed by the namespace itself, not the path: None inside entered() is the container.
    key = ns_key(target)
    if _kept is not None and key == _kept[0]:
        return _Borrowed(_kept[1])
    if sockets is None:
        return _new_iproute(target)
    ipr = sockets.get(key)
    if ipr is None:
        carried = _take_carried() if _carried is not None and _carried[0] == key else None
        ipr = sockets[key] = carried if carried is not None else _new_iproute(target)
    return _Borrowed(ipr)


# A spare's IPRoute for its own namespace, kept from request to request: (namespace, socket).
_kept: tuple[tuple[int, int], NetlinkSocket] | None = None


def keep_home_socket() -> None:
    """Make one IPRoute for this process's namespace now and hand it out for that namespace
    from now on (iproute), never closed: for a daemon's spare, which serves request after
    request in the namespace it was forked in (most requests' host namespace), and records its
    fds after its warm-up (this socket's among them). Never in a process that forks children
    which use netlink: they would share the socket. Only requests are sent on it (no multicast
    groups): each reads its own answers, by sequence number."""
    global _kept
    if _kept is None:
        keep_event_loop()  # the kept socket's and every later IPRoute's of this process
        _kept = (ns_key(), new_socket())


# A spare's socket for the namespace its last request worked in (a pod's), kept for the next
# request there: (namespace, socket). A pod's plugins come one after another (bridge ADD,
# bandwidth ADD, bridge CHECK, ...) and a spare serves them in turn; each would build an IPRoute
# in the pod's namespace (~0.6-0.9 ms of CPU in a spare). Only while carry_sockets() allows it
# (a spare, not after a DEL), and dropped by the spare when no request comes soon
# (child.CARRY_IDLE): the socket pins its namespace, which must not outlive the pod for long.
_carried: tuple[tuple[int, int], NetlinkSocket] | None = None
_carry = False


def carry_sockets(allowed: bool) -> None:
    """Whether the request about to run may leave its namespace's socket for the next (a
    spare's choice: not after a DEL); False also drops one carried now."""
    global _carry
    _carry = allowed
    if not allowed:
        drop_carried()


def carried_fd() -> int | None:
    """The fd of the socket carried between requests, if one is (the spare's fd check)."""
    return _carried[1].fileno() if _carried is not None else None


def drop_carried() -> None:
    ipr = _take_carried()
    if ipr is not None:
        _close(ipr)


def _carry_over(key: tuple[int, int], ipr: NetlinkSocket) -> None:
    global _carried
    drop_carried()  # another namespace's, not asked for by this request
    _carried = (key, ipr)


def _take_carried() -> NetlinkSocket | None:
    global _carried
    ipr = _carried[1] if _carried is not None else None
    _carried = None
    return ipr


def _close(ipr: NetlinkSocket) -> None:
    try:
        ipr.close()
    except Exception:
        pass  # closing is best effort: the process ends soon anyway


@contextmanager
def shared_sockets() -> Iterator[None]:
    """One socket per namespace for the whole block (a request), closed at its end.

    pyroute2 0.9 builds a socket plus its own asyncio event loop per IPRoute; a bridge ADD
    used to open eleven. A cached socket also pins its namespace, so its inode is not reused.
    """
    if _shared.get() is not None:  # nested: the outer block owns the sockets
        yield
        return
    sockets: dict[tuple[int, int], NetlinkSocket] = {}
    token = _shared.set(sockets)
    try:
        yield
    finally:
        _shared.reset(token)
        if _carry and len(sockets) == 1:  # the request's one namespace besides home: a pod's
            _carry_over(*next(iter(sockets.items())))
            sockets.clear()
        for ipr in sockets.values():
            _close(ipr)


def one_socket_per_namespace(verb: F) -> F:
    """A plugin verb whose every netns.iproute() shares one socket per namespace (see
    shared_sockets), for the whole request."""
    @functools.wraps(verb)
    def run(*args: Any, **kwargs: Any) -> Any:
        with shared_sockets():
            return verb(*args, **kwargs)
    return run  # type: ignore[return-value]


# What a forked child inherited of its parent's sockets (forget_inherited): kept referenced,
# never closed there, so that no finalizer of theirs runs in the child (closing a pyroute2
# socket unregisters it from an event loop's epoll set, which parent and child share).
_inherited: list[object] = []


def forget_inherited() -> None:
    """In a child forked from a process that keeps sockets (a spare running a nested
    entry-point IPAM: delegate.run_forked): make every socket from now on, as a fresh process
    would. The parent's kept, carried and shared sockets are its kernel sockets too: a request
    sent on one here and not read to its end (the child killed) would leave its answer for
    the parent."""
    global _kept, _carried, _carry
    keep_referenced(_kept, _carried, _shared.get())
    _kept = _carried = None
    _carry = False
    _shared.set(None)


def keep_referenced(*inherited: object) -> None:
    _inherited.extend(inherited)
