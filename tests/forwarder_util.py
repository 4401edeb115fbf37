"""The forwarder's binary for tests: built by `make forwarder` (Go's build cache makes a rebuild
cheap), and bin dirs installed with it and without it (cni/install/forwarder.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cnitest import ROOT

from cni.install import forwarder


def built() -> Path:
    """build/forwarder/pycni-forwarder, (re)built from forwarder/ now."""
    proc = subprocess.run(["make", "-s", "forwarder"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert forwarder.BUILT.is_file()
    return forwarder.BUILT
