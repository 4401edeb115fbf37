"""cni/host/lockfile.py: pycni's own lock files wait a bounded time, then Busy (CNI error 11)."""

from __future__ import annotations

import io
import os
import stat
import time

import pytest

from cni import skel
from cni.host import lockfile
from cni.host.errors import Busy


def test_a_held_lock_is_busy_after_the_wait_and_free_once_released(tmp_path) -> None:
    path = str(tmp_path / "locks" / "x.lock")
    held = lockfile.take(path, 1.0)  # made with its directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "locks").st_mode) == 0o700
    start = time.monotonic()
    with pytest.raises(Busy) as caught:
        lockfile.take(path, 0.2)  # another open file description: flock makes it wait
    assert time.monotonic() - start >= 0.2
    assert str(caught.value) == (f"the lock {path} is still held by another request after "
                                 "0.2s; try again later")
    os.close(held)
    with lockfile.held(path, 0.2):
        pass


def test_a_symlink_is_never_opened_as_a_lock(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(OSError):
        lockfile.take(str(tmp_path / "x.lock"), 0.1)


def test_skel_reports_busy_as_error_11() -> None:
    reply = skel._failed(Busy("the lock /run/pycni/x.lock is still held"), "bridge", "1.1.0",
                         io.StringIO())
    assert reply.code == 1 and b'"code": 11' in reply.stdout, reply.stdout
