"""conf/: the shipped conflists are valid, and the whole chain runs on them through pycni."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from bridge_util import host_veths, masq_rules
from cnitest import BIN, ROOT, VENV_PY, Netns

from cni.runtime.conflist import load
from cni.spec.config import parse

CONFLISTS = sorted((ROOT / "conf").glob("*.conflist"))


def test_there_is_a_kubernetes_conflist_and_a_dual_stack_one() -> None:
    names = [p.name for p in CONFLISTS]
    assert "10-pycni.conflist" in names and len(names) >= 2


@pytest.mark.parametrize("path", CONFLISTS, ids=lambda p: p.name)
def test_conflist_is_valid(path: Path) -> None:
    body = json.loads(path.read_text())
    assert body["cniVersion"] in ("1.0.0", "1.1.0")
    assert [p["type"] for p in body["plugins"]] == ["loopback", "bridge", "portmap",
                                                    "bandwidth"]
    assert load(path.parent, body["name"]).name == body["name"]
    from cni.plugins.bridge import NetConf
    conf = parse(NetConf, next(p for p in body["plugins"] if p["type"] == "bridge"))
    assert conf.ipMasq and conf.isDefaultGateway and conf.hairpinMode
    caps = {k for p in body["plugins"] for k in p.get("capabilities", {})}
    assert caps == {"portMappings", "bandwidth", "io.kubernetes.cri.pod-annotations"}


@pytest.mark.root
@pytest.mark.parametrize("path", CONFLISTS, ids=lambda p: p.name)
def test_chain_runs_on_the_conflist(path: Path, host: Netns, pod: Netns, tmp_path: Path) -> None:
    body = json.loads(path.read_text())
    for plugin in body["plugins"]:
        if plugin["type"] == "bridge":
            plugin["ipam"]["dataDir"] = str(tmp_path / "ipam")
    netconf = tmp_path / "net.d"
    netconf.mkdir()
    (netconf / path.name).write_text(json.dumps(body))
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "NETCONFPATH": str(netconf), "CNI_PATH": str(BIN),
           "PYCNI_CACHE_DIR": str(tmp_path / "cache"),
           "CAP_ARGS": json.dumps({"portMappings": [
               {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
               "bandwidth": {"ingressRate": 10_000_000, "ingressBurst": 1_000_000}})}

    def pycni(*args: str):
        return host.run(str(VENV_PY), "-m", "cni.cli", *args, cwd=ROOT, env=env)

    result = json.loads(pycni("add", body["name"], pod.path).stdout)
    gateways = [ip["gateway"] for ip in result["ips"]]
    assert len(gateways) == (2 if "dualstack" in path.name else 1)
    for gw in gateways:
        pod.run("ping", "-c1", "-W2", gw)
    assert len(masq_rules(host)) == len(gateways)
    pycni("check", body["name"], pod.path)
    pycni("del", body["name"], pod.path)
    assert host_veths(host) == [] and masq_rules(host) == []
