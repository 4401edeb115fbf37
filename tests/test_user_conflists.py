"""The conflists users copy, verbatim (tests/data/conflists, sources in its SOURCES.md), through
the reference cnitool (libcni v1.3) on pycni's plugins alone: ADD, CHECK, real traffic (a TCP
hostPort where the config has portmap, shaping read back where it has bandwidth, a ping
otherwise), DEL, and nothing left: links, addresses, reservations, libcni's cache, rules.

The node is the test's own host namespace, its addresses on its `lo` (TEST-NET and documentation
prefixes); each pod is a namespace the test made.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cnitest import BIN, Netns
from libcni_util import (
    REFERENCE,
    Daemon,
    Libcni,
    host_leftovers,
    leftovers,
    module_daemon,
)
from portmap_util import SERVER, Servers, ask

pytestmark = pytest.mark.root

DATA = Path(__file__).parent / "data" / "conflists"
NODE = {4: "192.0.2.30", 6: "2001:db8:30::30"}
HOST_PORT, POD_PORT = 8080, 80
MAPPINGS = [{"hostPort": HOST_PORT, "containerPort": POD_PORT, "protocol": "tcp"}]
assert "signal.alarm" in SERVER  # the pod's server never outlives the run


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    yield from module_daemon()


@pytest.fixture
def node(host: Netns) -> Netns:
    for key in ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"):
        host.run("sysctl", "-qw", key)
    host.run("ip", "addr", "add", f"{NODE[4]}/32", "dev", "lo")
    host.run("ip", "addr", "add", f"{NODE[6]}/128", "dev", "lo")
    return host


@pytest.fixture
def libcni(node: Netns, daemon: Daemon, tmp_path: Path) -> Libcni:
    return Libcni(node, daemon, tmp_path)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.stop()


def load(name: str) -> tuple[str, dict[str, Any]]:
    text = (DATA / name).read_text()
    return text, json.loads(text)


def pod_ips(result: dict[str, Any]) -> dict[int, ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    out: dict[int, Any] = {}
    for ip in result["ips"]:
        iface = ipaddress.ip_interface(ip["address"])
        out.setdefault(iface.version, iface)
    return out


def added(libcni: Libcni, name: str, pod: Netns, cap: dict[str, Any] | None = None,
          text: str | None = None) -> tuple[str, dict[str, Any]]:
    """ADD then CHECK the file `name` verbatim (or `text` made of it); -> (network, ADD's
    result). The result is in the conflist's version, and the pod holds exactly its
    addresses."""
    text, conf = (text, json.loads(text)) if text is not None else load(name)
    network = libcni.write(text)
    result = json.loads(libcni.ok("add", network, pod, cap_args=cap))
    assert result["cniVersion"] == conf["cniVersion"]
    libcni.ok("check", network, pod, cap_args=cap)
    if conf["plugins"][0]["type"] == "bridge":
        held = {ipaddress.ip_interface(a) for a in pod.addresses("eth0")}
        assert {ipaddress.ip_interface(ip["address"]) for ip in result["ips"]} <= held
    return network, result


def removed(libcni: Libcni, node: Netns, network: str, pod: Netns,
            cap: dict[str, Any] | None = None) -> None:
    assert leftovers(node, pod, network) != []  # what DEL must remove is there
    libcni.ok("del", network, pod, cap_args=cap)
    assert leftovers(node, pod, network) == []
    assert host_leftovers(node) == []


def pings(ns: Netns, address: str) -> None:
    proc = ns.run("ping", "-c", "1", "-W", "3", address, check=False)
    assert proc.returncode == 0, f"ping {address} from {ns.name}: {proc.stdout}{proc.stderr}"


def gateways(result: dict[str, Any]) -> dict[int, str]:
    return {ipaddress.ip_address(ip["gateway"]).version: ip["gateway"]
            for ip in result["ips"] if ip.get("gateway")}


def test_kubernetes_docs_hostport_example(libcni: Libcni, node: Netns, pod: Netns,
                                          servers: Servers) -> None:
    """portmap with `externalSetMarkChain: KUBE-MARK-MASQ`, cniVersion 0.4.0: the hostPort
    answers from the node, from 127.0.0.1 (route_localnet) and from the pod itself (hairpin,
    masqueraded so the reply comes back through the node)."""
    network, result = added(libcni, "k8s-hostport.conflist", pod, {"portMappings": MAPPINGS})
    pod_ip = str(pod_ips(result)[4].ip)
    servers.start(pod, "tcp", POD_PORT, "pod")
    assert ask(node, "tcp", NODE[4], HOST_PORT).split()[0] == "pod"
    localnet = node.run("sysctl", "-n", "net.ipv4.conf.cni0.route_localnet").stdout.strip()
    assert localnet == "1"  # 127.0.0.1 DNAT'ed to the pod must be routable off lo
    local = ask(node, "tcp", "127.0.0.1", HOST_PORT).split()
    assert local[0] == "pod" and local[1] != "127.0.0.1", local  # masqueraded off lo
    hairpin = ask(pod, "tcp", NODE[4], HOST_PORT).split()
    assert hairpin[0] == "pod" and hairpin[1] != pod_ip, hairpin
    assert not any("KUBE-MARK-MASQ" in str(r) for r in node.nft_ruleset()["nftables"])
    removed(libcni, node, network, pod, {"portMappings": MAPPINGS})
    assert ask(node, "tcp", NODE[4], HOST_PORT) == "REFUSED"  # the DNAT went with the DEL


def test_kubernetes_docs_bandwidth_example(libcni: Libcni, node: Netns, pod: Netns) -> None:
    """The bandwidth capability as kubelet's runtime fills it: tbf on the host veth (ingress)
    and on the ifb (egress) at the rates asked; the pod reaches the node."""
    cap = {"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 80_000,
                         "egressRate": 2_000_000, "egressBurst": 80_000}}
    network, result = added(libcni, "k8s-bandwidth.conflist", pod, cap)
    host_veth = result["interfaces"][1]["name"]
    ifb = result["interfaces"][-1]["name"]
    assert ifb.startswith("bwp")
    for dev, rate in ((host_veth, 1_000_000), (ifb, 2_000_000)):
        qdiscs = json.loads(node.run("tc", "-j", "qdisc", "show", "dev", dev).stdout)
        tbf = [q for q in qdiscs if q["kind"] == "tbf"]
        assert tbf and tbf[0]["options"]["rate"] == rate // 8, qdiscs  # tc -j: bytes/s
    pings(pod, NODE[4])
    removed(libcni, node, network, pod, cap)


def test_containerd_example_conflist(libcni: Libcni, node: Netns, pod: Netns,
                                     servers: Servers) -> None:
    """containerd's install-cni conflist: cni0 promiscuous, dual-stack ranges with default
    routes, portmap; the hostPort answers on both families."""
    network, result = added(libcni, "10-containerd-net.conflist", pod,
                            {"portMappings": MAPPINGS})
    assert set(pod_ips(result)) == {4, 6}
    assert "PROMISC" in node.links()["cni0"]["flags"]
    routes = {r["dst"] for fam in ("-4", "-6") for r in pod.ip(fam, "route", "show")}
    assert "default" in routes
    servers.start(pod, "tcp", POD_PORT, "pod")
    for family in (4, 6):
        assert ask(node, "tcp", NODE[family], HOST_PORT).split()[0] == "pod", family
        pings(pod, gateways(result)[family])
    removed(libcni, node, network, pod, {"portMappings": MAPPINGS})


@pytest.mark.parametrize("forward", ["nftables-only", "iptables-drop"])
def test_podman_default_conflist(libcni: Libcni, node: Netns, pod: Netns, servers: Servers,
                                 forward: str) -> None:
    """Debian's podman 4.3.1 default network (bridge cni-podman0, portmap, firewall, tuning),
    on a node with no iptables and on one whose iptables FORWARD drops (Docker's): ADD, CHECK,
    the hostPort answers, the pod reaches the node, the firewall's accepts are in iptables'
    FORWARD where it exists, DEL leaves nothing. The file as Debian ships it, every plugin
    pycni's own."""
    name = "87-podman-bridge.conflist"
    text, conf = load(name)
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap", "firewall", "tuning"]
    if forward == "iptables-drop":
        node.run("iptables-nft", "-P", "FORWARD", "DROP")
    network, result = added(libcni, name, pod, {"portMappings": MAPPINGS}, text=text)
    pod_ip = str(pod_ips(result)[4].ip)
    servers.start(pod, "tcp", POD_PORT, "pod")
    assert ask(node, "tcp", NODE[4], HOST_PORT).split()[0] == "pod"
    pings(pod, NODE[4])
    saved = node.run("iptables-nft-save").stdout
    assert (f"-A CNI-FORWARD -s {pod_ip}/32 -j ACCEPT" in saved) is (forward != "nftables-only")
    removed(libcni, node, network, pod, {"portMappings": MAPPINGS})
    assert pod_ip not in node.run("iptables-nft-save").stdout


@pytest.mark.parametrize("name,families", [("10-crio-bridge.conflist", (4, 6)),
                                           ("11-crio-ipv4-bridge.conflist", (4,))])
def test_crio_bridge_conflists(libcni: Libcni, node: Netns, pod: Netns, name: str,
                               families: tuple[int, ...]) -> None:
    """CRI-O's shipped bridge conflists: hairpin ports, masquerade, the pod reaches the node
    on each family it has."""
    network, result = added(libcni, name, pod)
    assert tuple(sorted(pod_ips(result))) == families
    host_veth = result["interfaces"][1]["name"]
    port = node.ip("-d", "link", "show", "dev", host_veth)[0]["linkinfo"]["info_slave_data"]
    assert port["hairpin"] is True
    for family in families:
        pings(pod, NODE[family])
        pings(node, str(pod_ips(result)[family].ip))
    removed(libcni, node, network, pod)


def test_crio_loopback_conflist(libcni: Libcni, node: Netns, pod: Netns) -> None:
    pod.run("ip", "link", "set", "lo", "down")
    network, result = added(libcni, "99-loopback.conflist", pod)
    assert [i["name"] for i in result["interfaces"]] == ["lo"]
    assert "UP" in pod.links()["lo"]["flags"]
    pings(pod, "127.0.0.1")
    libcni.ok("del", network, pod)
    assert "UP" not in pod.links()["lo"]["flags"]
    assert leftovers(node, pod, network) == [] and host_leftovers(node) == []


def shape(result: dict[str, Any]) -> dict[str, Any]:
    """A result with what differs between two runs (MACs, host veth and ifb names, which
    address of the range, the netns path) replaced by what it must look like."""
    def iface(i: dict[str, Any]) -> dict[str, Any]:
        name = i["name"]
        for prefix in ("veth", "bwp"):
            name = prefix + "*" if name.startswith(prefix) else name
        return {**i, "name": name, "mac": len(i.get("mac", "")),
                **({"sandbox": "netns"} if "sandbox" in i else {})}

    def ip(entry: dict[str, Any]) -> dict[str, Any]:
        addr = ipaddress.ip_interface(entry["address"])
        return {**entry, "address": f"{addr.network}"}

    return {**result, "interfaces": [iface(i) for i in result.get("interfaces", [])],
            "ips": [ip(e) for e in result.get("ips", [])]}


@pytest.mark.parametrize("name,cap", [
    ("k8s-hostport.conflist", {"portMappings": MAPPINGS}),
    ("k8s-bandwidth.conflist", {"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 80_000,
                                              "egressRate": 1_000_000, "egressBurst": 80_000}}),
    ("10-containerd-net.conflist", {"portMappings": MAPPINGS}),
    ("10-crio-bridge.conflist", None),
    ("11-crio-ipv4-bridge.conflist", None),
    ("99-loopback.conflist", None)])
def test_the_reference_gives_the_same_result(node: Netns, daemon: Daemon, netns_factory,
                                             tmp_path: Path, name: str,
                                             cap: dict[str, Any] | None) -> None:
    """The reference v1.9.1 plugins on the same conflist, in the same node, one pod each:
    the same result JSON but for MACs, generated names and which address of the range."""
    if "KUBE-MARK-MASQ" in (DATA / name).read_text():  # the reference's iptables jump needs
        node.run("iptables", "-t", "nat", "-N", "KUBE-MARK-MASQ")  # kube-proxy's chain
        node.run("iptables", "-t", "nat", "-A", "KUBE-MARK-MASQ", "-j", "MARK", "--or-mark",
                 "0x4000")
    results = {}
    for side, plugins in (("reference", REFERENCE), ("pycni", BIN)):
        pod = netns_factory("pycni-pod")
        libcni = Libcni(node, daemon, tmp_path / side, plugins)
        network = libcni.write((DATA / name).read_text())
        results[side] = json.loads(libcni.ok("add", network, pod, cap_args=cap))
        libcni.ok("check", network, pod, cap_args=cap)
        libcni.ok("del", network, pod, cap_args=cap)
        assert leftovers(node, pod, network) == []
    assert shape(results["pycni"]) == shape(results["reference"])
