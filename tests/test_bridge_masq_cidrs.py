"""bridge `nonMasqueradeCIDRs` (pycni's, ip-masq-agent's name): on a routed cluster the pod's
traffic to other nodes' pods keeps its source address, everything else outside the node's subnet
is masqueraded. The rule is the reference's (same table, chain, comment) with an anonymous set
of destinations; without the key it is the reference's, byte for byte, so a swap still works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bridge_util import conf, host_veths, ipam_path, masq_rules, reservations
from cnitest import Plugins
from test_bridge import add, ping, tcp_source_seen

from cni.host import masq

pytestmark = pytest.mark.root

REF19 = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "bin"
POD_RANGES = [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]
CLUSTER = ["10.244.0.0/16", "fd00:10:244::/56"]
TAG = masq.comment("testnet", "eth0", "ctr1")


def rule_lines(host) -> list[str]:
    text = host.run("nft", "list", "chain", "inet", "cni_plugins_masquerade",
                    "masq_checks").stdout
    return [line.strip() for line in text.splitlines() if "masquerade comment" in line]


@pytest.mark.parametrize("keep,v4,v6", [
    (None, "10.244.1.0/24", "fd00:10:244:1::/64"),
    # the cluster CIDRs hold the node's subnet: one prefix each; 10.96.0.0/12 joins the set
    ([*CLUSTER, "10.96.0.0/12"], "{ 10.96.0.0/12, 10.244.0.0/16 }", "fd00:10:244::/56"),
    (["10.96.0.0/12", "fd00:99::/64"], "{ 10.96.0.0/12, 10.244.1.0/24 }",
     "{ fd00:10:244:1::/64, fd00:99::/64 }"),
], ids=["no-key", "cluster", "elsewhere"])
def test_rule_text_with_and_without_the_key(plugins, host, pod, netns_factory, tmp_path, keep,
                                            v4, v6) -> None:
    extra = {} if keep is None else {"nonmasqueradecidrs": keep}  # keys match in any case
    c = conf(tmp_path, ranges=POD_RANGES, ipMasq=True, **extra)
    add(plugins, c, pod)
    assert rule_lines(host) == [
        f'ip saddr 10.244.1.2 ip daddr != {v4} masquerade comment "{TAG}"',
        f'ip6 saddr fd00:10:244:1::2 ip6 daddr != {v6} masquerade comment "{TAG}"']
    pod2 = netns_factory("pycni-pod")
    prev = plugins.ok("bridge", "ADD", c, netns=pod2.path, path=ipam_path(),
                      container_id="ctr2")
    plugins.ok("bridge", "CHECK", c | {"prevResult": prev}, netns=pod2.path, path=ipam_path(),
               container_id="ctr2")
    # CHECK holds the rule to the config: other CIDRs than ADD's are an error
    other = c | {"nonMasqueradeCIDRs": ["10.245.0.0/16"], "prevResult": prev}
    code, out, _ = plugins.exec("bridge", "CHECK", other, netns=pod2.path, path=ipam_path(),
                                container_id="ctr2")
    assert code == 1 and "masquerade rule for 10.244.1.3" in out["msg"], out
    for cid, ns in (("ctr1", pod), ("ctr2", pod2)):
        plugins.ok("bridge", "DEL", c, netns=ns.path, path=ipam_path(), container_id=cid)
    assert masq_rules(host) == [] and reservations(tmp_path) == []


def wire_remote_node(host, netns_factory):
    """A 'remote node' namespace behind the test host's uplink (192.168.77.1 - .2, fd77::1 - 2),
    holding a remote pod's addresses (10.244.2.9, fd00:10:244:2::9) and addresses of the
    outside world (10.50.0.9, fd50::9); routed both ways as BGP would route a cluster."""
    remote = netns_factory("pycni-node")
    host.run("ip", "link", "add", "uplink", "type", "veth", "peer", "name", "wan0",
             "netns", remote.name)
    for ns, dev, v4, v6 in ((host, "uplink", "192.168.77.1/24", "fd77::1/64"),
                            (remote, "wan0", "192.168.77.2/24", "fd77::2/64")):
        ns.run("ip", "addr", "add", v4, "dev", dev)
        ns.run("ip", "addr", "add", v6, "dev", dev, "nodad")
        ns.run("ip", "link", "set", dev, "up")
    for addr in ("10.244.2.9/32", "10.50.0.9/32", "fd00:10:244:2::9/128", "fd50::9/128"):
        remote.run("ip", "addr", "add", addr, "dev", "lo")
    remote.run("ip", "link", "set", "lo", "up")
    for dst, via in (("10.244.2.0/24", "192.168.77.2"), ("10.50.0.0/24", "192.168.77.2"),
                     ("fd00:10:244:2::/64", "fd77::2"), ("fd50::/64", "fd77::2")):
        host.run("ip", "route", "add", dst, "via", via)
    # the remote node routes this node's pod CIDR back (traffic not masqueraded needs it)
    remote.run("ip", "route", "add", "10.244.1.0/24", "via", "192.168.77.1")
    remote.run("ip", "route", "add", "fd00:10:244:1::/64", "via", "fd77::1")
    host.run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    return remote


def test_traffic_to_the_cluster_keeps_the_pod_source(plugins, host, pod, netns_factory,
                                                     tmp_path) -> None:
    remote = wire_remote_node(host, netns_factory)
    c = conf(tmp_path, ranges=POD_RANGES, isDefaultGateway=True, ipMasq=True,
             nonMasqueradeCIDRs=CLUSTER)
    add(plugins, c, pod)
    for dst in ("10.244.2.9", "10.50.0.9", "fd00:10:244:2::9", "fd50::9"):
        ping(pod, dst)
    assert tcp_source_seen(remote, pod, "10.244.2.9") == "10.244.1.2"
    assert tcp_source_seen(remote, pod, "10.50.0.9") == "192.168.77.1"
    assert tcp_source_seen(remote, pod, "fd00:10:244:2::9") == "fd00:10:244:1::2"
    assert tcp_source_seen(remote, pod, "fd50::9") == "fd77::1"
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert masq_rules(host) == []


@pytest.mark.parametrize("value,named", [
    ("10.244.0.0/16", 'nonMasqueradeCIDRs: "10.244.0.0/16"'),  # not a list
    (["10.244.0.0/16", 5], "nonMasqueradeCIDRs.1: 5"),
    (["10.244.0.1/16"], 'nonMasqueradeCIDRs[0] "10.244.0.1/16"'),  # host bits: a typo
    (["10.244.0.0"], 'nonMasqueradeCIDRs[0] "10.244.0.0"'),  # no prefix length
    (["10.244.0.0/33"], 'nonMasqueradeCIDRs[0] "10.244.0.0/33"'),
    (["cluster"], 'nonMasqueradeCIDRs[0] "cluster"'),
    (["10.244.0.0/16", "fd00:10:244::/56"], 'nonMasqueradeCIDRs[1] "fd00:10:244::/56"'),
], ids=["string", "number", "host-bits", "no-prefix", "prefix-33", "word", "no-v6-address"])
def test_bad_values_are_error_7_and_leave_nothing(plugins, host, pod, tmp_path, value,
                                                  named) -> None:
    c = conf(tmp_path, subnet="10.244.1.0/24", ipMasq=True, nonMasqueradeCIDRs=value)
    code, out, _ = plugins.exec("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert code == 1 and out["code"] == 7 and named in out["msg"], out
    assert host_veths(host) == [] and "eth0" not in pod.links()
    assert reservations(tmp_path) == [] and masq_rules(host) == []
    if value == ["10.244.0.1/16"]:
        assert "did you mean 10.244.0.0/16" in out["msg"]
    if "fd00:10:244::/56" not in value:  # CHECK reads the config first, as ADD
        prev = {"cniVersion": "1.0.0", "interfaces": [], "ips": []}
        code, out, _ = plugins.exec("bridge", "CHECK", c | {"prevResult": prev},
                                    netns=pod.path, path=ipam_path())
        assert code == 1 and out["code"] == 7 and named in out["msg"], out
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())  # DEL tolerates it


def test_an_ipv6_scope_id_never_reaches_nft(plugins, host, pod, tmp_path) -> None:
    """ipaddress keeps an IPv6 scope ID verbatim in a network's text; on a dual-stack network
    (so the family check passes) it is refused as not a CIDR, before anything is made."""
    value = "fd00::%x; flush ruleset/64"
    host.run("nft", "add table inet canary")
    c = conf(tmp_path, ranges=POD_RANGES, ipMasq=True, nonMasqueradeCIDRs=[value])
    code, out, _ = plugins.exec("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert code == 1 and out["code"] == 7, out
    assert f'nonMasqueradeCIDRs[0] "{value}": not a CIDR' in out["msg"], out
    assert host.run("nft", "list", "tables").stdout.split() == ["table", "inet", "canary"]
    assert host_veths(host) == [] and reservations(tmp_path) == []


@pytest.mark.parametrize("garbage", [5, "10.244.0.0/16", ["10.244.0.1/16"], ["fd00::/8"]])
def test_del_with_a_garbage_value_still_cleans(plugins, host, pod, tmp_path, garbage) -> None:
    c = conf(tmp_path, subnet="10.244.1.0/24", ipMasq=True, nonMasqueradeCIDRs=CLUSTER[:1])
    add(plugins, c, pod)
    assert rule_lines(host) == [
        f'ip saddr 10.244.1.2 ip daddr != 10.244.0.0/16 masquerade comment "{TAG}"']
    plugins.ok("bridge", "DEL", c | {"nonMasqueradeCIDRs": garbage}, netns=pod.path,
               path=ipam_path())
    assert masq_rules(host) == [] and host_veths(host) == [] and reservations(tmp_path) == []


@pytest.mark.parametrize("adder,deleter", [("ours", "ref"), ("ref", "ours")])
def test_swap_with_the_v1_9_1_reference(host, pod, netns_factory, tmp_path, adder,
                                        deleter) -> None:
    """ADD by one side, DEL by the other, the key in the config (the reference ignores it):
    the rules are found by their comment and removed, with the reservation."""
    assert (REF19 / "bridge").exists(), "shared/reference/bin must be beside the checkout"
    c = conf(tmp_path, ranges=POD_RANGES, ipMasq=True, ipMasqBackend="nftables",
             nonMasqueradeCIDRs=CLUSTER)
    sides = {"ours": {"path": ipam_path()}, "ref": {"bin_dir": REF19, "path": str(REF19)}}
    runner = Plugins(host)
    prev = runner.ok("bridge", "ADD", c, netns=pod.path, **sides[adder])
    lines = rule_lines(host)
    assert len(lines) == 2 and all(line.endswith(f'comment "{TAG}"') for line in lines)
    if adder == "ours":
        assert "{ 10.244.0.0/16 }" not in lines[0] and "!= 10.244.0.0/16" in lines[0]
    else:
        assert "!= 10.244.1.0/24" in lines[0]  # the reference's own rule
        # our CHECK reads its rules (no record of ours): as written, not what the key asks
        without = {k: v for k, v in c.items() if k != "nonMasqueradeCIDRs"}
        runner.ok("bridge", "CHECK", without | {"prevResult": prev}, netns=pod.path,
                  path=ipam_path())
        code, out, _ = runner.exec("bridge", "CHECK", c | {"prevResult": prev},
                                   netns=pod.path, path=ipam_path())
        assert code == 1 and "['10.244.1.0/24'] alone" in out["msg"], out
    runner.ok("bridge", "DEL", c, netns=pod.path, **sides[deleter])
    assert masq_rules(host) == [] and reservations(tmp_path) == []
    assert host_veths(host) == [], json.dumps(host.links())[:300]


def test_check_reads_the_set_back_without_a_record(plugins, host, pod, tmp_path) -> None:
    """A rule with a set and no record of pycni's (as after an upgrade from a release without
    records): CHECK parses the rule's set from the listing."""
    c = conf(tmp_path, ranges=POD_RANGES, ipMasq=True,
             nonMasqueradeCIDRs=["10.96.0.0/12", *CLUSTER])
    prev = add(plugins, c, pod)
    record = masq.record_chain("testnet", "eth0", "ctr1")
    host.run("nft", f"flush chain inet cni_plugins_masquerade {record}; "
             f"delete chain inet cni_plugins_masquerade {record}")
    plugins.ok("bridge", "CHECK", c | {"prevResult": prev}, netns=pod.path, path=ipam_path())
    other = c | {"nonMasqueradeCIDRs": CLUSTER, "prevResult": prev}
    code, out, _ = plugins.exec("bridge", "CHECK", other, netns=pod.path, path=ipam_path())
    assert code == 1 and "['10.244.0.0/16', '10.96.0.0/12'] alone" in out["msg"], out
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert masq_rules(host) == []
