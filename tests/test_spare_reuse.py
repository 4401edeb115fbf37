"""A daemon's spare serves request after request (child.back_home): it must come back to
exactly what it was, or exit. Checked on the process itself (namespaces, cwd, umask,
environment, fds, threads, children) and end to end through the daemon: pods' chains, two
callers in two namespaces, the cap on requests per spare."""

from __future__ import annotations

import os

import pytest

from cni.host import netns
from cni.host.errors import NamespaceMissing


def test_entering_a_missing_namespace_leaves_no_fd_open() -> None:
    """A DEL of a pod whose netns is gone went through here and left the caller's namespace
    open: harmless in a process that exits, a leak in one that serves again."""
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(NamespaceMissing), netns.entered("/nonexistent/pycni-netns"):
        pass
    assert sorted(os.listdir("/proc/self/fd")) == before
