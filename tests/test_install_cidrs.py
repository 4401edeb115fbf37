"""`pycni install --pod-cidr --cluster-cidr`: the node's conflist on a routed cluster (what a
CRI-O node uses; containerd renders conf/pycni-containerd.conflist.tmpl itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bridge_util import masq_rules
from test_install import cli, snapshot

from cni import install as inst

DUAL = ["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "fd00:10:244:1::/64",
        "--cluster-cidr", "fd00:10:244::/56", "--cluster-cidr", "10.244.0.0/16"]


@pytest.fixture(autouse=True)
def no_daemon(tmp_path: Path, monkeypatch) -> None:
    """Install asks a running daemon of another version to hand over: never the machine's."""
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "opt" / "cni" / "bin", tmp_path / "etc" / "cni" / "net.d"


def args(bin_dir: Path, conf_dir: Path, *more: str) -> list[str]:
    return ["install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir), "--no-compile",
            *more]


def bridge_of(conflist: dict) -> dict:
    return next(p for p in conflist["plugins"] if p["type"] == "bridge")


def test_dual_stack_node_conflist_recorded_and_uninstalled(dirs) -> None:
    bin_dir, conf_dir = dirs
    code, out = cli(*args(bin_dir, conf_dir, *DUAL, "--cni-version", "1.0.0"))
    assert code == 0, out
    written = json.loads((conf_dir / inst.DEFAULT_CONFLIST).read_text())
    shipped = json.loads((inst.CONF_SRC / inst.DEFAULT_CONFLIST).read_text())
    assert [p["type"] for p in written["plugins"]] == [p["type"] for p in shipped["plugins"]]
    assert written["cniVersion"] == "1.0.0" and written["name"] == shipped["name"]
    bridge = bridge_of(written)
    assert bridge["ipam"] == {"type": "host-local", "ranges": [
        [{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]}
    assert bridge["nonMasqueradeCIDRs"] == ["10.244.0.0/16", "fd00:10:244::/56"]  # v4 first
    assert {k: v for k, v in bridge.items() if k not in ("ipam", "nonMasqueradeCIDRs")} == {
        k: v for k, v in bridge_of(shipped).items() if k != "ipam"}
    manifest = json.loads((bin_dir / inst.MANIFEST).read_text())
    assert str(conf_dir / inst.DEFAULT_CONFLIST) in {e["path"] for e in manifest["entries"]}
    # an upgrade with other options rewrites the file install recorded, without --force
    code, out = cli(*args(bin_dir, conf_dir, "--pod-cidr", "10.244.7.0/24"))
    assert code == 0, out
    bridge = bridge_of(json.loads((conf_dir / inst.DEFAULT_CONFLIST).read_text()))
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.7.0/24"}]]
    assert "nonMasqueradeCIDRs" not in bridge  # pod CIDR alone: masquerade all off the node
    code, out = cli("uninstall", "--bin-dir", str(bin_dir))
    assert code == 0 and not (conf_dir / inst.DEFAULT_CONFLIST).exists(), out


@pytest.mark.parametrize("more,named", [
    (["--pod-cidr", "10.244.1.1/24"], "'10.244.1.1/24'"),  # host bits: did you mean
    (["--pod-cidr", "10.244.1.0"], "'10.244.1.0'"),
    (["--pod-cidr", "node"], "'node'"),
    (["--pod-cidr", "fd00::%x/64"], "'fd00::%x/64': not a CIDR"),  # a scope ID
    (["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "10.244.2.0/24"], "'10.244.2.0/24'"),
    (["--pod-cidr", "10.245.1.0/24", "--cluster-cidr", "10.244.0.0/16"],
     "'10.245.1.0/24': not inside --cluster-cidr '10.244.0.0/16'"),
    (["--cluster-cidr", "10.244.0.0/16"], "--cluster-cidr needs --pod-cidr"),
    (["--pod-cidr", "10.244.1.0/24", "--cluster-cidr", "fd00:10:244::/56"],
     "'fd00:10:244::/56': no --pod-cidr of IPv6"),
    (["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "fd00:10:244:1::/64",
      "--cluster-cidr", "10.244.0.0/16"], "'fd00:10:244:1::/64': no --cluster-cidr of IPv6"),
    (["--pod-cidr", "10.244.1.0/24", "--conflist", "20-pycni-dualstack.conflist"],
     "not with --conflist '20-pycni-dualstack.conflist'"),
    (["--pod-cidr", "10.244.1.0/24", "--conflist", ""], "not with --conflist ''"),
], ids=["host-bits", "no-prefix", "word", "scope-id", "two-v4", "outside", "cluster-alone",
        "cluster-v6", "pod-v6-alone", "conflist", "no-conflist"])
def test_bad_cidrs_are_usage_errors_and_write_nothing(dirs, more, named) -> None:
    bin_dir, conf_dir = dirs
    before = snapshot(bin_dir, conf_dir)
    code, out = cli(*args(bin_dir, conf_dir, *more))
    assert code == 2 and named in out, out  # click's usage error
    assert snapshot(bin_dir, conf_dir) == before
    if "10.244.1.1/24" in more:
        assert "did you mean 10.244.1.0/24?" in out


@pytest.mark.root
def test_the_written_bridge_config_runs(dirs, plugins, host, pod, tmp_path) -> None:
    """The bridge of the conflist install writes, as written, ADDs a pod with its node's
    addresses and the cluster left unmasqueraded."""
    from bridge_util import ipam_path

    bin_dir, conf_dir = dirs
    assert cli(*args(bin_dir, conf_dir, *DUAL))[0] == 0
    conflist = json.loads((conf_dir / inst.DEFAULT_CONFLIST).read_text())
    bridge = bridge_of(conflist) | {"cniVersion": conflist["cniVersion"],
                                    "name": conflist["name"]}
    bridge["ipam"]["dataDir"] = str(tmp_path / "ipam")
    out = plugins.ok("bridge", "ADD", bridge, netns=pod.path, path=ipam_path())
    assert [ip["address"] for ip in out["ips"]] == ["10.244.1.2/24", "fd00:10:244:1::2/64"]
    sets = sorted(str(e["match"]["right"]) for r in masq_rules(host) for e in r["expr"]
                  if "match" in e and e["match"]["op"] == "!=")
    assert sets == ["{'prefix': {'addr': '10.244.0.0', 'len': 16}}",
                    "{'prefix': {'addr': 'fd00:10:244::', 'len': 56}}"]
    plugins.ok("bridge", "DEL", bridge, netns=pod.path, path=ipam_path())
