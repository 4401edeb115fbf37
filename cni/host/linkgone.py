"""Delete a link and return once the kernel has announced it gone, not once it has freed it.

RTM_DELLINK is answered only after the kernel's clean-up of the unregistered device
(netdev_run_todo: an rcu_barrier() and the wait for its last references), 5-35 ms here and
more on a busy node. Everything a caller can observe is done before that: the device has left
its namespace (its name and index are free), its veth peer with it, bridge ports, addresses and
routes are gone, and the kernel has sent RTM_DELLINK to the namespace's listeners.

So the request goes out from a helper thread, on a socket of its own (made in the link's
namespace): the RTM_DELLINK is pyroute2's ifinfmsg, encoded here, and its answer is parsed by
pyroute2's rtnetlink marshal, as are the announcements this thread listens for meanwhile: for
the link, and for its veth peer (unregistered in the same batch, after it). Each namespace is
the one of the caller's socket for it (SIOCGSKNS), never the thread's: an index means nothing
in another namespace. The helper finishes the wait alone; a process that exits waits for it in
the kernel, but its reply has gone out by then (the daemon's child). If the request fails, its
error comes first (nothing was deleted, nothing announced); if the announcements cannot be read
(a listener's buffer overran) or a peer lives elsewhere, this simply waits for the answer, as a
plain delete would.
"""

from __future__ import annotations

import fcntl
import functools
import os
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cni.host import links, netns

if TYPE_CHECKING:
    from pyroute2 import IPRoute

RTMGRP_LINK = 1
SIOCGSKNS = 0x894C  # a socket's network namespace, as a new fd (Linux 4.9)
AF_UNSPEC = 0  # the link's own announcement (a bridge port's removal is also sent as AF_BRIDGE)


def remove(ipr: IPRoute, index: int, peer: tuple[IPRoute, int] | None = None) -> None:
    """Delete link `index` of ipr's namespace; also wait for its veth peer (index `peer[1]` in
    the namespace of the socket `peer[0]`) to go. A kernel error is pyroute2's NetlinkError."""
    try:
        sender, watched = _sockets(ipr, index, peer)
    except OSError:  # no SIOCGSKNS (Linux < 4.9), no socket to be had: a plain delete
        links.remove(ipr, index)  # pyroute2 link("del", index=index)'s request
        return
    listeners = [sock for sock, _ in watched]
    request = _delete_request(index)
    # The helper closes its end of the pipe when the answer is in: no write that could meet a
    # closed reader, and poll sees the hang-up.
    answered, done = os.pipe2(os.O_CLOEXEC)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            sender.send(request)  # returns once the kernel has done it all (rcu_barrier too)
            outcome.append(_answer(sender.recv(1 << 16)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, if it still waits
            outcome.append(e)
        finally:
            sender.close()
            os.close(done)

    helper = threading.Thread(target=send, name="pycni-linkdel", daemon=True)
    try:
        try:
            helper.start()
        except RuntimeError:  # no thread to be had: send it from here, as a plain delete
            send()
        else:
            if _announced(watched, answered):
                return
            helper.join()  # answered first, or the announcements were lost
        error = outcome[0] if outcome else RuntimeError("the link delete did not finish")
        if error is not None:
            raise error
    finally:
        os.close(answered)
        for sock in listeners:
            sock.close()


def _delete_request(index: int) -> bytes:
    """RTM_DELLINK of link `index`, with an ACK asked for: pyroute2's ifinfmsg, encoded."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_DELLINK
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    msg = ifinfmsg()
    msg["index"] = index
    msg["header"]["type"] = RTM_DELLINK
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = 1
    msg.encode()
    return bytes(msg.data)


def _answer(data: bytes) -> BaseException | None:
    """The kernel's answer to the delete, parsed by pyroute2: None (ACK) or its NetlinkError."""
    from pyroute2 import NetlinkError
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    for msg in MarshalRtnl().parse(data):
        code = msg.get("error")
        if code is not None:
            return NetlinkError(-code) if code else None
    return RuntimeError("the link delete got no answer")


def _sockets(ipr: IPRoute, index: int, peer: tuple[IPRoute, int] | None,
             ) -> tuple[socket.socket, list[tuple[socket.socket, int]]]:
    """The helper's socket and a listener per watched link, each in its link's namespace."""
    opened: list[socket.socket] = []
    try:
        with _in_namespace_of(ipr):
            sender = _socket()
            opened.append(sender)
            watched = [(_listener(), index)]
            opened.append(watched[0][0])
        if peer is not None:
            with _in_namespace_of(peer[0]):
                watched.append((_listener(), peer[1]))
        return sender, watched
    except BaseException:
        for sock in opened:
            sock.close()
        raise


@contextmanager
def _in_namespace_of(ipr: IPRoute) -> Iterator[None]:
    """This thread inside the network namespace ipr's socket lives in."""
    fd = _namespace_fd(ipr)
    try:
        with netns.entered(fd):
            yield
    finally:
        os.close(fd)


def _namespace_fd(ipr: IPRoute) -> int:
    return fcntl.ioctl(ipr.fileno(), SIOCGSKNS)


def _socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                         socket.NETLINK_ROUTE)


def _listener() -> socket.socket:
    """A socket that only receives the namespace's link announcements (it sends nothing)."""
    sock = _socket()
    sock.bind((0, RTMGRP_LINK))
    return sock


def _announced(watched: list[tuple[socket.socket, int]], answered: int) -> bool:
    """Whether every watched link was announced gone before the request was answered."""
    waiting = {sock.fileno(): (sock, index) for sock, index in watched}
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    poller.register(answered, select.POLLIN | select.POLLHUP)
    while waiting:
        for fd, _ in poller.poll():
            if fd == answered:
                return False
            sock, index = waiting[fd]
            try:
                data = sock.recv(1 << 16)
            except OSError:  # ENOBUFS: announcements were dropped, ours may be among them
                return False
            if index in _deleted(data):
                del waiting[fd]
                poller.unregister(fd)
    return True


def _deleted(data: bytes) -> set[int]:
    """The indexes of the links that RTM_DELLINK messages in `data` announce gone."""
    from pyroute2.netlink.rtnl import RTM_DELLINK

    return {msg["index"] for msg in _dellink_marshal().parse(data)
            if msg["header"]["type"] == RTM_DELLINK and msg["family"] == AF_UNSPEC}


@functools.cache
def _dellink_marshal():
    """pyroute2's rtnetlink marshal with RTM_DELLINK alone in its message map: the listener
    also gets every other link announcement of the namespace (the bridge's own changes, other
    pods' veths), which it then reads as bare headers instead of decoding each attribute of
    each (their number and size grow with the pods on the node)."""
    from pyroute2.netlink.rtnl import RTM_DELLINK
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    class DelLinkOnly(MarshalRtnl):
        msg_map = {RTM_DELLINK: ifinfmsg}

    return DelLinkOnly()
