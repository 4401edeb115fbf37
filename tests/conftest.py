from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator

import pytest
from cnitest import Netns, Plugins, can_use_netns, delete_netns, forget_deleted_markers, new_netns
from rootskips import (  # noqa: F401 (hooks: skips make test does not accept fail)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

# `pycni install` enables systemd units on a systemd host: installs made by tests never do.
os.environ.setdefault("PYCNI_SYSTEMD", "0")


@functools.cache
def _netns_ok() -> bool:
    return can_use_netns()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs root and network namespaces (run via make test)")
    for item in items:
        if "root" in item.keywords and not _netns_ok():
            item.add_marker(skip)


@pytest.fixture
def netns_factory() -> Iterator[Callable[[str], Netns]]:
    """Makes namespaces that are deleted at teardown, whatever the test did."""
    made: list[Netns] = []
    forget_deleted_markers()

    def make(prefix: str = "pycni-pod") -> Netns:
        ns = new_netns(prefix)
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        delete_netns(ns)


@pytest.fixture
def host(netns_factory) -> Netns:
    """A throwaway 'host' namespace: plugins run in it, as if it were the node."""
    return netns_factory("pycni-host")


@pytest.fixture
def pod(netns_factory) -> Netns:
    return netns_factory("pycni-pod")


@pytest.fixture
def plugins(host) -> Plugins:
    return Plugins(host)
