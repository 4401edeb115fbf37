"""Summarise a figures file (figures.py writes one JSON line per test) as a Markdown table.

    .venv/bin/python tests/reliability/report.py [/tmp/pycni-reliability-figures.jsonl]

One row per test name and run length, counts summed over its lines (a test that ran several
times, or several rounds, adds up); the doc's tables are written from this output.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any

from figures import PATH

# What a line's counts are called; the first one present is the row's "tried" column.
TRIED = ("kills", "lifecycles", "cases", "pods", "idle_connections")
SUMMED = TRIED + ("landed_mid_add", "errors", "successes", "repeated_dels",
                  "netns_deleted_before_del", "failures", "leaks", "duplicates", "problems",
                  "real_requests_served")
# Fields that tell apart lines one test writes under one name (its parameters).
SPLIT = ("mode", "scenario", "via")


def load(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarise(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, bool], dict[str, Any]] = {}
    for line in lines:
        label = " ".join([line["test"]] + [str(line[k]) for k in SPLIT if k in line])
        key = (label, bool(line.get("long")))
        row = rows.setdefault(key, defaultdict(int, test=label, long=key[1], runs=0,
                                               first=line.get("at", ""), last=""))
        row["runs"] += 1
        row["last"] = line.get("at", "")
        for name in SUMMED:
            if isinstance(line.get(name), int):
                row[name] += line[name]
        if isinstance(line.get("landed_by_phase"), dict):  # kills that hit a started verb
            row["landed_in_verb"] += line["landed_by_phase"].get("verb", 0)
    return list(rows.values())


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| test | long | runs | tried | landed | failures | leaks/problems | when |",
           "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["long"], r["test"])):
        tried = next((f"{r[n]} {n}" for n in TRIED if r.get(n)), "")
        landed = r.get("landed_mid_add", "") if "landed_mid_add" in r else ""
        if "landed_in_verb" in r:
            landed = f"{landed} ({r['landed_in_verb']} in the verb)"
        bad = r.get("leaks", 0) + r.get("problems", 0) + r.get("duplicates", 0)
        out.append(f"| {r['test']} | {'yes' if r['long'] else 'no'} | {r['runs']} | {tried} | "
                   f"{landed} | {r.get('failures', 0)} | {bad} | {r['first']} .. {r['last']} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else PATH
    try:
        lines = load(path)
    except FileNotFoundError:
        print(f"no figures in {path}: no test that records them ran")
        return 0
    print(table(summarise(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
