"""portmap's UDP conntrack flush (cni/host/conntrack.py) on real conntrack tables, read back
with the conntrack tool: only UDP entries of the given family and ports go, zones included."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from cnitest import ROOT

from cni.host import conntrack, netns

pytestmark = pytest.mark.root

SRC = {4: "192.0.2.10", 6: "2001:db8::10"}
DST = {4: "192.0.2.1", 6: "2001:db8::1"}


def insert(ns, family: int, port: int, proto: str = "udp", zone: int | None = None) -> None:
    """A replied entry from SRC:40000 to DST:port, as a client of a hostPort leaves it."""
    ports = (["--sport", "40000", "--dport", str(port), "--reply-port-src", str(port),
              "--reply-port-dst", "40000"])
    state = ["-u", "SEEN_REPLY"] if proto == "udp" else ["--state", "ESTABLISHED"]
    ns.run("conntrack", "-I", "-p", proto, "-s", SRC[family],
           "-d", DST[family], "-r", DST[family], "-q", SRC[family], *ports, "-t", "60",
           *state, *(["-w", str(zone)] if zone is not None else []))


def listed(ns, family: int) -> list[str]:
    out = ns.run("conntrack", "-L", "-f", f"ipv{family}", check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def flush(ns, ports: dict[int, set[int]]) -> int:
    with netns.entered(ns.path):
        return conntrack.delete_udp_dport(ports)


def test_only_udp_entries_to_the_ports_of_the_family_go(host) -> None:
    for family in (4, 6):
        insert(host, family, 5353)
        insert(host, family, 5454)
        insert(host, family, 5353, proto="tcp")
    insert(host, 4, 5353, zone=7)  # a zone is part of the key: the delete must name it
    insert(host, 6, 5454, zone=7)
    assert flush(host, {4: {5353}}) == 2
    v4 = listed(host, 4)
    assert not [e for e in v4 if "udp" in e and "dport=5353" in e]
    assert [e for e in v4 if "udp" in e and "dport=5454" in e]
    assert [e for e in v4 if "tcp" in e and "dport=5353" in e]
    assert len([e for e in listed(host, 6) if "udp" in e]) == 3  # the other family: untouched
    assert flush(host, {6: {5353, 5454}}) == 3
    assert not [e for e in listed(host, 6) if "udp" in e]
    assert flush(host, {4: {5353}}) == 0  # nothing left to delete: not an error


def test_both_families_each_with_its_ports(host) -> None:
    for family in (4, 6):
        for port in (5353, 5454):
            insert(host, family, port)
    insert(host, 6, 5353, zone=7)
    assert flush(host, {4: {5353}, 6: {5454}}) == 2
    assert sorted(e.split("dport=")[1].split()[0] for e in listed(host, 4)) == ["5454"]
    assert sorted(e.split("dport=")[1].split()[0] for e in listed(host, 6)) == ["5353",
                                                                              "5353"]
    assert flush(host, {4: set(), 6: {5353}}) == 2


def test_a_namespace_tracking_nothing_is_not_dumped(host, monkeypatch) -> None:
    """Dumping walks the whole (shared) conntrack hash table; with no entry it is skipped."""
    def no_socket(*_a, **_k):
        raise AssertionError("a netlink socket was opened")

    with netns.entered(host.path):
        monkeypatch.setattr(socket, "socket", no_socket)
        assert conntrack.delete_udp_dport({4: {5353}}) == 0
        monkeypatch.undo()
        insert(host, 4, 5353)
        assert conntrack.delete_udp_dport({4: {5353}}) == 1


def test_a_process_that_exits_after_its_request_leaves_the_close_to_its_exit(host) -> None:
    """The daemon's child (linger_after_reply) keeps its ctnetlink socket open: its close can
    wait for nf_tables' cleanup after a commit; exit closes it after the reply."""
    code = ("import os, sys\n"
            "from cni.host import conntrack, netns\n"
            "def sockets():\n"
            "    fds = os.listdir('/proc/self/fd')\n"
            "    links = [os.readlink(f'/proc/self/fd/{fd}') for fd in fds\n"
            "             if os.path.exists(f'/proc/self/fd/{fd}')]\n"
            "    return sum(link.startswith('socket:') for link in links)\n"
            "with netns.entered(sys.argv[1]):\n"
            "    before = sockets()\n"
            "    first = conntrack.delete_udp_dport({4: {5353}})\n"
            "    closed = sockets() - before\n"
            "    conntrack.linger_after_reply()\n"
            "    second = conntrack.delete_udp_dport({4: {5454}})\n"
            "    print(first, closed, second, sockets() - before)\n")
    insert(host, 4, 5353)
    insert(host, 4, 5454)
    out = subprocess.run([sys.executable, "-c", code, host.path], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.split()
    assert out == ["1", "0", "1", "1"]
    assert not [e for e in listed(host, 4) if "udp" in e]
