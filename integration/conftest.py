"""Fixtures for the real-client tests: a throwaway host netns per test, one offline image per
session. Clients that cannot run here are skipped with the reason; `make test` installs them."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402
from cnitest import Netns, can_use_netns, delete_netns, new_netns  # noqa: E402


@functools.cache
def _netns_ok() -> bool:
    return can_use_netns()


def need(*tools: str) -> None:
    """Skip unless root with netns support and the tools are installed."""
    if os.geteuid() != 0 or not _netns_ok():
        pytest.skip("needs root and network namespaces (run via make test)")
    if missing := clients.missing_tools(*tools):
        pytest.skip(f"{', '.join(missing)} not installed (scripts/setup.sh's APT_TEST has them)")


@pytest.fixture
def node_netns() -> Iterator[Netns]:
    """The node's network: a throwaway namespace, deleted whatever the test did."""
    need()
    ns = new_netns("pycni-node")
    yield ns
    delete_netns(ns)


@pytest.fixture(scope="session")
def oci_image(tmp_path_factory) -> Path:
    """busybox-static as an OCI archive, built offline with buildah once per session."""
    need("buildah")
    work = tmp_path_factory.mktemp("image")
    try:
        return clients.build_image(work)
    except (AssertionError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"building the busybox image failed: {e}")
