"""Fake third-party distributions for the entry-point tests: dist-info dirs with `pycni.plugins`
entry points and their modules in a site dir of the test's own, as pip leaves them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni import registry, skel

Make = Callable[..., Path]
# A plugin as a plain module: ADD's result in the current version
MODULE_PLUGIN = '''
def add(req):
    return {"cniVersion": req.version, "ips": [{"address": "198.51.100.9/24"}]}

def check(req):
    return None

def delete(req):
    return None
'''


def write_dist(site: Path, dist: str, entries: dict[str, str], modules: dict[str, str]) -> None:
    """A distribution `dist` in `site`: its dist-info (METADATA, entry_points.txt) and modules."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[pycni.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)


@pytest.fixture(name="fake_dists")  # imported by the tests that use it
def fake_dists_fixture(tmp_path: Path, monkeypatch) -> Iterator[Make]:
    """make(dist, {name: value}, {module: source}): a distribution with pycni.plugins entry
    points on sys.path; the registry's and skel's findings are forgotten afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "SITES", [str(site)])  # the site dirs entry points come from
    made: list[str] = []

    def make(dist: str, entries: dict[str, str], modules: dict[str, str]) -> Path:
        write_dist(site, dist, entries, modules)
        made.extend(modules)
        registry.discover(refresh=True)
        return site

    saved = dict(registry.SUPPORTED_FROM)
    yield make
    registry._found = None
    registry.FIXED = False
    registry.DISTS.clear()
    registry.REFUSED.clear()
    registry.INSTALLED.clear()
    registry.SUPPORTED_FROM.clear()
    registry.SUPPORTED_FROM.update(saved)
    for name in list(skel._loaded):
        if name not in registry.PLUGINS:
            del skel._loaded[name]
    for name in made:
        sys.modules.pop(name, None)
