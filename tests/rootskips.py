"""`make test` as root must run every test marked `root`: a skip of one for lack of root or
network namespaces fails it there (CI's machine has both; such a skip hides a broken setup).
Other skips (an optional tool missing) stay skips. The conftests of tests/ and integration/
import the hook."""

from __future__ import annotations

import os
import re

import pytest

# What a skip for lack of privileges or namespaces says (cnitest, conftest, the tests' own).
ROOT_REASON = re.compile(r"\broot\b|namespace|netns|unshare|CAP_NET_ADMIN|privilege", re.I)


def root_skip_is_failure(item: pytest.Item, reason: str) -> bool:
    return (os.geteuid() == 0 and item.get_closest_marker("root") is not None
            and bool(ROOT_REASON.search(reason)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    if root_skip_is_failure(item, reason):
        report.outcome = "failed"
        report.longrepr = (f"a test marked root skipped while running as root: {reason} "
                           "(every root test must run under `make test` as root)")
