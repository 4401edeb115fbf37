"""Skips that `make test` does not accept. The conftests of tests/ and integration/ import the
hooks; test modules use `missing`, `skip_unless` and `have` for what they cannot run without.

- As root, a test marked `root` that skips for lack of root or network namespaces fails (CI's
  machine has both; such a skip hides a broken setup). A module that skips while it is collected
  (pytest.skip(allow_module_level=True), importorskip) is held to the same rule when it marks
  itself root: its tests would never be seen otherwise.
- Under `make test` (scripts/test.sh sets PYCNI_REQUIRE_ALL=1), a skip because something
  scripts/setup.sh installs or ../shared provides is missing (a tool, the reference plugins, a
  Python package of the dev extras) fails too. A developer running pytest by hand still skips.
Other skips (the long reliability runs, a kernel without an optional feature) stay skips."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import NoReturn

import pytest

# What a skip for lack of privileges or namespaces says (cnitest, conftest, the tests' own).
ROOT_REASON = re.compile(r"\broot\b|namespace|netns|unshare|CAP_NET_ADMIN|privilege", re.I)
REQUIRE_ENV = "PYCNI_REQUIRE_ALL"
MISSING = "missing: "  # how a skip for something setup.sh installs or ../shared provides starts


def required() -> bool:
    """Whether this run requires everything setup.sh installs and ../shared provides."""
    return os.environ.get(REQUIRE_ENV) == "1"


def missing(what: str) -> NoReturn:
    """Skip for lack of `what` (say where it comes from): a failure under `make test`."""
    pytest.skip(MISSING + what, allow_module_level=True)


def skip_unless(present: bool, what: str) -> pytest.MarkDecorator:
    """skipif's form of `missing`."""
    return pytest.mark.skipif(not present, reason=MISSING + what)


def have(present: bool, what: str) -> bool:
    """For a check a test makes only where `what` is here: under `make test` its absence
    fails the test instead of leaving the check out."""
    if not present and required():
        pytest.fail(_missing_failure(what), pytrace=False)
    return present


def _missing_failure(what: str) -> str:
    return (f"{what} is missing, and {REQUIRE_ENV}=1 (make test) requires everything "
            "scripts/setup.sh installs and ../shared provides: run `make setup`")


def failure_for(reason: str, root_marked: bool) -> str | None:
    """What a skip with this reason is instead, or None if it may stay a skip."""
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(MISSING) and required():
        return _missing_failure(reason.removeprefix(MISSING))
    if os.geteuid() == 0 and root_marked and ROOT_REASON.search(reason):
        return (f"a test marked root skipped while running as root: {reason} "
                "(every root test must run under `make test` as root)")
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    failure = failure_for(str(report.longrepr[2]), item.get_closest_marker("root") is not None)
    if failure:
        report.outcome = "failed"
        report.longrepr = failure


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module skipped while collected: it never imported, so its marks are read from its
    source (a module-level `pytestmark` naming `root`)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    root_marked = (marks_root(collector.path) if isinstance(collector, pytest.Module)
                   else collector.get_closest_marker("root") is not None)
    failure = failure_for(str(report.longrepr[2]), root_marked)
    if failure:
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: {failure}"


def marks_root(path: Path) -> bool:
    """Whether a test module's own `pytestmark` includes the root mark."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and \
                node.value is not None:
            return any(isinstance(n, ast.Attribute) and n.attr == "root"
                       for n in ast.walk(node.value))
    return False
