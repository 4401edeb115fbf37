"""The leak checker itself: it must see every kind of leftover, or the tests using it are blind."""

from __future__ import annotations

from pathlib import Path

import leakcheck
import pytest
from cnitest import Netns

pytestmark = pytest.mark.root


def plant_everything(host: Netns, data: Path, cache: Path) -> None:
    host.run("ip", "link", "add", "vethrl01", "type", "veth", "peer", "name", "vethrl02")
    host.run("ip", "link", "add", "bwp0123456789ab", "type", "ifb")
    host.run("tc", "qdisc", "add", "dev", "vethrl01", "root", "tbf", "rate", "1mbit",
             "burst", "10kb", "latency", "25ms")
    host.run("nft", "add table ip t; add chain ip t c; "
             "add rule ip t c ip daddr 10.1.1.1 counter comment \"rlabc-1\"")
    (data / "net").mkdir(parents=True)
    (data / "net" / "lock").write_text("")
    (data / "net" / "last_reserved_ip.0").write_text("10.1.1.2")
    (data / "net" / "10.1.1.2").write_bytes(b"rlabc-1\r\neth0")
    (cache / "results").mkdir(parents=True)
    (cache / "results" / "net-rlabc-1-eth0").write_text("{}")


def test_each_kind_of_leftover_is_reported_and_cleared(host: Netns, tmp_path: Path) -> None:
    data, cache = tmp_path / "networks", tmp_path / "cache"
    assert leakcheck.find(host, data, cache).empty()
    plant_everything(host, data, cache)
    leaks = leakcheck.find(host, data, cache)
    assert leaks.reservations == ["net/10.1.1.2=rlabc-1/eth0"]
    assert sorted(leaks.veths) == ["vethrl01", "vethrl02"]
    assert leaks.ifbs == ["bwp0123456789ab"]
    assert [q.split(":")[:2] for q in leaks.qdiscs] == [["vethrl01", "tbf"]]
    assert leaks.nft_rules == ["ip t c: rlabc-1"]
    assert leaks.cache_files == ["results/net-rlabc-1-eth0"]
    with pytest.raises(AssertionError, match="reservations"):
        leakcheck.assert_none(host, data, cache)
    # ignoring a link ignores its qdiscs too (tests that bring their own veth use this)
    assert not leakcheck.find(host, ignore_links=("vethrl01", "vethrl02")).qdiscs


def test_snapshot_sees_links_addresses_rules_and_files(host: Netns, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a")
    before = leakcheck.snapshot(host, tmp_path)
    assert before.diff(leakcheck.snapshot(host, tmp_path)) == []
    host.run("ip", "link", "add", "rlbr9", "type", "bridge")
    host.run("ip", "addr", "add", "10.9.0.1/24", "dev", "rlbr9")
    host.run("nft", "add table ip t")
    (tmp_path / "f").write_text("b")
    (tmp_path / "g").symlink_to("/etc/passwd")
    diff = before.diff(leakcheck.snapshot(host, tmp_path))
    assert "links +('rlbr9', 'bridge')" in diff
    assert "addresses +rlbr9 10.9.0.1/24" in diff
    assert "nft ruleset changed" in diff
    assert any(d.startswith("files +") and d.endswith("'-> /etc/passwd')") for d in diff)
    assert any("'b')" in d for d in diff)
