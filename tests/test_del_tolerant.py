"""DEL never fails over a config value, seen through libcni (the reference cnitool, libcni v1.3).

libcni stops a DEL chain at the first plugin that fails, so a plugin whose DEL refused what its
ADD refuses would leak everything the plugins before it made: the bridge's veth, its host-local
reservation, its masquerade rules. Every key and value each plugin's ADD refuses (wrong types,
bad values, unsupported values) goes through a chain bridge + that plugin: ADD is refused with the
right code and a message naming the key and the value (the plugin's own output, kept by the
CNI_PATH wrappers), then DEL succeeds and nothing is left (kernel, store, cache, rules).
For bridge and host-local (the bridge's IPAM) a second pod added with a valid config first is
deleted with the refused one: DEL finds what exists by container ID and ifname.
Values libcni itself refuses before any plugin runs (a `dns` or `ipam` that is not an object,
an `ipam.type` that is not a string) are not here: no plugin sees them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from bandwidth_util import foreign_tbf, kinds
from cnitest import Netns
from libcni_util import (
    Daemon,
    Libcni,
    container_id,
    host_leftovers,
    leftovers,
    module_daemon,
)

pytestmark = pytest.mark.root

SUBNET = "10.244.7.0/24"
BRIDGE: dict[str, Any] = {
    "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
    "capabilities": {"mac": True, "ips": True},
    "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]]},
}
PORTMAP: dict[str, Any] = {"type": "portmap", "capabilities": {"portMappings": True}}
BANDWIDTH: dict[str, Any] = {"type": "bandwidth", "capabilities": {
    "bandwidth": True, "io.kubernetes.cri.pod-annotations": True}}
TUNING: dict[str, Any] = {"type": "tuning", "dataDir": "/run/pycni/test-tuning", "mtu": 1400}
FIREWALL: dict[str, Any] = {"type": "firewall"}
MAPPING = {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}
ANNOTATIONS = "io.kubernetes.cri.pod-annotations"


class Case(NamedTuple):
    keys: dict[str, Any]        # merged into the plugin's config (a key's value None: removed)
    cap_args: dict[str, Any]    # CAP_ARGS (runtimeConfig through the capabilities)
    code: int
    named: str                  # in the refusing plugin's message: the key and its value
    ipam_lost: bool = False     # the refused value is the IPAM's identity: DEL cannot reach it


def merged(base: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in keys.items():
        parts = key.split(".")
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return out


def ids(cases: list[Case]) -> list[str]:
    return [(json.dumps(c.keys or c.cap_args)[:60]) for c in cases]


BRIDGE_CASES = [
    Case({"bridge": 5}, {}, 7, "bridge: 5"),
    Case({"bridge": "cni 0"}, {}, 7, 'bridge "cni 0"'),
    Case({"bridge": "b" * 16}, {}, 7, "b" * 16),
    Case({"isGateway": "yes"}, {}, 7, 'isGateway: "yes"'),
    Case({"isDefaultGateway": 1}, {}, 7, "isDefaultGateway: 1"),
    Case({"forceAddress": "no"}, {}, 7, 'forceAddress: "no"'),
    Case({"ipMasq": "true"}, {}, 7, 'ipMasq: "true"'),
    Case({"ipMasqBackend": "iptables"}, {}, 2, 'ipMasqBackend "iptables"'),
    Case({"ipMasqBackend": "ebpf"}, {}, 7, 'ipMasqBackend "ebpf"'),
    Case({"ipMasqBackend": 5}, {}, 7, "ipMasqBackend: 5"),
    Case({"nonMasqueradeCIDRs": "10.244.0.0/16"}, {}, 7, 'nonMasqueradeCIDRs: "10.244.0.0/16"'),
    Case({"nonMasqueradeCIDRs": ["10.244.0.1/16"]}, {}, 7,
         'nonMasqueradeCIDRs[0] "10.244.0.1/16"'),
    Case({"nonMasqueradeCIDRs": ["fd00:10:244::/56"]}, {}, 7,
         'nonMasqueradeCIDRs[0] "fd00:10:244::/56"'),
    Case({"mtu": "1500"}, {}, 7, 'mtu: "1500"'),
    Case({"mtu": 67}, {}, 7, "mtu 67"),
    Case({"mtu": 70000}, {}, 7, "mtu 70000"),
    Case({"hairpinMode": "on"}, {}, 7, 'hairpinMode: "on"'),
    Case({"promiscMode": 1}, {}, 7, "promiscMode: 1"),
    Case({"hairpinMode": True, "promiscMode": True}, {}, 7, "promiscMode true"),
    Case({"vlan": "5"}, {}, 7, 'vlan: "5"'),
    Case({"vlan": 4095}, {}, 7, "vlan 4095"),
    Case({"vlanTrunk": {"id": 5}}, {}, 7, "vlanTrunk"),
    Case({"vlanTrunk": [{"id": "5"}]}, {}, 7, 'vlanTrunk.0.id: "5"'),
    Case({"vlanTrunk": [{"minID": 0, "maxID": 5}]}, {}, 7, "vlanTrunk[0].minID 0"),
    Case({"vlanTrunk": [{"minID": 10, "maxID": 5}]}, {}, 7, "vlanTrunk[0]"),
    Case({"vlanTrunk": [{"id": 4095}]}, {}, 7, "vlanTrunk[0].id 4095"),
    Case({"preserveDefaultVlan": "no"}, {}, 7, 'preserveDefaultVlan: "no"'),
    Case({"macspoofchk": "on"}, {}, 7, 'macspoofchk: "on"'),
    Case({"enabledad": 0}, {}, 7, "enabledad: 0"),
    Case({"disableContainerInterface": "x"}, {}, 7, 'disableContainerInterface: "x"'),
    Case({"disableContainerInterface": True}, {}, 7, "disableContainerInterface true"),
    Case({"portIsolation": "x"}, {}, 7, 'portIsolation: "x"'),
    Case({"args": {"cni": {"mac": "zz"}}}, {}, 7, 'args.cni.mac "zz"'),
    Case({"args": {"cni": {"mac": "01:00:5e:00:00:01"}}}, {}, 7, "01:00:5e:00:00:01"),
    Case({}, {"mac": "not-a-mac"}, 7, 'runtimeConfig.mac "not-a-mac"'),
    Case({"ipam.type": "../host-local"}, {}, 7, 'ipam.type "../host-local"', ipam_lost=True),
    Case({"ipam.type": "no-such-ipam"}, {}, 7, "no-such-ipam", ipam_lost=True),
]

V6 = [{"subnet": "fd07::/64"}]
HOST_LOCAL_CASES = [
    Case({"ipam.ranges": "10.0.0.0/24"}, {}, 7, 'ipam.ranges: "10.0.0.0/24"'),
    Case({"ipam.ranges": []}, {}, 7, "ipam.ranges []"),
    Case({"ipam.ranges": [[]]}, {}, 7, "ipam.ranges.0 []"),
    Case({"ipam.ranges": [[{"subnet": 5}]]}, {}, 7, "ipam.ranges.0.0.subnet: 5"),
    Case({"ipam.ranges": [[{"subnet": "10.244.7.0"}]]}, {}, 7, '"10.244.7.0"'),
    Case({"ipam.ranges": [[{"subnet": "10.244.7.1/24"}]]}, {}, 7, '"10.244.7.1/24"'),
    Case({"ipam.ranges": [[{"subnet": "10.244.7.0/31"}]]}, {}, 7, '"10.244.7.0/31"'),
    Case({"ipam.ranges": [[{"subnet": SUBNET, "gateway": "gw"}]]}, {}, 7, 'gateway "gw"'),
    Case({"ipam.ranges": [[{"subnet": SUBNET, "rangeStart": "10.9.0.1"}]]}, {}, 7,
         'rangeStart "10.9.0.1"'),
    Case({"ipam.ranges": [[{"subnet": SUBNET, "rangeStart": "10.244.7.9",
                            "rangeEnd": "10.244.7.5"}]]}, {}, 7, 'rangeEnd "10.244.7.5"'),
    Case({"ipam.ranges": [[{"subnet": SUBNET}, *V6]]}, {}, 7, '"fd07::/64"'),
    Case({"ipam.ranges": [[{"subnet": SUBNET}], [{"subnet": "10.244.7.0/25"}]]}, {}, 7,
         "overlaps"),
    Case({"ipam.routes": "0.0.0.0/0"}, {}, 7, 'ipam.routes: "0.0.0.0/0"'),
    Case({"ipam.routes": [{"dst": "default"}]}, {}, 7, 'ipam.routes.0.dst "default"'),
    Case({"ipam.routes": [{"dst": "0.0.0.0/0", "gw": "gw"}]}, {}, 7, 'ipam.routes.0.gw "gw"'),
    Case({"ipam.dataDir": 5}, {}, 7, "ipam.dataDir: 5"),
    Case({"ipam.resolvConf": "/nonexistent/resolv.conf"}, {}, 7,
         'ipam.resolvConf "/nonexistent/resolv.conf"'),
    Case({"args": {"cni": {"ips": ["ten"]}}}, {}, 7, 'args.cni.ips.0 "ten"'),
    Case({"args": {"cni": {"ips": "10.244.7.9"}}}, {}, 7, 'args.cni.ips: "10.244.7.9"'),
    Case({"args": {"cni": {"ips": ["192.0.2.9"]}}}, {}, 7, "192.0.2.9"),
    Case({}, {"ips": ["ten"]}, 7, 'runtimeConfig.ips.0 "ten"'),
]

FIREWALL_CASES = [
    Case({"backend": "iptables"}, {}, 2, 'backend "iptables"'),
    Case({"backend": "firewalld"}, {}, 2, 'backend "firewalld"'),
    Case({"backend": "ebpf"}, {}, 7, 'backend "ebpf"'),
    Case({"backend": 5}, {}, 7, "backend: 5"),
    Case({"ingressPolicy": "bogus"}, {}, 7, 'ingressPolicy "bogus"'),
    Case({"iptablesAdminChainName": "-X"}, {}, 7, 'iptablesAdminChainName "-X"'),
    Case({"firewalldZone": 3}, {}, 7, "firewalldZone: 3"),
]
PORTMAP_CASES = [
    Case({"backend": "iptables"}, {}, 2, 'backend "iptables"'),
    Case({"backend": "ebpf"}, {}, 7, 'backend "ebpf"'),
    Case({"backend": 5}, {}, 7, "backend: 5"),
    Case({"snat": "yes"}, {}, 7, 'snat: "yes"'),
    Case({"masqAll": 1}, {}, 7, "masqAll: 1"),
    Case({"markMasqBit": 32}, {}, 7, "markMasqBit: 32"),
    Case({"markMasqBit": "13"}, {}, 7, 'markMasqBit: "13"'),
    Case({"externalSetMarkChain": "KUBE MARK"}, {}, 7, 'externalSetMarkChain "KUBE MARK"'),
    Case({"externalSetMarkChain": 5}, {}, 7, "externalSetMarkChain: 5"),
    Case({"externalSetMarkChain": "KUBE-MARK-MASQ", "markMasqBit": 14}, {}, 7,
         "markMasqBit 14"),
    Case({"conditionsV4": "ip daddr 10.0.0.1"}, {}, 7, 'conditionsV4: "ip daddr 10.0.0.1"'),
    Case({"conditionsV4": ["ip daddr 1.2.3.4; flush ruleset"]}, {}, 7, "flush ruleset"),
    Case({"conditionsV4": ["meta mark set 1"]}, {}, 7, "meta mark set 1"),
    Case({"conditionsV4": ["-d", "1.2.3.4"]}, {}, 7, '"-d"'),
    Case({"conditionsV6": ["ip saddr 10.0.0.0/8"]}, {}, 7, "ip saddr 10.0.0.0/8"),
    Case({}, {"portMappings": "18080:80"}, 7, 'runtimeConfig.portMappings "18080:80"'),
    Case({}, {"portMappings": ["18080:80"]}, 7, 'runtimeConfig.portMappings[0] "18080:80"'),
    Case({}, {"portMappings": [{**MAPPING, "hostPort": 0}]}, 7, "hostPort 0"),
    Case({}, {"portMappings": [{**MAPPING, "hostPort": "18080"}]}, 7, 'hostPort "18080"'),
    Case({}, {"portMappings": [{**MAPPING, "containerPort": 65536}]}, 7,
         "containerPort 65536"),
    Case({}, {"portMappings": [{**MAPPING, "protocol": "icmp"}]}, 7, 'protocol "icmp"'),
    Case({}, {"portMappings": [{**MAPPING, "hostIP": "10.0.0.300"}]}, 7,
         'hostIP "10.0.0.300"'),
]

BANDWIDTH_CASES = [
    Case({"ingressRate": "1M", "ingressBurst": 8000}, {}, 7, 'ingressRate: "1M"'),
    Case({"ingressRate": 1.5, "ingressBurst": 8000}, {}, 7, "ingressRate: 1.5"),
    Case({"egressRate": -1, "egressBurst": 8000}, {}, 7, "egressRate: -1"),
    Case({"egressRate": 2**64, "egressBurst": 8000}, {}, 7, "egressRate: 1844674407370955"),
    Case({"ingressRate": 100000}, {}, 7, "ingressRate: 100000"),
    Case({"egressBurst": 8000}, {}, 7, "egressBurst: 8000"),
    Case({"ingressRate": 100000, "ingressBurst": 2**35}, {}, 7, f"ingressBurst: {2**35}"),
    Case({}, {"bandwidth": "1M"}, 7, 'runtimeConfig.bandwidth: "1M"'),
    Case({}, {"bandwidth": {"ingressRate": "x", "ingressBurst": 1}}, 7,
         'runtimeConfig.bandwidth.ingressRate: "x"'),
    Case({}, {"bandwidth": {"egressRate": 100000}}, 7,
         "runtimeConfig.bandwidth.egressRate: 100000"),
    Case({}, {ANNOTATIONS: "x"}, 7, f'runtimeConfig.{ANNOTATIONS} "x"'),
    Case({}, {ANNOTATIONS: {"kubernetes.io/ingress-bandwidth": "fast"}}, 7,
         'kubernetes.io/ingress-bandwidth "fast"'),
    Case({}, {ANNOTATIONS: {"kubernetes.io/egress-bandwidth": "10"}}, 7,
         'kubernetes.io/egress-bandwidth "10"'),
    Case({}, {ANNOTATIONS: {"kubernetes.io/ingress-bandwidth": "2P"}}, 7,
         'kubernetes.io/ingress-bandwidth "2P"'),
]

TUNING_CASES = [
    Case({"mtu": "1500"}, {}, 7, 'mtu: "1500"'),
    Case({"mtu": 70000}, {}, 7, "mtu 70000"),
    Case({"mac": "zz"}, {}, 7, 'mac "zz"'),
    Case({"promisc": "yes"}, {}, 7, 'promisc: "yes"'),
    Case({"allmulti": 1}, {}, 7, "allmulti: 1"),
    Case({"txQLen": -1}, {}, 7, "txQLen: -1"),
    Case({"dataDir": "relative"}, {}, 7, 'dataDir "relative"'),
    Case({"sysctl": {"kernel.hostname": "x"}}, {}, 7, 'sysctl.kernel.hostname "x"'),
    Case({"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "x"}}, {}, 7,
         'sysctl net.ipv4.conf.IFNAME.arp_notify "x"'),
    Case({"args": {"cni": {"mtu": "x"}}}, {}, 7, 'args.cni.mtu: "x"'),
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    yield from module_daemon()


@pytest.fixture
def libcni(host: Netns, daemon: Daemon, tmp_path: Path) -> Libcni:
    return Libcni(host, daemon, tmp_path)


def conflist(name: str, *plugins: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": name, "plugins": list(plugins)}


def refused(libcni: Libcni, network: str, pod: Netns, plugin: str, case: Case,
            cap_args: dict[str, Any]) -> None:
    """cnitool ADD fails, and the plugin's own last ADD said so with the case's code and a
    message naming the key and value."""
    libcni.forget_calls()
    proc = libcni.run("add", network, pod, cap_args=cap_args)
    assert proc.returncode != 0, proc.stdout
    calls = libcni.recorded(plugin, "ADD")
    assert calls and calls[-1][0] == 1, calls
    out = calls[-1][1]
    assert out["code"] == case.code and case.named in out["msg"], out
    assert case.named in proc.stderr + proc.stdout  # what libcni's caller sees


def deleted(libcni: Libcni, host: Netns, network: str, pod: Netns,
            cap_args: dict[str, Any]) -> None:
    proc = libcni.run("del", network, pod, cap_args=cap_args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert leftovers(host, pod, network) == []


def attached(pod: Netns) -> str:
    addrs = pod.addresses("eth0")
    assert [a for a in addrs if a.startswith("10.244.7.")], addrs
    return addrs[0]


@pytest.mark.parametrize("case", BRIDGE_CASES + HOST_LOCAL_CASES,
                         ids=ids(BRIDGE_CASES + HOST_LOCAL_CASES))
def test_bridge_and_host_local_refused_configs_are_deletable(libcni: Libcni, host: Netns,
                                                             netns_factory, case: Case) -> None:
    network = "deltol-bridge"
    valid, bad = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    cap = {"portMappings": [MAPPING]}
    libcni.write(conflist(network, BRIDGE, PORTMAP))
    libcni.ok("add", network, valid, cap_args=cap)
    attached(valid)
    assert any(r.get("rule", {}).get("comment") for r in host.nft_ruleset()["nftables"])

    libcni.write(conflist(network, merged(BRIDGE, case.keys), PORTMAP))
    refused(libcni, network, bad, "bridge", case, {**cap, **case.cap_args})
    assert leftovers(host, bad, network) == []  # the failed ADD undid what it did
    deleted(libcni, host, network, bad, {**cap, **case.cap_args})

    # The attachment made with the valid config, deleted with the refused one.
    proc = libcni.run("del", network, valid, cap_args={**cap, **case.cap_args})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = leftovers(host, valid, network)
    if case.ipam_lost:  # the config names no reachable IPAM: its reservation is out of reach
        assert [x for x in left if not x.startswith("reservation ")] == []
        libcni.write(conflist(network, BRIDGE, PORTMAP))
        libcni.ok("del", network, valid, cap_args=cap)
        left = leftovers(host, valid, network)
    assert left == []
    assert host_leftovers(host) == []


@pytest.mark.parametrize("plugin,base,case",
                         [("portmap", PORTMAP, c) for c in PORTMAP_CASES]
                         + [("bandwidth", BANDWIDTH, c) for c in BANDWIDTH_CASES]
                         + [("tuning", TUNING, c) for c in TUNING_CASES]
                         + [("firewall", FIREWALL, c) for c in FIREWALL_CASES],
                         ids=[f"portmap-{i}" for i in ids(PORTMAP_CASES)]
                         + [f"bandwidth-{i}" for i in ids(BANDWIDTH_CASES)]
                         + [f"tuning-{i}" for i in ids(TUNING_CASES)]
                         + [f"firewall-{i}" for i in ids(FIREWALL_CASES)])
def test_a_refusing_chained_plugin_lets_the_bridge_del_run(libcni: Libcni, host: Netns,
                                                           pod: Netns, plugin: str,
                                                           base: dict[str, Any],
                                                           case: Case) -> None:
    network = f"deltol-{plugin}"
    cap = {"portMappings": [MAPPING]} if plugin == "portmap" else {}
    cap = {**cap, **case.cap_args}
    libcni.write(conflist(network, BRIDGE, merged(base, case.keys)))
    refused(libcni, network, pod, plugin, case, cap)
    attached(pod)  # the bridge's ADD ran: libcni leaves it to the runtime's DEL
    if plugin == "tuning":  # its failed ADD put the veth's MTU back and kept no backup
        assert pod.links()["eth0"]["mtu"] == 1500
        assert list(Path(TUNING["dataDir"]).glob("*")) == []
    deleted(libcni, host, network, pod, cap)
    assert host_leftovers(host) == []


def portmap_state(host: Netns, network: str, cid: str) -> list[str]:
    """portmap's rules of this container (comment: the bare ID) in the host netns's hostport
    tables, and this attachment's record chains."""
    from cni.host import hostport

    record = hostport.record_chain(cid, network, "eth0")
    found = []
    for item in host.nft_ruleset().get("nftables", []):
        rule, chain = item.get("rule"), item.get("chain")
        if rule and rule["table"] == hostport.TABLE and rule.get("comment") == cid:
            found.append(f"rule {rule['family']} {rule['chain']}")
        if chain and chain["table"] == hostport.TABLE and chain["name"] == record:
            found.append(f"record {chain['family']} {chain['name']}")
    return found


@pytest.mark.parametrize("case", PORTMAP_CASES, ids=ids(PORTMAP_CASES))
def test_portmap_del_with_a_refused_config_removes_the_rules_a_valid_add_made(
        libcni: Libcni, host: Netns, pod: Netns, case: Case) -> None:
    """A valid ADD made portmap's DNAT and masquerade rules; a DEL through a conflist of
    portmap alone (the bridge's DEL does not run: the pod and its veth stay) with each config
    portmap's ADD refuses removes them all, and its record."""
    network = "deltol-pm-rules"
    cap = {"portMappings": [MAPPING]}
    libcni.write(conflist(network, BRIDGE, PORTMAP))
    libcni.ok("add", network, pod, cap_args=cap)
    cid = container_id(pod)
    made = portmap_state(host, network, cid)
    assert {m.split()[0] for m in made} == {"rule", "record"}, made

    libcni.write(conflist(network, merged(PORTMAP, case.keys)))
    proc = libcni.run("del", network, pod, cap_args={**cap, **case.cap_args})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert portmap_state(host, network, cid) == []
    attached(pod)  # only portmap's DEL ran

    libcni.write(conflist(network, BRIDGE, PORTMAP))  # the rest goes with the bridge's DEL
    libcni.ok("del", network, pod, cap_args=cap)
    assert leftovers(host, pod, network) == [] and host_leftovers(host) == []


def test_loopback_refuses_no_config_value(libcni: Libcni, host: Netns, pod: Netns) -> None:
    """loopback has no config keys of its own: whatever else the config carries, ADD takes it
    and DEL after it leaves nothing (lo down again)."""
    junk = {"mtu": "x", "bridge": {"a": 1}, "portMappings": "x", "ipMasq": "yes"}
    network = "deltol-loopback"
    libcni.write(conflist(network, BRIDGE, {"type": "loopback", **junk}))
    libcni.ok("add", network, pod)
    assert "UP" in pod.links()["lo"]["flags"]
    libcni.ok("del", network, pod)
    assert "UP" not in pod.links()["lo"]["flags"]
    assert leftovers(host, pod, network) == [] and host_leftovers(host) == []


SHAPED = {"ingressRate": 8_000_000, "ingressBurst": 80_000,
          "egressRate": 8_000_000, "egressBurst": 80_000}


@pytest.mark.parametrize("owned", [True, False], ids=["its-tbf", "someone-elses-tbf"])
def test_bandwidth_del_with_a_refused_config_on_a_veth_that_stays(libcni: Libcni, host: Netns,
                                                                  pod: Netns,
                                                                  owned: bool) -> None:
    """A good ADD, then a DEL whose bandwidth config its ADD would refuse, through a conflist of
    bandwidth alone (the bridge's DEL does not run: the host veth stays, as under a main plugin
    that keeps it): DEL removes the ifb, the ingress qdisc and the tbf its ADD made, and leaves
    a tbf it did not make (ADD with egress only, then someone put a tbf on the veth)."""
    network = "deltol-bw-veth"
    good = {**BANDWIDTH, **(SHAPED if owned else {k: v for k, v in SHAPED.items()
                                                   if k.startswith("egress")})}
    libcni.write(conflist(network, BRIDGE, good))
    libcni.ok("add", network, pod)
    veth = next(n for n, info in host.links().items()
                if info.get("linkinfo", {}).get("info_kind") == "veth")
    if not owned:
        foreign_tbf(host, veth)
    assert kinds(host, veth) == ["ingress", "tbf"]

    refused_conf = merged(good, {"ingressRate": "fast", "ingressBurst": 80_000})
    libcni.write(conflist(network, refused_conf))
    libcni.ok("del", network, pod)
    assert veth in host.links()  # only bandwidth's DEL ran
    assert kinds(host, veth) == (["noqueue"] if owned else ["tbf"])
    assert not [n for n in host.links() if n.startswith("bwp")]

    libcni.write(conflist(network, BRIDGE, good))  # the rest goes with the bridge's DEL
    libcni.ok("del", network, pod)
    assert leftovers(host, pod, network) == [] and host_leftovers(host) == []
