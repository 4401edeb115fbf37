"""Fixtures for the reliability suite: a test network with private state, the runtime, a seed."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from cnitest import Netns
from relharness import LONG, Net, Runtime, inside, token


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long versions run only in `make reliability` (PYCNI_LONG=1), not in `make test`."""
    if LONG:
        return
    skip = pytest.mark.skip(reason="long version: run by `make reliability` (PYCNI_LONG=1)")
    here = Path(__file__).parent
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture
def tag() -> str:
    return token()


@pytest.fixture
def net(tmp_path: Path, tag: str) -> Net:
    """A network whose host-local store and result cache live in the test's tmp dir."""
    return Net(name=f"net-{tag}", data_dir=tmp_path / "networks", cache_dir=tmp_path / "cache")


@pytest.fixture
def runtime(host: Netns, net: Net, tmp_path: Path) -> Runtime:
    rt = Runtime(host=host, net=net, conf_dir=tmp_path / "net.d")
    rt.write_conflist()
    return rt


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """Random but reproducible: PYCNI_SEED=<n> replays a run; the seed is in the test's report."""
    seed = int(os.environ.get("PYCNI_SEED") or random.SystemRandom().randrange(1 << 30))
    request.node.user_properties.append(("seed", seed))
    print(f"PYCNI_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def in_host(host: Netns):
    return lambda: inside(host)
