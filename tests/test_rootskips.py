"""rootskips: as root, a test marked root that skips for lack of root or namespaces fails the
run; a skip for a missing optional tool stays a skip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cnitest import ROOT, VENV_PY

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


def test_a_root_test_skipped_for_lack_of_netns_fails_as_root(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from rootskips import pytest_runtest_makereport"
                                          "  # noqa: F401\n")
    (tmp_path / "test_probe.py").write_text(PROBE)
    ran = subprocess.run([str(VENV_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-o", "markers=root", "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path,
                         env=os.environ | {"PYTHONPATH": str(ROOT / "tests")})
    summary = ran.stdout.strip().splitlines()[-1]
    if os.geteuid() == 0:
        assert ran.returncode == 1 and summary.startswith("1 failed, 1 passed, 1 skipped"), \
            ran.stdout
        assert "a test marked root skipped while running as root" in ran.stdout
    else:
        assert ran.returncode == 0 and summary.startswith("1 passed, 2 skipped"), ran.stdout
