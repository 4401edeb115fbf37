"""report.py: figures lines are summed per test and parameter, and counts land in their columns."""

from __future__ import annotations

from report import summarise, table


def test_lines_are_summed_per_test_and_mode() -> None:
    lines = [
        {"test": "daemon-kill-bridge-long", "long": True, "at": "t1", "mode": "shim",
         "kills": 100, "landed_mid_add": 40, "failures": 0, "leaks": 0},
        {"test": "daemon-kill-bridge-long", "long": True, "at": "t2", "mode": "child",
         "kills": 100, "landed_mid_add": 20, "failures": 0, "leaks": 0},
        {"test": "reboot-reboot-long", "long": True, "at": "t3", "scenario": "reboot", "pods": 30},
        {"test": "reboot-reboot-long", "long": True, "at": "t4", "scenario": "reboot", "pods": 30},
        {"test": "churn", "long": False, "at": "t5", "via": "exec", "lifecycles": 12,
         "duplicates": 1},
    ]
    rows = {r["test"]: r for r in summarise(lines)}
    assert set(rows) == {"daemon-kill-bridge-long shim", "daemon-kill-bridge-long child",
                         "reboot-reboot-long reboot", "churn exec"}
    assert rows["reboot-reboot-long reboot"]["pods"] == 60
    assert rows["reboot-reboot-long reboot"]["runs"] == 2
    md = table(list(rows.values())).splitlines()
    assert "| reboot-reboot-long reboot | yes | 2 | 60 pods |  | 0 | 0 | t3 .. t4 |" in md
    assert "| daemon-kill-bridge-long child | yes | 1 | 100 kills | 20 | 0 | 0 | t2 .. t2 |" in md
    assert "| churn exec | no | 1 | 12 lifecycles |  | 0 | 1 | t5 .. t5 |" in md  # duplicates show
