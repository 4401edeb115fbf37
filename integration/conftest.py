"""Fixtures for the real-client tests: a throwaway host netns per test, one offline image per
session. Clients that cannot run here are skipped with the reason; `make test` installs them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402
from clients import need  # noqa: E402
from cnitest import Netns, delete_netns, forget_deleted_markers, new_netns  # noqa: E402
from rootskips import (  # noqa: E402, F401 (hooks: see rootskips)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

# The cluster (integration/cluster/) runs in `make cluster-test` only, not in `make test`'s run.
collect_ignore = [] if os.environ.get("PYCNI_CLUSTER") == "1" else ["cluster"]


@pytest.fixture
def node_netns() -> Iterator[Netns]:
    """The node's network: a throwaway namespace, deleted whatever the test did."""
    need()
    forget_deleted_markers()
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


@pytest.fixture(scope="session")
def pause_image(tmp_path_factory) -> Path:
    """CRI's sandbox_image: busybox sleeping forever (no registry: nothing is pulled)."""
    need("buildah")
    return clients.build_image(tmp_path_factory.mktemp("pause"), clients.PAUSE_IMAGE,
                               cmd=clients.PAUSE_CMD)
