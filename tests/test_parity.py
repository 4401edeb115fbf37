"""Reference parity (the v1.9 layout): nftables naming as literal strings from the reference's
source (REFERENCE-PLUGINS.md), config defaults, and the kernel state a bridge ADD leaves.

The hashes below were worked out once by hand with hashlib, not by calling our code:
sha512("testnet")[:16] = c5964c6794a1152e, sha512("eth0:ctr1")[:16] = 7883a6f9ce71eedb;
pycni's pre-v1.9 (legacy) sha256 ones: 9afbce9f24165207, 5278a570699e58d2.
"""

from __future__ import annotations

import json

import pytest
from bridge_util import DUAL, conf, ipam_path, masq_rules, spoof_chains, sysctl

from cni import skel
from cni.host import hostport, masq, spoofchk

NET, IF, CID = "testnet", "eth0", "ctr1"
INSTANCE = "c5964c6794a1152e-7883a6f9ce71eedb"
LEGACY_INSTANCE = "9afbce9f24165207-5278a570699e58d2"


# --- naming, no kernel ---------------------------------------------------------------------

def test_masquerade_comment_is_the_references() -> None:
    assert masq.hash_for_network(NET) == "c5964c6794a1152e"
    assert masq.hash_for_instance(NET, IF, CID) == INSTANCE
    assert masq.comment(NET, IF, CID) == f"{INSTANCE}, net: testnet, if: eth0, id: ctr1"
    assert masq.legacy_instance(NET, IF, CID) == LEGACY_INSTANCE


def test_masquerade_comment_drops_quotes_and_is_cut_at_128() -> None:
    long_id = "c" * 100
    got = masq.comment(NET, IF, long_id)
    assert got == ("c5964c6794a1152e-8100f19b96691ab4, net: testnet, if: eth0, id: "
                   + "c" * 65) and len(got) == 128
    assert masq.comment(NET, 'e"th0', CID).endswith(", if: eth0, id: ctr1")


def test_spoof_check_names_are_the_references() -> None:
    assert spoofchk.ref_id(CID, IF) == "ctr1-eth0"
    assert spoofchk._chains("ctr1-eth0") == ("cni-br-iface-ctr1-eth0",
                                              "cni-br-iface-ctr1-eth0-mac")


def test_portmap_comment_is_the_bare_container_id_and_records_name_the_attachment() -> None:
    assert hostport.rule_comment("ctr1") == "ctr1"
    assert hostport.record_chain(CID, NET, IF) == f"pycni-att-{INSTANCE}"
    assert hostport.legacy_owner(CID, NET, IF) == "ctr1 testnet eth0"
    long_id = "a" * 129  # nft can't carry it; the reference fails, we use a digest
    assert hostport.rule_comment(long_id).startswith("=") and len(
        hostport.rule_comment(long_id)) == 33


def bridge_conf(**keys) -> skel.Request:
    body = {"cniVersion": "1.0.0", "name": NET, "type": "bridge", **keys}
    return skel.Request(plugin="bridge", command="ADD", container_id=CID, netns="/x",
                        ifname=IF, args=[], path=["/nonexistent"], config=body,
                        version="1.0.0", stdin=json.dumps(body).encode(), env={})


def test_vlan_keys_as_v1_9_1() -> None:
    from cni.plugins.bridge import load

    conf_ = load(bridge_conf(vlan=10, vlanTrunk=[{"minID": 20, "maxID": 22}, {"id": 30}]))
    assert conf_.vlan == 10 and conf_.vlans == [20, 21, 22, 30]  # both: PVID + tagged trunk
    assert conf_.preserveDefaultVlan is False  # v1.9.1's default
    assert load(bridge_conf(preserveDefaultVlan=True)).preserveDefaultVlan is True


# --- kernel state of a bridge ADD ----------------------------------------------------------

def add(plugins, c, pod, **kw):
    return plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path(), **kw)


@pytest.mark.root
def test_addresses_have_broadcast_and_v6_survives_link_down(plugins, host, pod,
                                                            tmp_path) -> None:
    add(plugins, conf(tmp_path, ranges=DUAL), pod)
    v4 = next(a for a in pod.ip("addr", "show", "dev", "eth0")[0]["addr_info"]
              if a.get("family") == "inet")
    assert (v4["local"], v4.get("broadcast")) == ("10.22.0.2", "10.22.0.255")
    gw = next(a for a in host.ip("addr", "show", "dev", "cni0")[0]["addr_info"]
              if a.get("family") == "inet")
    assert (gw["local"], gw.get("broadcast")) == ("10.22.0.1", "10.22.0.255")
    assert sysctl(pod, "net/ipv6/conf/eth0/keep_addr_on_down") == "1"
    pod.run("ip", "link", "set", "eth0", "down")
    assert "fd00:22::2/64" in pod.addresses("eth0")


@pytest.mark.root
def test_bridge_is_up_and_only_the_pods_veth_end_has_a_tx_queue(plugins, host, pod,
                                                                 tmp_path) -> None:
    """The host end has txqueuelen 0, the pod's eth0 the kernel's default 1000, as the
    reference leaves them: a qdisc a pod installs on its eth0 gets a real queue."""
    out = add(plugins, conf(tmp_path), pod)
    links = host.links()
    assert links["cni0"]["operstate"] == "UP"
    assert links["cni0"]["address"] == out["interfaces"][0]["mac"]
    assert host.run("cat", "/sys/class/net/cni0/addr_assign_type").stdout.strip() == "3"
    assert links[out["interfaces"][1]["name"]].get("txqlen", 0) == 0
    assert pod.links()["eth0"]["txqlen"] == 1000
    assert pod.run("cat", "/sys/class/net/eth0/tx_queue_len").stdout.strip() == "1000"


@pytest.mark.root
def test_second_network_with_its_own_default_route_is_appended(plugins, host, pod,
                                                               tmp_path) -> None:
    """Multus-style: two attachments each with a default route; the second used to fail with
    'File exists'. IPv4 keeps both routes, IPv6 makes one multipath route."""
    first = conf(tmp_path, ranges=DUAL, isDefaultGateway=True)
    second = conf(tmp_path, ranges=[[{"subnet": "10.33.0.0/24"}], [{"subnet": "fd00:33::/64"}]],
                  isDefaultGateway=True, bridge="cni1") | {"name": "second"}
    add(plugins, first, pod)
    out = add(plugins, second, pod, ifname="net1")
    v4 = sorted((r["gateway"], r["dev"]) for r in pod.ip("-4", "route", "show", "default"))
    assert v4 == [("10.22.0.1", "eth0"), ("10.33.0.1", "net1")]
    v6 = pod.ip("-6", "route", "show", "default")
    hops = sorted((h["gateway"], h["dev"]) for r in v6 for h in r.get("nexthops", [r]))
    assert hops == [("fd00:22::1", "eth0"), ("fd00:33::1", "net1")]
    plugins.ok("bridge", "CHECK", second | {"prevResult": out}, netns=pod.path,
               path=ipam_path(), ifname="net1")


# --- rules of earlier pycni releases are removed (an upgrade leaks nothing) ------------------

LEGACY_MASQ = (f"add rule inet cni_plugins_masquerade masq_checks ip saddr 10.22.0.2 ip daddr "
               f'!= 10.22.0.0/24 masquerade comment "{LEGACY_INSTANCE}, net: testnet, if: eth0, '
               'id: ctr1"')


def plant_legacy(host) -> None:
    """What pycni before the v1.9 layout left for testnet/eth0/ctr1: a sha256 masquerade rule and
    spoof-check chains named by the sha256 instance hash."""
    chain = f"cni-br-iface-{LEGACY_INSTANCE}"
    tag = f'comment "macspoofchk-{LEGACY_INSTANCE}"'
    host.run("nft", "add table inet cni_plugins_masquerade; "
             "add chain inet cni_plugins_masquerade masq_checks; " + LEGACY_MASQ)
    host.run("nft", "add table bridge nat; add chain bridge nat PREROUTING { type filter hook "
             "prerouting priority -300; policy accept; }; "
             f"add chain bridge nat {chain}; add chain bridge nat {chain}-mac; "
             f'add rule bridge nat PREROUTING iifname "vethdead0001" jump {chain} {tag}; '
             f"add rule bridge nat {chain} jump {chain}-mac {tag}; "
             f"add rule bridge nat {chain}-mac ether saddr 0a:58:0a:16:00:02 return {tag}; "
             f"add rule bridge nat {chain}-mac drop {tag}")


@pytest.mark.root
@pytest.mark.parametrize("verb", ["DEL", "GC"])
def test_legacy_masquerade_and_spoof_check_are_removed(plugins, host, netns_factory, tmp_path,
                                                       verb) -> None:
    c = conf(tmp_path, version="1.1.0", ipMasq=True, macspoofchk=True)
    keep = netns_factory("pycni-pod")
    add(plugins, c, keep, container_id="keep")
    plant_legacy(host)
    assert len(masq_rules(host)) == 2 and len(spoof_chains(host)) == 4
    if verb == "DEL":
        plugins.ok("bridge", "DEL", c, container_id=CID, netns="", path=ipam_path())
    else:
        plugins.ok("bridge", "GC", c | {"cni.dev/valid-attachments": [
            {"containerID": "keep", "ifname": "eth0"}]}, container_id="", ifname="",
            path=ipam_path())
    assert [r["comment"] for r in masq_rules(host)] == [masq.comment(NET, IF, "keep")]
    assert sorted(spoof_chains(host)) == ["cni-br-iface-keep-eth0", "cni-br-iface-keep-eth0-mac"]
    ruleset = host.run("nft", "list", "ruleset").stdout
    assert LEGACY_INSTANCE not in ruleset


@pytest.mark.root
def test_masquerade_and_spoof_check_rules_read_as_the_references(plugins, host, pod,
                                                                 tmp_path) -> None:
    add(plugins, conf(tmp_path, ipMasq=True, macspoofchk=True), pod, container_id=CID)
    assert [r["comment"] for r in masq_rules(host)] == [
        f"{INSTANCE}, net: testnet, if: eth0, id: ctr1"]
    text = host.run("nft", "list", "table", "bridge", "nat").stdout
    veth = next(n for n, link in host.links().items() if link.get("master") == "cni0")
    assert f'iifname "{veth}" jump cni-br-iface-ctr1-eth0 comment "macspoofchk-ctr1-eth0"' in text
    assert 'jump cni-br-iface-ctr1-eth0-mac comment "macspoofchk-ctr1-eth0"' in text
    assert 'drop comment "macspoofchk-ctr1-eth0"' in text
    assert "type filter hook prerouting priority dstnat; policy accept;" in text  # -300


@pytest.mark.root
def test_a_masquerade_rule_the_reference_wrote_is_kept_by_gc_and_removed_by_del(
        plugins, host, tmp_path) -> None:
    """The v1.9 reference's own rule for testnet/eth0/ctr1 (its exact text), as left by a swap."""
    c = conf(tmp_path, version="1.1.0", ipMasq=True)
    host.run("nft", "add table inet cni_plugins_masquerade; "
             "add chain inet cni_plugins_masquerade masq_checks; "
             "add rule inet cni_plugins_masquerade masq_checks ip saddr 10.22.0.9 ip daddr != "
             f'10.22.0.0/24 masquerade comment "{INSTANCE}, net: testnet, if: eth0, id: ctr1"')
    plugins.ok("bridge", "GC", c | {"cni.dev/valid-attachments": [
        {"containerID": CID, "ifname": IF}]}, container_id="", ifname="", path=ipam_path())
    assert len(masq_rules(host)) == 1
    plugins.ok("bridge", "DEL", c, container_id=CID, netns="", path=ipam_path())
    assert masq_rules(host) == []


@pytest.mark.root
def test_spoof_check_names_nft_cannot_carry_are_error_4_and_change_nothing(plugins, host, pod,
                                                                          tmp_path) -> None:
    code, out, _ = plugins.exec("bridge", "ADD", conf(tmp_path, macspoofchk=True),
                                netns=pod.path, path=ipam_path(), ifname="e#th0")
    assert code == 1 and out["code"] == 4 and "'e#th0'" in out["msg"], out
    assert "cni0" not in host.links() and "e#th0" not in pod.links()
    assert spoof_chains(host) == []


@pytest.mark.parametrize("plugin", ["loopback", "host-local", "bridge", "portmap", "bandwidth"])
def test_gc_without_valid_attachments_succeeds_in_every_plugin(plugin, tmp_path) -> None:
    """libcni's GC without args sends no list: each plugin succeeds, removes nothing, says so."""
    from cnitest import BIN

    ipam = {"type": "host-local", "subnet": "10.22.0.0/24", "dataDir": str(tmp_path)}
    body = {"cniVersion": "1.1.0", "name": NET, "type": plugin, "ipam": ipam}
    if plugin == "host-local":
        body = body | ipam | {"type": "host-local"}
        (tmp_path / NET).mkdir()
        (tmp_path / NET / "10.22.0.2").write_bytes(b"live\r\neth0")
    reply = skel.run(plugin, {"CNI_COMMAND": "GC", "CNI_PATH": str(BIN)},
                     json.dumps(body).encode())
    assert (reply.code, reply.stdout) == (0, b""), reply
    assert b"GC without cni.dev/valid-attachments" in reply.stderr
    if plugin in ("host-local", "bridge"):
        assert b"no reservation released" in reply.stderr
    if plugin == "host-local":
        assert (tmp_path / NET / "10.22.0.2").read_bytes() == b"live\r\neth0"
