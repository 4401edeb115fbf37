"""The spare pool's rules (cni/fast/pool.py), on the pool alone: grow while every spare is busy,
wait up to --spare-wait with the pool full or for a spare on its way back, a nested call never
waits, shrink after --spare-linger, the spare back last serves first.

Honest fakes only where the rule does not live: forks are socketpairs (the test plays each
spare's side of its control socket, as child.spare_main speaks it), the clock is the test's,
and so is which spare has sent its reply (the daemon reads the child's name in /proc).
What the pool decides, hands over and closes is real. The same rules end to end, with real
daemons and plugins: tests/test_daemon.py."""

from __future__ import annotations

import gc
import os
import selectors
import socket
import struct
import subprocess

import pytest

from cni.fast.child import SPARE_READY, take_job
from cni.fast.pool import SparePool
from cni.fast.procs import fork_child, normal_priority, parent_only
from cni.fast.state import Options


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Spares:
    """Forks that make no process: the pool gets the parent's end of a socketpair and a pid
    no process has (setpgid on it fails, as own_group allows); the test keeps the spare's."""

    def __init__(self) -> None:
        self.ends: dict[int, socket.socket] = {}
        self.answered: set[int] = set()  # spares that have sent their request's reply
        self.hurried: list[int] = []  # spares the pool moved back to normal priority
        self.pid = 4_190_000

    def fork(self, _what: str = "") -> tuple[int, socket.socket]:
        parent, child = socket.socketpair()
        self.pid += 1
        self.ends[self.pid] = child
        return self.pid, parent

    def got(self, pid: int) -> bool:
        """Whether spare `pid` was handed a request (it takes it, as a spare does)."""
        end = self.ends[pid]
        try:
            end.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        job = take_job(end)
        assert job is not None
        job[0].close()
        return True

    def retired(self, pid: int) -> bool:
        """Whether the pool closed spare `pid`'s control socket (EOF: it exits)."""
        try:
            return self.ends[pid].recv(1, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False


@pytest.fixture
def world():
    clock, spares = Clock(), Spares()
    sel = selectors.DefaultSelector()

    def make(**opts) -> SparePool:
        return SparePool(Options(**opts), sel, None, fork=spares.fork, clock=clock,
                         has_answered=lambda pid: pid in spares.answered,
                         hurry=spares.hurried.append)

    def say_ready(pid: int) -> None:
        """Spare `pid` says it is warm (or back after a request); the server's loop reads it."""
        spares.answered.discard(pid)
        spares.ends[pid].sendall(SPARE_READY + struct.pack("!I", pid))
        for key, _ in sel.select(1):
            key.data(key.fileobj)

    yield make, clock, spares, say_ready
    for end in spares.ends.values():
        end.close()
    sel.close()


def request() -> tuple[socket.socket, bytes, list[int]]:
    conn, _caller = socket.socketpair()
    return conn, b"a request", []


def warm_pool(make, forks, say_ready, **opts) -> tuple[SparePool, list[int]]:
    """A pool refilled to --spares by forks of its own (no zygote), each warm."""
    pool = make(**opts)
    pool.tend(running=0, queued=False)
    pids = list(forks.ends)
    assert len(pids) == opts["spares"] and pool.warm() == 0
    for pid in pids:
        say_ready(pid)
    assert pool.warm() == opts["spares"]
    return pool, pids


def test_the_pool_grows_while_every_spare_is_busy_up_to_max_spares(world) -> None:
    make, _clock, spares, say_ready = world
    pool, (first,) = warm_pool(make, spares, say_ready, spares=1, max_spares=3)
    assert pool.serve(request()) == first and spares.got(first)
    assert pool.serve(request()) is None  # none warm
    grown = [pool.grow(request(), "bridge ADD c2"), pool.grow(request(), "bridge ADD c3")]
    assert grown == list(spares.ends)[1:]  # each forked for its request, serving it
    assert pool.status() == {"configured": 1, "max": 3, "warm": 0, "serving": 3,
                             "retired": 0, "ordered": 0}
    assert pool.grow(request(), "bridge ADD c4") is None  # full: no fork
    assert len(spares.ends) == 3
    say_ready(grown[0])  # back after its request: the pool keeps it
    assert pool.take_back() == [grown[0]] and pool.warm() == 1
    assert pool.take_back() == []  # taken once: the server finishes its job once


def test_with_the_pool_full_a_request_waits_up_to_spare_wait(world) -> None:
    make, clock, spares, say_ready = world
    pool, (only,) = warm_pool(make, spares, say_ready, spares=1, max_spares=1, spare_wait=0.5)
    received = clock.now
    assert not pool.waits(received, lambda: False)  # one is warm: it is served
    assert pool.serve(request()) == only
    clock.now += 0.4
    assert pool.waits(received, lambda: False)
    clock.now += 0.1
    assert not pool.waits(received, lambda: False)  # waited --spare-wait: it forks

    roomy = make(spares=1, max_spares=2, spare_wait=0.5)
    roomy.spares = pool.spares  # the same busy spare, room for one more: it grows instead
    assert not roomy.waits(clock.now, lambda: False)


def test_a_nested_call_never_waits_for_a_spare(world) -> None:
    make, clock, spares, say_ready = world
    pool, (only,) = warm_pool(make, spares, say_ready, spares=1, max_spares=1, spare_wait=600)
    assert pool.serve(request()) == only
    asked = []

    def nested() -> bool:
        asked.append(True)
        return True

    assert not pool.waits(clock.now, nested)
    assert pool.waits(clock.now, lambda: False)
    assert asked == [True]
    say_ready(only)
    assert not pool.waits(clock.now, nested) and asked == [True]  # warm: not even asked


def test_the_spares_beyond_spares_retire_after_spare_linger_idle(world) -> None:
    make, clock, spares, say_ready = world
    pool, (first,) = warm_pool(make, spares, say_ready, spares=1, max_spares=3,
                               spare_linger=10)
    assert pool.serve(request()) == first and spares.got(first)
    grown = [pool.grow(request(), "x"), pool.grow(request(), "y")]
    for pid in (grown[1], first, grown[0]):  # back one after another
        say_ready(pid)
        clock.now += 1
    pool.tend(running=0, queued=False)
    assert pool.status()["warm"] == 3  # idle 1-3 s: they stay
    clock.now += 7.5  # grown[1] idle 10.5 s, first 9.5, grown[0] 8.5
    pool.tend(running=0, queued=False)
    assert {pid for pid in spares.ends if spares.retired(pid)} == {grown[1]}
    clock.now += 2
    pool.tend(running=0, queued=False)
    assert {pid for pid in spares.ends if spares.retired(pid)} == {grown[1], first}
    assert pool.status()["warm"] == 1 and pool.status()["retired"] == 2  # back to --spares
    clock.now += 100
    pool.tend(running=0, queued=False)
    assert not spares.retired(grown[0])  # never below --spares


def test_the_spare_back_last_serves_first(world) -> None:
    make, clock, spares, say_ready = world
    pool, pids = warm_pool(make, spares, say_ready, spares=3, max_spares=3)
    for pid in pids:
        assert pool.serve(request()) == pid  # (each warm one is taken)
        spares.got(pid)
    for pid in (pids[2], pids[0], pids[1]):
        clock.now += 1
        say_ready(pid)
    assert pool.serve(request()) == pids[1] and spares.got(pids[1])
    assert pool.serve(request()) == pids[0] and spares.got(pids[0])
    assert not spares.got(pids[2])


def test_a_request_waits_for_a_spare_on_its_way_back_rather_than_grow(world) -> None:
    """A request that follows another (a pod's next plugin, the next pod) finds that one's
    spare answered and going home: it waits for it, and the pool stays at --spares."""
    make, clock, spares, say_ready = world
    pool, (a, b) = warm_pool(make, spares, say_ready, spares=2, max_spares=8, spare_wait=0.5)
    assert pool.serve(request()) == a and pool.serve(request()) == b
    received = clock.now
    assert not pool.waits(received, lambda: False)  # both still running theirs: it grows
    spares.answered.add(b)  # b has sent its reply, and is going home
    pool.tend(running=2, queued=True)  # the server's next turn: going home is read once a turn
    assert pool.waits(received, lambda: False)
    assert spares.hurried == [b]  # it goes home at normal priority: a request waits for it
    assert not pool.waits(received, lambda: True)  # a nested call does not wait
    assert pool.waits(received, lambda: False)  # another request in this turn waits too...
    pool.tend(running=2, queued=True)
    assert pool.waits(received, lambda: False)  # ...and in the next
    assert spares.hurried == [b]  # b was hurried once on its way home, not per request
    clock.now += 0.5
    assert not pool.waits(received, lambda: False)  # waited --spare-wait: it grows
    clock.now = received
    say_ready(b)
    assert not pool.waits(received, lambda: False)
    assert pool.serve(request()) == b and len(spares.ends) == 2


@pytest.mark.root
def test_a_spare_waited_for_is_moved_to_normal_priority() -> None:
    """What the pool's `hurry` does to a real process going home at SCHED_IDLE."""
    idle = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.sched_setscheduler(
        0, os.SCHED_IDLE, os.sched_param(0)))
    try:
        assert os.sched_getscheduler(idle.pid) == os.SCHED_IDLE
        normal_priority(idle.pid)
        assert os.sched_getscheduler(idle.pid) == os.SCHED_OTHER
    finally:
        idle.kill()
        idle.wait()


class _Owner:
    """Something the daemon's parent holds that no child may keep (a client's connection)."""

    def __init__(self) -> None:
        self.kept, self.other = socket.socketpair()
        parent_only(self.drop)

    def drop(self) -> None:
        self.kept.close()


def test_every_child_forked_drops_what_only_the_parent_holds() -> None:
    """procs.fork_child runs each owner's drop in the child (the server's loop, the pool's
    control sockets, the metrics endpoint); an owner gone since is skipped."""
    owner, gone = _Owner(), _Owner()
    del gone
    gc.collect()
    me = os.getpid()
    try:
        pid = fork_child("test fork")
    except BaseException:
        if os.getpid() != me:
            os._exit(2)  # a drop failed in the child: never back into pytest
        raise
    if pid == 0:
        os._exit(0 if owner.kept.fileno() == -1 else 1)
    assert pid is not None and os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert owner.kept.fileno() >= 0  # the parent keeps its own
    owner.kept.close()
    owner.other.close()
