"""`make demo` runs to the end, shows traffic through the chain, and leaves nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cnitest import ROOT

pytestmark = pytest.mark.root


def test_demo_runs_the_chain_and_cleans_up() -> None:
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    proc = subprocess.run([sys.executable, "-m", "cni.demo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert " 0% packet loss" in out  # pod to pod through the bridge
    assert "via its hostPort" in out  # portmap DNAT to the other pod
    assert "qdisc tbf" in out  # bandwidth shaping in place while the pods exist
    assert "nothing: no veth, no address, no rule, no reservation, no cache file" in out
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "pycni-demo" not in after and before == after
