"""conf/pycni-containerd.conflist.tmpl, rendered as containerd's CRI plugin renders its
conf_template (tests/data/render_conf_template.go: text/template.ParseFiles with containerd's
three fields), for one pod CIDR of either family and for two in either order: valid JSON, the
shipped conflist's shape, and a chain that runs (pycni add / del in a throwaway namespace)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from bridge_util import masq_rules
from cnitest import BIN
from rootskips import missing
from test_runtime_netns import Pycni

from cni import install as inst

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "conf" / "pycni-containerd.conflist.tmpl"
RENDERER = Path(__file__).resolve().parent / "data" / "render_conf_template.go"
V4, V6 = "10.244.1.0/24", "fd00:10:244:1::/64"
CLUSTER = {V4: "10.244.0.0/16", V6: "fd00:10:244::/56"}
CASES = {"v4": [V4], "v6": [V6], "dual": [V4, V6], "dual-v6-first": [V6, V4]}


@pytest.fixture(scope="module")
def renderer(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        missing("go (golang-go, scripts/setup.sh)")
    out = tmp_path_factory.mktemp("render") / "render_conf_template"
    subprocess.run([go, "build", "-o", str(out), str(RENDERER)], check=True,
                   capture_output=True, timeout=600)
    return out


def render(renderer: Path, cidrs: list[str]) -> dict:
    # kubelet sends the node's podCIDRs joined by ","; containerd trims each
    proc = subprocess.run([str(renderer), str(TEMPLATE), ", ".join(cidrs)], check=True,
                          capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout)


def test_the_wheel_ships_it_and_install_never_takes_it_for_a_conflist() -> None:
    assert (inst.CONF_SRC / TEMPLATE.name).read_bytes() == TEMPLATE.read_bytes()
    assert TEMPLATE.name not in inst.shipped_conflists()


@pytest.mark.parametrize("cidrs", CASES.values(), ids=CASES.keys())
def test_renders_the_shipped_conflist_with_the_node_cidrs(renderer, cidrs) -> None:
    conf = render(renderer, cidrs)
    shipped = json.loads((ROOT / "conf" / inst.DEFAULT_CONFLIST).read_text())
    bridge = next(p for p in conf["plugins"] if p["type"] == "bridge")
    assert bridge["ipam"]["ranges"] == [[{"subnet": c}] for c in cidrs]
    # only the cluster CIDRs of the node's families, IPv4 first (containerd's Routes order)
    assert bridge["nonMasqueradeCIDRs"] == [CLUSTER[c] for c in (V4, V6) if c in cidrs]
    for p in (conf, shipped):
        next(x for x in p["plugins"] if x["type"] == "bridge")["ipam"].pop("ranges")
    bridge.pop("nonMasqueradeCIDRs")
    assert conf == shipped  # everything else is the shipped conflist


@pytest.mark.root
@pytest.mark.parametrize("cidrs", CASES.values(), ids=CASES.keys())
def test_the_rendered_chain_runs(renderer, host, pod, tmp_path, cidrs) -> None:
    conf = render(renderer, cidrs)
    bridge = next(p for p in conf["plugins"] if p["type"] == "bridge")
    bridge["ipam"]["dataDir"] = str(tmp_path / "ipam")  # not the node's store
    pycni = Pycni(host, tmp_path, str(BIN))
    pycni.conflist("pycni", conf)
    result = json.loads(pycni("add", "pycni", pod.path).stdout)
    assert sorted(ip["address"] for ip in result["ips"]) == sorted(
        c.replace("0/24", "2/24").replace("::/64", "::2/64") for c in cidrs)
    kept = sorted(str(e["match"]["right"]["prefix"]["addr"]) for r in masq_rules(host)
                  for e in r["expr"] if "match" in e and e["match"]["op"] == "!=")
    assert kept == sorted(CLUSTER[c].split("/")[0] for c in cidrs)
    pycni("del", "pycni", pod.path)
    assert masq_rules(host) == [] and "eth0" not in pod.links()


# --- pycni install --cluster-cidr ... --containerd-template PATH --------------------------------

def install_template(tmp_path: Path, *more: str):
    from test_install import cli

    return cli("install", "--bin-dir", str(tmp_path / "bin"), "--conf-dir",
               str(tmp_path / "net.d"), "--no-compile", *more)


@pytest.mark.parametrize("clusters,cidrs,kept", [
    (["fd00:10:244::/56", "10.244.0.0/16"], [V6, V4], ["10.244.0.0/16", "fd00:10:244::/56"]),
    (["fd00:10:244::/56", "10.244.0.0/16"], [V6], ["fd00:10:244::/56"]),
    (["10.96.0.0/12"], [V4, V6], ["10.96.0.0/12"]),  # the cluster's v4 only: nothing for v6
    (["fd00:99::/48"], [V4], []),
], ids=["dual", "dual-cluster-v6-node", "v4-cluster-dual-node", "v6-cluster-v4-node"])
def test_install_writes_the_template_with_the_cluster_cidrs(renderer, tmp_path, monkeypatch,
                                                            clusters, cidrs, kept) -> None:
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))
    path = tmp_path / "containerd" / "pycni.tmpl"
    more = [a for c in clusters for a in ("--cluster-cidr", c)]
    code, out = install_template(tmp_path, *more, "--containerd-template", str(path))
    assert code == 0, out
    assert not (tmp_path / "net.d" / inst.DEFAULT_CONFLIST).exists()  # it would pre-empt it
    manifest = json.loads((tmp_path / "bin" / inst.MANIFEST).read_text())
    assert str(path) in {e["path"] for e in manifest["entries"]}
    conf = render(renderer, cidrs)  # the shipped one, as reference for the rest
    bridge = next(p for p in conf["plugins"] if p["type"] == "bridge")
    proc = subprocess.run([str(renderer), str(path), ",".join(cidrs)], check=True,
                          capture_output=True, text=True, timeout=60)
    mine = json.loads(proc.stdout)
    assert next(p for p in mine["plugins"] if p["type"] == "bridge")["nonMasqueradeCIDRs"] \
        == kept
    bridge["nonMasqueradeCIDRs"] = kept
    assert mine == conf
    code, out = install_template(tmp_path, "--containerd-template", str(path), *more)
    assert code == 0, out  # again: the same file, recorded
    from test_install import cli

    assert cli("uninstall", "--bin-dir", str(tmp_path / "bin"))[0] == 0
    assert not path.exists() and not path.parent.exists()


@pytest.mark.parametrize("more,named", [
    (["--pod-cidr", "10.244.1.0/24", "--cluster-cidr", "10.244.0.0/16"],
     "--pod-cidr '10.244.1.0/24': not with --containerd-template"),
    ([], "--containerd-template needs --cluster-cidr"),
    (["--cluster-cidr", "10.244.0.1/16"], "did you mean 10.244.0.0/16?"),
    (["--cluster-cidr", "10.244.0.0/16", "--conflist", "20-pycni-dualstack.conflist"],
     "not with --conflist '20-pycni-dualstack.conflist'"),
], ids=["pod-cidr", "no-cluster", "host-bits", "conflist"])
def test_install_template_refusals_write_nothing(tmp_path, more, named) -> None:
    code, out = install_template(tmp_path, "--containerd-template",
                                 str(tmp_path / "containerd" / "t.tmpl"), *more)
    assert code == 2 and named in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == []
