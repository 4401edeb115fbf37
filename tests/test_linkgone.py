"""Deleting links without the kernel's clean-up wait (cni/host/linkgone.py): the call returns
on the kernel's announcements, and by then the links are gone, peer and bridge port included."""

from __future__ import annotations

import errno
import os
import threading

import pytest
from pyroute2 import NetlinkError

from cni.host import ifb, linkgone, links, netns, veth
from cni.host.errors import HostError

pytestmark = pytest.mark.root


@pytest.fixture
def held_answer(monkeypatch):
    """The helper thread's request reaches the kernel, but its answer is held back until the
    test lets it go: a remove() that returns meanwhile returned on the announcements."""
    release, answered = threading.Event(), threading.Event()
    real = linkgone._answer

    def answer(data: bytes):
        release.wait(10)
        answered.set()
        return real(data)

    monkeypatch.setattr(linkgone, "_answer", answer)
    yield answered
    release.set()


def wired_pod(host, pod) -> str:
    """A bridge in `host` with one port: a veth whose other end is the pod's eth0."""
    host.run("ip", "link", "add", "br0", "type", "bridge")
    host.run("ip", "link", "add", "vhost0", "type", "veth", "peer", "name", "eth0",
             "netns", pod.path)
    host.run("ip", "link", "set", "vhost0", "master", "br0", "up")
    pod.run("ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
    return "vhost0"


def test_veth_is_gone_with_its_host_end_and_bridge_port_before_the_answer(
        host, pod, held_answer) -> None:
    host_end = wired_pod(host, pod)
    with netns.entered(host.path):
        assert veth.delete_container_end(pod.path, "eth0") is True
    assert not held_answer.is_set()  # returned on the announcements, the answer still held
    assert "eth0" not in pod.links()
    assert host_end not in host.links()
    assert host.ip("link", "show", "master", "br0") == []
    assert "lo" in pod.links()  # the pod's namespace itself is untouched


def test_ifb_is_gone_before_the_answer(host, held_answer) -> None:
    host.run("ip", "link", "add", "bwptest", "type", "ifb")
    with netns.entered(host.path), netns.iproute() as ipr:
        assert ifb.delete(ipr, "bwptest") is True
        assert not held_answer.is_set()
        assert "bwptest" not in host.links()
        assert ifb.delete(ipr, "bwptest") is False  # DEL again: nothing there, no error


def test_a_refused_delete_is_an_error_and_changes_nothing(host, pod) -> None:
    with netns.entered(host.path), pytest.raises(HostError, match="failed to delete 'lo'"):
        veth.delete_container_end(pod.path, "lo")
    assert "lo" in pod.links()


def test_a_missing_index_is_enodev(host) -> None:
    with netns.iproute(host.path) as ipr, pytest.raises(NetlinkError) as e:
        linkgone.remove(ipr, 99999)
    assert e.value.code == errno.ENODEV


def test_the_socket_names_the_namespace_not_the_thread(host, pod) -> None:
    """An index means something only in its namespace: the delete goes to the namespace of
    the socket the index was read with, whichever namespace the thread is in."""
    host.run("ip", "link", "add", "ifbhost", "type", "ifb")
    pod.run("ip", "link", "add", "ifbpod", "type", "ifb")
    assert host.links()["ifbhost"]["ifindex"] == pod.links()["ifbpod"]["ifindex"]
    with netns.entered(host.path), netns.iproute(pod.path) as pod_ipr:
        assert ifb.delete(pod_ipr, "ifbpod") is True
    assert "ifbpod" not in pod.links()
    assert "ifbhost" in host.links()


def test_a_peer_announced_nowhere_falls_back_to_the_answer(host, pod) -> None:
    """A peer index this namespace never announces (the peer lives elsewhere): remove() waits
    for the kernel's answer instead, and the link is still deleted."""
    wired_pod(host, pod)
    with netns.iproute(pod.path) as cipr, netns.iproute(host.path) as ipr:
        linkgone.remove(cipr, links.get(cipr, "eth0").index, (ipr, 99999))
    assert "eth0" not in pod.links()


def test_announcements_are_read_from_the_kernel_messages(host) -> None:
    """_announced on real RTM_DELLINK messages: the watched index is seen, another is not."""
    host.run("ip", "link", "add", "ifbtest0", "type", "ifb")
    host.run("ip", "link", "add", "ifbtest1", "type", "ifb")
    with netns.entered(host.path):
        with netns.iproute() as ipr:
            kept = links.get(ipr, "ifbtest1").index
            gone = links.get(ipr, "ifbtest0").index
        listener = linkgone._listener()
    answered, done = os.pipe()
    try:
        host.run("ip", "link", "del", "ifbtest0")
        assert linkgone._announced([(listener, gone)], answered) is True
        host.run("ip", "link", "del", "ifbtest1")
        os.write(done, b".")  # answered first: the other index was never announced to it
        assert linkgone._announced([(listener, kept + 1000)], answered) is False
    finally:
        for fd in (answered, done):
            os.close(fd)
        listener.close()


def test_without_a_thread_the_caller_deletes_and_reports(host, monkeypatch) -> None:
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(linkgone.threading.Thread, "start", refuse)
    host.run("ip", "link", "add", "bwptest", "type", "ifb")
    with netns.entered(host.path), netns.iproute() as ipr:
        assert ifb.delete(ipr, "bwptest") is True
        assert "bwptest" not in host.links()
        with pytest.raises(NetlinkError) as e:
            linkgone.remove(ipr, 99999)
        assert e.value.code == errno.ENODEV


def test_without_siocgskns_a_plain_delete(host, monkeypatch) -> None:
    """A kernel older than 4.9 has no SIOCGSKNS: the link is deleted all the same, waiting
    for the kernel's answer, in the socket's namespace."""
    def enotty(*_args):
        raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")

    monkeypatch.setattr(linkgone, "_namespace_fd", enotty)
    host.run("ip", "link", "add", "bwptest", "type", "ifb")
    with netns.iproute(host.path) as ipr:
        assert ifb.delete(ipr, "bwptest") is True
        assert ifb.delete(ipr, "bwptest") is False
        with pytest.raises(NetlinkError):
            linkgone.remove(ipr, 99999)
    assert "bwptest" not in host.links()


def test_lost_announcements_fall_back_to_the_answer(host, monkeypatch) -> None:
    """A listener whose buffer overran (ENOBUFS) may have lost ours: remove() then waits for the
    kernel's answer, and the link is gone all the same."""
    real = linkgone._listener

    class Overrun:
        def __init__(self) -> None:
            self.sock = real()

        def fileno(self) -> int:
            return self.sock.fileno()

        def recv(self, _size: int) -> bytes:
            raise OSError(errno.ENOBUFS, "No buffer space available")

        def close(self) -> None:
            self.sock.close()

    monkeypatch.setattr(linkgone, "_listener", Overrun)
    host.run("ip", "link", "add", "bwptest", "type", "ifb")
    with netns.iproute(host.path) as ipr:
        assert ifb.delete(ipr, "bwptest") is True
    assert "bwptest" not in host.links()
