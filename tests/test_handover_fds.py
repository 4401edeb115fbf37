"""Handovers leak no fd: a daemon after any number of handovers holds as many fds as the first,
and so do its spares, and its listening socket exists once (a stray copy in some process keeps
the connections queued on it from being reset once the daemon stops)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_daemon import comm, gone, kill_tree, start_daemon, wait_for  # noqa: F401 (a fixture)

from cni.fast import protocol as proto
from cni.fast import status

pytestmark = pytest.mark.root
HANDOVERS = 5


def fds(pid: int) -> dict[int, str]:
    """What each open fd of `pid` is (its /proc link)."""
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
    return out


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def spares(pid: int) -> list[int]:
    return sorted(p for p in children(pid) if comm(p) == "pycni-spare")


def listener_inode(pid: int, path: Path) -> int:
    """The inode of the socket listening on `path`, from the daemon's network namespace's
    /proc/net/unix (flag __SO_ACCEPTCON: listening; accepted sockets show the path too)."""
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7] == str(path) and int(fields[3], 16) & 0x10000:
            return int(fields[6])
    raise AssertionError(f"nothing listens on {path}")


def holders(inode: int) -> list[tuple[int, int]]:
    """Every (pid, fd) on the machine holding the socket `inode`."""
    link = f"socket:[{inode}]"
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found += [(int(entry), fd) for fd, what in fds(int(entry)).items()
                          if what == link]
            except OSError:
                continue  # gone meanwhile
    return found


def hand_over(sock: Path) -> int:
    """Ask the daemon on `sock` to hand over (as pycni install does); the successor's pid."""
    answer = status.ask(proto.HANDOVER_MAGIC, str(sock), timeout=300)
    assert answer is not None, "no daemon answers the handover"
    code, out = answer
    assert code == 0, out
    return json.loads(out)["successor"]


def settled(daemon, pid: int) -> list[int]:
    """Until `pid` serves with its two spares warm; its spares."""
    wait_for(lambda: len(spares(pid)) == 2, f"two spares of {pid}")
    wait_for(lambda: all(f"spare {p} is warm" in daemon.log.read_text() for p in spares(pid)),
             f"the spares of {pid} warm")
    wait_for(lambda: (status.query(str(daemon.socket), 30) or {}).get("pid") == pid,
             f"{pid} answering")
    return spares(pid)


def test_handovers_leak_no_fd_and_the_listener_exists_once(host, start_daemon) -> None:  # noqa: F811
    daemon = start_daemon(host)
    pid = daemon.proc.pid
    first_spares = sorted(len(fds(p)) for p in settled(daemon, pid))
    first = fds(pid)
    assert holders(listener_inode(pid, daemon.socket)) != []
    successor = 0
    try:
        for round_ in range(1, HANDOVERS + 1):
            old, old_kids = pid, children(pid)
            successor = pid = hand_over(daemon.socket)
            if old == daemon.proc.pid:
                daemon.proc.wait(60)
            wait_for(lambda: gone(old) and all(gone(k) for k in old_kids),  # noqa: B023
                     f"daemon {old} and its children to exit")
            kids = settled(daemon, pid)
            now = fds(pid)
            assert len(now) == len(first), (round_, first, now)
            assert sorted(len(fds(p)) for p in kids) == first_spares, (
                round_, {p: fds(p) for p in kids})
            inode = listener_inode(pid, daemon.socket)
            assert holders(inode) == [(pid, 3)], (round_, holders(inode))
    finally:
        if successor:
            kill_tree(successor)
