"""rootskips: as root, a test marked root that skips for lack of root or namespaces fails the
run, when it runs or when its module is collected; under make test (PYCNI_REQUIRE_ALL=1) a skip
for something setup.sh installs or ../shared provides fails too; other skips stay skips."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cnitest import ROOT, VENV_PY
from rootskips import REQUIRE_ENV, marks_root

PROBE = '''
import pytest
pytestmark = pytest.mark.root

def test_skips_for_netns():
    pytest.skip("needs root and network namespaces")

def test_skips_for_a_tool():
    pytest.skip("iperf3 is not installed")

def test_runs():
    pass
'''

MISSING_PROBE = '''
import pytest
from rootskips import have, missing, skip_unless

def test_skips_for_a_tool_setup_installs():
    missing("frobnicate (scripts/setup.sh installs it)")

@skip_unless(False, "the v1.9.1 reference plugins (../shared provides them)")
def test_marked_for_a_shared_file():
    pass

def test_checks_only_where_a_tool_is():
    if have(False, "frobnicate"):
        raise AssertionError("have() said a missing tool is here")

def test_skips_for_another_reason():
    pytest.skip("long version: run by make reliability")
'''

# Skipped while collected: a root-marked module for lack of namespaces, a module for a tool.
COLLECT_ROOT = '''
import pytest
pytestmark = [pytest.mark.root]
pytest.skip("needs root and network namespaces", allow_module_level=True)

def test_never_seen():
    pass
'''
COLLECT_MISSING = '''
from rootskips import missing
missing("frobnicate (scripts/setup.sh installs it)")

def test_never_seen():
    pass
'''


def run_probe(tmp_path: Path, require: bool, **modules: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from rootskips import pytest_make_collect_report, pytest_runtest_makereport"
        "  # noqa: F401\n")
    for name, text in modules.items():
        (tmp_path / f"test_{name}.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ENV}
    return subprocess.run([str(VENV_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "markers=root", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=env | {"PYTHONPATH": str(ROOT / "tests")}
                          | ({REQUIRE_ENV: "1"} if require else {}))


def summary(ran: subprocess.CompletedProcess) -> str:
    return ran.stdout.strip().splitlines()[-1]


def test_a_root_test_skipped_for_lack_of_netns_fails_as_root(tmp_path: Path) -> None:
    ran = run_probe(tmp_path, require=False, probe=PROBE)
    if os.geteuid() == 0:
        assert ran.returncode == 1 and summary(ran).startswith("1 failed, 1 passed, 1 skipped"), \
            ran.stdout
        assert "a test marked root skipped while running as root" in ran.stdout
    else:
        assert ran.returncode == 0 and summary(ran).startswith("1 passed, 2 skipped"), ran.stdout


def test_a_skip_for_what_setup_installs_fails_under_make_test(tmp_path: Path) -> None:
    ran = run_probe(tmp_path, require=True, probe=MISSING_PROBE)
    # (a skipif mark is a skip at setup: failed there, it counts as an error)
    assert ran.returncode == 1 and summary(ran).startswith("2 failed, 1 skipped, 1 error"), \
        ran.stdout
    for what in ("frobnicate (scripts/setup.sh installs it)",
                 "the v1.9.1 reference plugins (../shared provides them)", "frobnicate"):
        assert f"{what} is missing, and {REQUIRE_ENV}=1 (make test) requires" in ran.stdout, \
            (what, ran.stdout)


def test_by_hand_a_skip_for_what_setup_installs_stays_a_skip(tmp_path: Path) -> None:
    ran = run_probe(tmp_path, require=False, probe=MISSING_PROBE)
    assert ran.returncode == 0 and summary(ran).startswith("1 passed, 3 skipped"), ran.stdout


def test_modules_skipped_while_collected_are_held_to_the_same_rules(tmp_path: Path) -> None:
    ran = run_probe(tmp_path, require=True, root=COLLECT_ROOT, tool=COLLECT_MISSING)
    if os.geteuid() == 0:
        assert ran.returncode == 2 and "2 errors" in summary(ran), ran.stdout
        assert "test_root.py: a test marked root skipped while running as root" in ran.stdout
    else:
        assert ran.returncode == 2 and "1 skipped, 1 error" in summary(ran), ran.stdout
    assert "test_tool.py: frobnicate (scripts/setup.sh installs it) is missing" in ran.stdout
    ran = run_probe(tmp_path, require=False)  # by hand: the tool's module skips
    if os.geteuid() == 0:
        assert ran.returncode == 2 and "1 skipped, 1 error" in summary(ran), ran.stdout
    else:
        assert ran.returncode == 0 and summary(ran).startswith("2 skipped"), ran.stdout


def test_a_modules_root_mark_is_read_from_its_source(tmp_path: Path) -> None:
    cases = {"pytestmark = pytest.mark.root\n": True,
             "pytestmark = [pytest.mark.root, pytest.mark.slow]\n": True,
             "pytestmark: list = [pytest.mark.slow]\n": False,
             "root = pytest.mark.root\n": False}
    for text, marked in cases.items():
        path = tmp_path / "test_m.py"
        path.write_text("import pytest\n" + text)
        assert marks_root(path) is marked, text
