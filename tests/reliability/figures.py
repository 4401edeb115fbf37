"""Figures for docs/RELIABILITY.md: each test appends one JSON line of what it tried and saw.

Written to $PYCNI_FIGURES (default /tmp/pycni-reliability-figures.jsonl); the test mount
namespace keeps /tmp shared, so the file survives the run.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

PATH = os.environ.get("PYCNI_FIGURES", "/tmp/pycni-reliability-figures.jsonl")


def record(name: str, **figures: Any) -> None:
    line = {"test": name, "long": os.environ.get("PYCNI_LONG", "") not in ("", "0"),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}
    print("FIGURES", json.dumps(line))
    try:
        with open(PATH, "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass
