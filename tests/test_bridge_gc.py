"""bridge GC and STATUS (CNI 1.1.0): stale masquerade / spoof-check rules and reservations."""

from __future__ import annotations

import json

import pytest
from bridge_util import conf, ipam_path, masq_rules, reservations, spoof_chains
from cnitest import destroy_netns

from cni import skel
from cni.host import nft


def attach(cid: str, ifname: str = "eth0") -> dict:
    return {"containerID": cid, "ifname": ifname}


@pytest.mark.root
def test_gc_removes_what_is_not_valid_and_keeps_the_rest(plugins, host, netns_factory,
                                                         tmp_path) -> None:
    c = conf(tmp_path, version="1.1.0", ipMasq=True, macspoofchk=True)
    other = c | {"name": "othernet", "bridge": "cni1",
                 "ipam": c["ipam"] | {"subnet": "10.23.0.0/24"}}
    pods = {cid: netns_factory("pycni-pod") for cid in ("a", "b", "c")}
    for cid, pod in pods.items():
        plugins.ok("bridge", "ADD", c, container_id=cid, netns=pod.path, path=ipam_path())
    plugins.ok("bridge", "ADD", other, container_id="b", netns=pods["b"].path, ifname="net1",
               path=ipam_path())
    assert len(masq_rules(host)) == 4 and len(spoof_chains(host)) == 8
    destroy_netns(pods["c"], host)  # c is gone, veth too

    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
        gc_conf = c | {key: [attach("a")]}
        plugins.ok("bridge", "GC", gc_conf, container_id="", ifname="", path=ipam_path())
        comments = sorted(r["comment"].split("id: ")[1] for r in masq_rules(host))
        assert comments == ["a", "b"]  # testnet/a and othernet/b (another network's) are kept
        # A spoof check's name (<cid>-<ifname>, the reference's) carries no network: one goes
        # when it is not valid and its host veth is gone (c); b's pod is alive, so b-eth0 stays.
        assert sorted(spoof_chains(host)) == [f"cni-br-iface-{ref}{mac}" for ref in (
            "a-eth0", "b-eth0", "b-net1") for mac in ("", "-mac")]
        assert reservations(tmp_path) == ["10.22.0.2"]
        assert reservations(tmp_path, "othernet") == ["10.23.0.2"]


@pytest.mark.root
def test_gc_without_a_valid_list_removes_nothing_and_succeeds(plugins, host, netns_factory,
                                                              tmp_path) -> None:
    """libcni's own GC (cnitool gc) sends no list after DELing every cached attachment: the
    reference succeeds, and so do we, removing nothing (stale and live look alike)."""
    c = conf(tmp_path, version="1.1.0", ipMasq=True, macspoofchk=True)
    for cid in ("a", "b"):
        plugins.ok("bridge", "ADD", c, container_id=cid, netns=netns_factory("pycni-pod").path,
                   path=ipam_path())
    before = (masq_rules(host), spoof_chains(host), reservations(tmp_path))
    code, out, err = plugins.exec("bridge", "GC", c, container_id="", ifname="",
                                  path=ipam_path())
    assert code == 0 and out is None, out
    assert "no nftables rule removed" in err and "no reservation released" in err
    assert (masq_rules(host), spoof_chains(host), reservations(tmp_path)) == before


@pytest.mark.root
def test_gc_with_a_bad_list_removes_nothing(plugins, host, netns_factory, tmp_path) -> None:
    """Found by the long fuzz: a bad list must not be taken as empty."""
    c = conf(tmp_path, version="1.1.0", ipMasq=True, macspoofchk=True)
    for cid in ("a", "b"):
        plugins.ok("bridge", "ADD", c, container_id=cid, netns=netns_factory("pycni-pod").path,
                   path=ipam_path())
    before = (masq_rules(host), spoof_chains(host), reservations(tmp_path))
    for gc_conf, key in ((c | {"cni.dev/valid-attachments": {"a": 1}},
                          'cni.dev/valid-attachments {"a": 1}'),
                         (c | {"cni.dev/attachments": [attach("a"), {"containerID": "b"}]},
                          'cni.dev/attachments[1] {"containerID": "b"}')):
        code, out, _ = plugins.exec("bridge", "GC", gc_conf, container_id="", ifname="",
                                    path=ipam_path())
        assert code == 1 and out["code"] == 7 and key in out["msg"], out
        assert (masq_rules(host), spoof_chains(host), reservations(tmp_path)) == before


@pytest.mark.root
def test_status_delegates_to_ipam(plugins, tmp_path) -> None:
    """STATUS is ready (empty stdout) with a usable store, and is host-local's "store unusable"
    (50, naming the store) when a file sits where the store must go: bridge asked the IPAM."""
    c = conf(tmp_path, version="1.1.0", ipMasq=True)
    assert plugins.ok("bridge", "STATUS", c, container_id="", ifname="",
                      path=ipam_path()) is None  # ready: nothing on stdout
    (tmp_path / "blocker").write_text("")
    c["ipam"]["dataDir"] = str(tmp_path / "blocker" / "ipam")
    code, out, _ = plugins.exec("bridge", "STATUS", c, container_id="", ifname="",
                                path=ipam_path())
    assert code == 1 and out["code"] == 50, out
    assert "store unusable" in out["msg"] and str(tmp_path / "blocker") in out["msg"], out


def test_status_is_50_when_nftables_is_unusable_and_ipmasq_is_set(monkeypatch,
                                                                  tmp_path) -> None:
    monkeypatch.setattr(nft, "available", lambda: (False, "libnftables is not usable: test"))
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": "/nonexistent"}
    c = {"cniVersion": "1.1.0", "name": "n", "type": "bridge", "ipMasq": True, "ipam": {}}
    reply = skel.run("bridge", env, json.dumps(c).encode())
    out = json.loads(reply.stdout)
    assert reply.code == 1 and out["code"] == 50 and "nftables" in out["msg"]
    reply = skel.run("bridge", env, json.dumps(c | {"ipMasq": False}).encode())
    assert reply.code == 0
