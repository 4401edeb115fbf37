"""bridge through the exec'd binary: real namespaces, real kernel state, real traffic."""

from __future__ import annotations

import json
import subprocess

import pytest
from bridge_util import (
    DUAL,
    conf,
    host_veths,
    ipam_path,
    masq_rules,
    reservations,
    slave_data,
    spoof_chains,
    sysctl,
    vlan_filtering_supported,
)
from cnitest import destroy_netns

pytestmark = pytest.mark.root




def add(plugins, c, pod, **kw):
    return plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path(), **kw)


def run(plugins, command, c, pod=None, **kw):
    return plugins.exec("bridge", command, c, netns=pod.path if pod else "", path=ipam_path(),
                        **kw)


def ping(ns, address: str, attempts: int = 10) -> None:
    """Ping until one reply (neighbour discovery and port state may need a moment)."""
    cmd = ["ping", "-c1", "-W1", address]
    for _ in range(attempts):
        if ns.run(*cmd, check=False).returncode == 0:
            return
    ns.run(*cmd)  # raises with ping's output


def no_ping(ns, address: str) -> bool:
    return ns.run("ping", "-c2", "-W1", address, check=False).returncode != 0


def addr_of(result: dict, version: int) -> str:
    return next(ip["address"].split("/")[0] for ip in result["ips"]
                if (":" in ip["address"]) == (version == 6))


# --- ADD: the result, the kernel state and traffic -------------------------------------------

def test_two_pods_ping_each_other_and_the_gateway_v4_v6(plugins, host, netns_factory,
                                                        tmp_path) -> None:
    c = conf(tmp_path, ranges=DUAL)
    a, b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    ra = add(plugins, c, a, container_id="a")
    rb = add(plugins, c, b, container_id="b")

    assert [i["name"] for i in ra["interfaces"]][::2] == ["cni0", "eth0"]
    assert ra["interfaces"][1]["name"].startswith("veth") and len(ra["interfaces"][1]["name"]) == 12
    assert ra["interfaces"][2]["sandbox"] == a.path
    assert ra["ips"] == [
        {"interface": 2, "address": "10.22.0.2/24", "gateway": "10.22.0.1"},
        {"interface": 2, "address": "fd00:22::2/64", "gateway": "fd00:22::1"}]
    assert a.addresses("eth0")[:2] == ["10.22.0.2/24", "fd00:22::2/64"]
    assert host.addresses("cni0")[0] == "10.22.0.1/24"
    assert "fd00:22::1/64" in host.addresses("cni0")
    assert sysctl(host, "net/ipv4/ip_forward") == "1"
    assert sysctl(host, "net/ipv6/conf/all/forwarding") == "1"

    for src, dst in ((a, rb), (b, ra)):
        ping(src, addr_of(dst, 4))
        ping(src, addr_of(dst, 6))
        ping(src, "10.22.0.1")
        ping(src, "fd00:22::1")


def test_kernel_state_of_a_default_add(plugins, host, pod, tmp_path) -> None:
    out = add(plugins, conf(tmp_path, isDefaultGateway=True), pod)
    veth = out["interfaces"][1]["name"]
    links = host.links()
    assert links["cni0"]["linkinfo"]["info_kind"] == "bridge"
    assert links[veth]["master"] == "cni0" and links[veth]["operstate"] == "UP"
    assert slave_data(host, veth)["state"] == "forwarding"
    assert slave_data(host, veth)["hairpin"] is False
    assert slave_data(host, veth)["isolated"] is False
    assert "PROMISC" not in links["cni0"]["flags"]
    assert sysctl(host, "net/ipv6/conf/cni0/accept_ra") == "0"
    assert sysctl(host, f"net/ipv6/conf/{veth}/accept_ra") == "0"
    assert sysctl(pod, "net/ipv6/conf/eth0/accept_dad") == "0"
    assert sysctl(pod, "net/ipv4/conf/eth0/arp_notify") == "1"
    assert links["cni0"]["address"] == out["interfaces"][0]["mac"]
    assert links[veth]["address"] == out["interfaces"][1]["mac"]
    assert pod.links()["eth0"]["address"] == out["interfaces"][2]["mac"]
    assert out["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}]
    assert {"dst": "default", "gateway": "10.22.0.1", "dev": "eth0", "flags": []}.items() <= \
        pod.ip("-4", "route", "show", "default")[0].items()


def test_bridge_mac_is_pinned_as_ports_come_and_go(plugins, host, netns_factory,
                                                   tmp_path) -> None:
    c = conf(tmp_path)
    pods = [netns_factory("pycni-pod") for _ in range(3)]
    first = add(plugins, c, pods[0], container_id="p0")["interfaces"][0]["mac"]
    add(plugins, c, pods[1], container_id="p1")
    plugins.ok("bridge", "DEL", c, container_id="p0", netns=pods[0].path, path=ipam_path())
    add(plugins, c, pods[2], container_id="p2")
    assert host.links()["cni0"]["address"] == first
    assert host.run("cat", "/sys/class/net/cni0/addr_assign_type").stdout.strip() == "3"


def test_an_unpinned_bridge_is_pinned_to_the_mac_it_has_once_the_port_joined(
        plugins, host, pod, tmp_path) -> None:
    """Another's bridge, never pinned, follows its lowest port MAC: the new port (a random
    MAC, lower than fe:ff:...) lowers it as it joins, and ADD pins the MAC it has then."""
    host.run("ip", "link", "add", "cni0", "type", "bridge")
    host.run("ip", "link", "add", "old0", "address", "fe:ff:ff:ff:ff:fe", "type", "veth",
             "peer", "name", "old1")
    host.run("ip", "link", "set", "old0", "master", "cni0", "up")
    assert host.links()["cni0"]["address"] == "fe:ff:ff:ff:ff:fe"
    assert host.run("cat", "/sys/class/net/cni0/addr_assign_type").stdout.strip() != "3"
    out = add(plugins, conf(tmp_path), pod)
    assert out["interfaces"][0] == {"name": "cni0", "mac": out["interfaces"][1]["mac"]}, out
    assert host.links()["cni0"]["address"] == out["interfaces"][1]["mac"]
    assert host.run("cat", "/sys/class/net/cni0/addr_assign_type").stdout.strip() == "3"


def test_adds_at_once_on_a_new_bridge_all_name_the_mac_it_keeps(plugins, host, netns_factory,
                                                                 tmp_path) -> None:
    """A node's first pods: ADDs at once on a bridge none has pinned yet. Each pins the MAC it
    reads just before its pin, and once one has pinned every later read is that MAC: every
    result names the bridge's MAC, and each pod's CHECK passes (an ADD that pinned the MAC it
    found before another's port lowered it left results naming a MAC the bridge no longer
    had). Rounds on a fresh bridge each."""
    from concurrent.futures import ThreadPoolExecutor

    c = conf(tmp_path)
    pods = [netns_factory("pycni-pod") for _ in range(6)]
    for round_ in range(4):
        ids = [f"r{round_}p{i}" for i in range(len(pods))]
        with ThreadPoolExecutor(len(pods)) as pool:
            outs = list(pool.map(lambda a: add(plugins, c, a[0], container_id=a[1]),
                                 zip(pods, ids, strict=True)))
        mac = host.links()["cni0"]["address"]
        assert [o["interfaces"][0]["mac"] for o in outs] == [mac] * len(pods), (round_, mac)
        for p, cid, out in zip(pods, ids, outs, strict=True):
            plugins.ok("bridge", "CHECK", {**c, "prevResult": out}, container_id=cid,
                       netns=p.path, path=ipam_path())
            plugins.ok("bridge", "DEL", c, container_id=cid, netns=p.path, path=ipam_path())
        host.run("ip", "link", "del", "cni0")


def test_an_unpinned_bridge_whose_ports_left_is_pinned_to_the_new_port(plugins, host, pod,
                                                                       tmp_path) -> None:
    """An unpinned bridge whose last port left has MAC 00:00:00:00:00:00, which no link can be
    given: ADD pins the MAC it has once the new port joined (the port's), as for a new one."""
    host.run("ip", "link", "add", "cni0", "type", "bridge")
    host.run("ip", "link", "add", "old0", "type", "veth", "peer", "name", "old1")
    host.run("ip", "link", "set", "old0", "master", "cni0")
    host.run("ip", "link", "set", "old0", "nomaster")
    assert host.links()["cni0"]["address"] == "00:00:00:00:00:00"
    out = add(plugins, conf(tmp_path), pod)
    assert out["interfaces"][0] == {"name": "cni0", "mac": out["interfaces"][1]["mac"]}, out
    assert host.links()["cni0"]["address"] == out["interfaces"][1]["mac"]
    assert host.run("cat", "/sys/class/net/cni0/addr_assign_type").stdout.strip() == "3"


def test_existing_bridge_is_kept(plugins, host, pod, tmp_path) -> None:
    host.run("ip", "link", "add", "cni0", "type", "bridge", "ageing_time", "1234")
    add(plugins, conf(tmp_path), pod)
    assert host.links()["cni0"]["linkinfo"]["info_data"]["ageing_time"] == 1234


def test_a_non_bridge_of_that_name_is_an_error(plugins, host, pod, tmp_path) -> None:
    host.run("ip", "link", "add", "cni0", "type", "veth", "peer", "name", "cni0p")
    code, out, _ = run(plugins, "ADD", conf(tmp_path), pod)
    assert code == 1 and out["msg"] == '"cni0" already exists but is not a bridge'
    assert reservations(tmp_path) == [] and "eth0" not in pod.links()


def test_mtu_on_bridge_and_both_veth_ends(plugins, host, pod, tmp_path) -> None:
    out = add(plugins, conf(tmp_path, mtu=1400), pod)
    assert host.links()["cni0"]["mtu"] == 1400
    assert host.links()[out["interfaces"][1]["name"]]["mtu"] == 1400
    assert pod.links()["eth0"]["mtu"] == 1400


def test_hairpin_mode(plugins, host, pod, tmp_path) -> None:
    out = add(plugins, conf(tmp_path, hairpinMode=True), pod)
    assert slave_data(host, out["interfaces"][1]["name"])["hairpin"] is True


def test_promisc_mode(plugins, host, pod, tmp_path) -> None:
    add(plugins, conf(tmp_path, promiscMode=True), pod)
    assert "PROMISC" in host.links()["cni0"]["flags"]


def test_port_isolation_blocks_pod_to_pod_not_gateway(plugins, host, netns_factory,
                                                      tmp_path) -> None:
    c = conf(tmp_path, portIsolation=True)
    a, b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    ra = add(plugins, c, a, container_id="a")
    rb = add(plugins, c, b, container_id="b")
    assert slave_data(host, ra["interfaces"][1]["name"])["isolated"] is True
    ping(a, "10.22.0.1")
    ping(b, "10.22.0.1")
    assert no_ping(a, addr_of(rb, 4))


def test_enabledad_sets_the_dad_sysctls(plugins, pod, tmp_path) -> None:
    add(plugins, conf(tmp_path, enabledad=True, ranges=DUAL), pod)
    assert sysctl(pod, "net/ipv6/conf/eth0/accept_dad") == "1"
    assert sysctl(pod, "net/ipv6/conf/eth0/enhanced_dad") == "1"
    # DAD has finished when ADD returns: the address is usable, not tentative.
    info = [a for a in pod.ip("-6", "addr", "show", "dev", "eth0", "scope", "global")[0]
            ["addr_info"] if a]  # `ip -j` appends an empty object here
    assert [a["local"] for a in info] == ["fd00:22::2"] and not info[0].get("tentative")


def test_gateway_address_without_and_with_force_address(plugins, host, netns_factory,
                                                        tmp_path) -> None:
    host.run("ip", "link", "add", "cni0", "type", "bridge")
    host.run("ip", "addr", "add", "10.99.0.1/24", "dev", "cni0")
    pod = netns_factory("pycni-pod")
    code, out, _ = run(plugins, "ADD", conf(tmp_path), pod)
    assert code == 1
    assert out["msg"] == ('failed to set bridge addr: "cni0" already has an IP address '
                          'different from 10.22.0.1/24')
    assert [a for a in host.addresses("cni0") if ":" not in a] == ["10.99.0.1/24"]
    # That failure came after IPAM: nothing of the attempt is left.
    assert reservations(tmp_path) == [] and host_veths(host) == []
    assert "eth0" not in pod.links()

    add(plugins, conf(tmp_path, forceAddress=True), pod)
    assert [a for a in host.addresses("cni0") if ":" not in a] == ["10.22.0.1/24"]


def test_l2_only_and_disable_container_interface(plugins, host, netns_factory,
                                                 tmp_path) -> None:
    l2 = {"cniVersion": "1.0.0", "name": "l2", "type": "bridge", "bridge": "br-l2",
          "ipam": {}}
    a, b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    out = add(plugins, l2, a, container_id="a")
    assert "ips" not in out and [i["name"] for i in out["interfaces"]][::2] == ["br-l2", "eth0"]
    assert "UP" in a.links()["eth0"]["flags"]
    out = add(plugins, l2 | {"disableContainerInterface": True}, b, container_id="b")
    assert "UP" not in b.links()["eth0"]["flags"]
    assert host.links()[out["interfaces"][1]["name"]]["master"] == "br-l2"


# --- MAC sources -----------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["runtimeConfig", "args", "CNI_ARGS"])
def test_container_mac_from_each_source(plugins, pod, tmp_path, source) -> None:
    mac = "0a:58:0a:16:00:99"
    c, kw = conf(tmp_path), {}
    if source == "runtimeConfig":
        c["runtimeConfig"] = {"mac": mac}
        c["args"] = {"cni": {"mac": "0a:58:00:00:00:01"}}
        kw["cni_args"] = "IgnoreUnknown=1;MAC=0a:58:00:00:00:02"
    elif source == "args":
        c["args"] = {"cni": {"mac": mac}}
        kw["cni_args"] = "IgnoreUnknown=1;K8S_POD_NAME=x;MAC=0a:58:00:00:00:02"
    else:
        # host-local refuses an unknown MAC key too (as the reference's does): IgnoreUnknown.
        kw["cni_args"] = f"IgnoreUnknown=true;MAC={mac.upper()}"
    out = add(plugins, c, pod, **kw)
    assert pod.links()["eth0"]["address"] == mac == out["interfaces"][2]["mac"]


def test_unknown_cni_args_are_refused_unless_ignore_unknown(plugins, host, pod,
                                                             tmp_path) -> None:
    code, out, _ = run(plugins, "ADD", conf(tmp_path), pod, cni_args="K8S_POD_NAME=web")
    assert code == 1 and out["code"] == 4 and "K8S_POD_NAME=web" in out["msg"]
    assert "cni0" not in host.links()
    add(plugins, conf(tmp_path), pod, cni_args="IgnoreUnknown=1;K8S_POD_NAME=web")


@pytest.mark.parametrize("key, c_extra, value", [
    ("runtimeConfig.mac", {"runtimeConfig": {"mac": "zz:58:0a:16:00:99"}}, "zz:58:0a:16:00:99"),
    ("args.cni.mac", {"args": {"cni": {"mac": "01:00:5e:00:00:01"}}}, "01:00:5e:00:00:01"),
])
def test_bad_mac_is_error_7_naming_key_and_value(plugins, host, pod, tmp_path, key, c_extra,
                                                  value) -> None:
    code, out, _ = run(plugins, "ADD", conf(tmp_path) | c_extra, pod)
    assert code == 1 and out["code"] == 7 and key in out["msg"] and value in out["msg"]
    assert "cni0" not in host.links()


# --- config validation -----------------------------------------------------------------------

@pytest.mark.parametrize("extra, code, needles", [
    ({"vlan": 5000}, 7, ["vlan", "5000"]),
    ({"vlan": -1}, 7, ["vlan", "-1"]),
    ({"vlanTrunk": [{"minID": 0, "maxID": 10}]}, 7, ["vlanTrunk[0].minID", "0"]),
    ({"vlanTrunk": [{"minID": 1, "maxID": 4095}]}, 7, ["vlanTrunk[0].maxID", "4095"]),
    ({"vlanTrunk": [{"minID": 20, "maxID": 10}]}, 7, ["vlanTrunk[0]", "minID is greater"]),
    ({"vlanTrunk": [{"id": 5000}]}, 7, ["vlanTrunk[0].id", "5000"]),
    ({"hairpinMode": True, "promiscMode": True}, 7, ["promiscMode", "hairpin"]),
    ({"disableContainerInterface": True}, 7, ["disableContainerInterface", "IPAM"]),
    ({"ipMasq": True, "ipMasqBackend": "iptables"}, 2, ["ipMasqBackend", '"iptables"']),
    ({"ipMasqBackend": "ebpf"}, 7, ["ipMasqBackend", '"ebpf"']),
    ({"mtu": "1400"}, 7, ["mtu", '"1400"']),
    ({"mtu": 10}, 7, ["mtu", "10"]),
    ({"isGateway": "yes"}, 7, ["isGateway", '"yes"']),
    ({"bridge": "a/b"}, 7, ["bridge", '"a/b"']),
    ({"bridge": "x" * 16}, 7, ["bridge", "x" * 16]),
])
def test_config_errors_name_key_and_value_and_change_nothing(plugins, host, pod, tmp_path,
                                                              extra, code, needles) -> None:
    rc, out, _ = run(plugins, "ADD", conf(tmp_path) | extra, pod)
    assert rc == 1 and out["code"] == code, out
    for needle in needles:
        assert needle in out["msg"], out
    assert "cni0" not in host.links() and "eth0" not in pod.links()
    assert reservations(tmp_path) == []


def bridge_vlans(host) -> dict[str, list]:
    return {e["ifname"]: e["vlans"]
            for e in json.loads(host.run("bridge", "-j", "vlan", "show").stdout)}


# --- VLANs -----------------------------------------------------------------------------------

def test_vlan_access_and_trunk_ports(plugins, host, netns_factory, tmp_path) -> None:
    a, b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    c = conf(tmp_path, vlan=100, preserveDefaultVlan=False)
    if not vlan_filtering_supported(host):
        # This kernel has no CONFIG_BRIDGE_VLAN_FILTERING: a clear error, nothing left.
        code, out, _ = run(plugins, "ADD", c, a)
        assert code == 1 and "vlan filtering is not supported" in out["msg"]
        assert "cni0" not in host.links() and reservations(tmp_path) == []
        pytest.skip("kernel built without bridge VLAN filtering")
    ra = add(plugins, c, a, container_id="a")
    veth = ra["interfaces"][1]["name"]
    assert host.links()["cni0"]["linkinfo"]["info_data"]["vlan_filtering"] == 1
    vlans = bridge_vlans(host)
    assert vlans[veth] == [{"vlan": 100, "flags": ["PVID", "Egress Untagged"]}]
    assert ra["interfaces"][3]["name"] == "cni0.100"
    trunk = conf(tmp_path, bridge="cni1", vlanTrunk=[{"minID": 200, "maxID": 202}, {"id": 300}])
    trunk["name"] = "trunknet"
    rb = add(plugins, trunk, b, container_id="b")
    vlans = bridge_vlans(host)
    got = [v["vlan"] for v in vlans[rb["interfaces"][1]["name"]]]
    # preserveDefaultVlan defaults to false (v1.9.1): VLAN 1 is taken off the trunk port
    assert {200, 201, 202, 300} == set(got)
    # preserveDefaultVlan: true keeps VLAN 1 on the port beside the access VLAN, which has PVID
    keep = conf(tmp_path, subnet="10.24.0.0/24", bridge="cni2", vlan=100,
                preserveDefaultVlan=True)
    keep["name"] = "keepnet"
    rc = add(plugins, keep, netns_factory("pycni-pod"), container_id="c")
    port = {v["vlan"]: v.get("flags", []) for v in bridge_vlans(host)[rc["interfaces"][1]["name"]]}
    assert set(port) == {1, 100} and "PVID" in port[100] and "PVID" not in port[1], port


def test_vlan_traffic_stays_in_its_vlan(plugins, host, netns_factory, tmp_path) -> None:
    """Two networks on one bridge and one subnet, VLAN 10 and VLAN 20, no gateway (so nothing
    routes between them): pods in VLAN 10 reach each other, the VLAN 20 pod reaches neither."""
    if not vlan_filtering_supported(host):
        pytest.skip("kernel built without bridge VLAN filtering")
    a, b, c = (netns_factory("pycni-pod") for _ in range(3))

    def vlan_net(name: str, vlan: int, start: str, end: str) -> dict:
        net = conf(tmp_path, ranges=[[{"subnet": "10.23.0.0/24", "rangeStart": start,
                                       "rangeEnd": end}]], vlan=vlan, isGateway=False)
        return net | {"name": name}

    ten = vlan_net("vlan10net", 10, "10.23.0.10", "10.23.0.49")
    twenty = vlan_net("vlan20net", 20, "10.23.0.50", "10.23.0.99")
    ra = add(plugins, ten, a, container_id="a")
    rb = add(plugins, ten, b, container_id="b")
    rc = add(plugins, twenty, c, container_id="c")
    vlans = bridge_vlans(host)
    assert vlans[ra["interfaces"][1]["name"]][0]["vlan"] == 10
    assert vlans[rc["interfaces"][1]["name"]][0]["vlan"] == 20
    ping(a, addr_of(rb, 4))
    ping(b, addr_of(ra, 4))
    for src, dst in ((c, ra), (c, rb), (a, rc)):
        lost = src.run("ping", "-c2", "-W1", addr_of(dst, 4), check=False)
        assert lost.returncode != 0, lost.stdout
    for net, pod, cid in ((ten, a, "a"), (ten, b, "b"), (twenty, c, "c")):
        plugins.ok("bridge", "DEL", net, netns=pod.path, path=ipam_path(), container_id=cid)
    assert reservations(tmp_path, "vlan10net") == reservations(tmp_path, "vlan20net") == []


# --- masquerade ------------------------------------------------------------------------------

def wire_outside(host, netns_factory):
    """An 'outside' namespace wired to the test host: 192.168.77.1 (host) - .2 (outside)."""
    outside = netns_factory("pycni-out")
    host.run("ip", "link", "add", "uplink", "type", "veth", "peer", "name", "wan0",
             "netns", outside.name)
    host.run("ip", "addr", "add", "192.168.77.1/24", "dev", "uplink")
    host.run("ip", "link", "set", "uplink", "up")
    outside.run("ip", "addr", "add", "192.168.77.2/24", "dev", "wan0")
    outside.run("ip", "link", "set", "wan0", "up")
    return outside


def tcp_source_seen(outside, client, address: str, port: int = 7777) -> str:
    """Connect from `client` to an ncat listener in `outside`; the peer address it saw."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", outside.name, "ncat", "-v", "-l", address, str(port)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(50):
            done = client.run("ncat", "-w", "1", "--send-only", address, str(port),
                              input="hello\n", check=False)
            if done.returncode == 0:
                break
            outside.run("sleep", "0.1")
        _, err = listener.communicate(timeout=10)
    finally:
        listener.kill()
        listener.wait()
    line = next(x for x in err.splitlines() if "Connection from" in x)  # the one without port
    seen = line.split("Connection from ")[1].rstrip(".")
    return seen if ":" in address else seen.split(":")[0]


def test_ipmasq_pod_reaches_outside_as_the_host(plugins, host, pod, netns_factory,
                                                tmp_path) -> None:
    outside = wire_outside(host, netns_factory)
    c = conf(tmp_path, isDefaultGateway=True, ipMasq=True)
    add(plugins, c, pod)
    rules = masq_rules(host)
    assert len(rules) == 1
    assert rules[0]["comment"].endswith(", net: testnet, if: eth0, id: ctr1")
    ping(pod, "192.168.77.2")
    assert tcp_source_seen(outside, pod, "192.168.77.2") == "192.168.77.1"
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert masq_rules(host) == []


def test_without_ipmasq_the_outside_cannot_answer(plugins, host, pod, netns_factory,
                                                  tmp_path) -> None:
    wire_outside(host, netns_factory)
    add(plugins, conf(tmp_path, isDefaultGateway=True), pod)
    assert masq_rules(host) == []
    assert no_ping(pod, "192.168.77.2")  # the outside has no route back to 10.22.0.0/24


# --- mac spoof check -------------------------------------------------------------------------

def test_macspoofchk_drops_frames_from_another_mac(plugins, host, pod, tmp_path) -> None:
    c = conf(tmp_path, macspoofchk=True)
    add(plugins, c, pod)
    assert len(spoof_chains(host)) == 2
    ping(pod, "10.22.0.1")
    pod.run("ip", "link", "set", "eth0", "address", "0a:58:de:ad:be:ef")
    host.run("ip", "neigh", "flush", "dev", "cni0")
    assert no_ping(pod, "10.22.0.1")
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert spoof_chains(host) == []


# --- failed ADD ------------------------------------------------------------------------------

def test_failed_add_after_ipam_leaves_nothing(plugins, host, pod, tmp_path) -> None:
    # The address IPAM hands out is already on the pod's ... bridge gateway conflicts: the
    # failure comes after the reservation, the veth and the spoof-check rules were made.
    host.run("ip", "link", "add", "cni0", "type", "bridge")
    host.run("ip", "addr", "add", "10.99.0.1/24", "dev", "cni0")
    c = conf(tmp_path, ipMasq=True, macspoofchk=True)
    code, out, _ = run(plugins, "ADD", c, pod)
    assert code == 1 and "already has an IP address" in out["msg"]
    assert reservations(tmp_path) == []
    assert host_veths(host) == [] and "eth0" not in pod.links()
    assert masq_rules(host) == [] and spoof_chains(host) == []


def test_container_interface_name_taken_is_an_error(plugins, host, pod, tmp_path) -> None:
    pod.run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    code, out, _ = run(plugins, "ADD", conf(tmp_path), pod)
    assert code == 1 and out["msg"] == "container veth name provided (eth0) already exists"
    assert host_veths(host) == [] and reservations(tmp_path) == []


# --- DEL -------------------------------------------------------------------------------------

def test_del_twice(plugins, host, pod, tmp_path) -> None:
    c = conf(tmp_path, ipMasq=True, macspoofchk=True)
    add(plugins, c, pod)
    for _ in range(2):
        plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
        assert host_veths(host) == [] and "eth0" not in pod.links()
        assert reservations(tmp_path) == [] and masq_rules(host) == []
        assert spoof_chains(host) == []
    assert "cni0" in host.links()  # the bridge is never deleted


def test_del_without_macspoofchk_still_removes_a_spoof_check(plugins, host, pod,
                                                             tmp_path) -> None:
    """The config lost macspoofchk after ADD: DEL still finds the spoof check (it looks for the
    `bridge nat` table first, then for the chains as with macspoofchk on)."""
    add(plugins, conf(tmp_path, ipMasq=True, macspoofchk=True), pod)
    assert spoof_chains(host) != []
    plugins.ok("bridge", "DEL", conf(tmp_path, ipMasq=True), netns=pod.path, path=ipam_path())
    assert spoof_chains(host) == [] and masq_rules(host) == []
    assert reservations(tmp_path) == []


def test_del_of_an_interface_the_kernel_will_not_delete_is_a_clean_error(plugins, host, pod,
                                                                         tmp_path) -> None:
    """Found by the long fuzz: DEL with CNI_IFNAME=lo was 999 with a pyroute2 traceback."""
    c = conf(tmp_path, ipMasq=True)
    add(plugins, c, pod)
    code, out, err = plugins.exec("bridge", "DEL", c, netns=pod.path, ifname="lo",
                                  path=ipam_path())
    assert code == 1 and out["code"] == 999 and "'lo'" in out["msg"], out
    assert "Traceback" not in err
    # refused at the first step: the pod's own attachment is untouched
    assert "lo" in pod.links() and "eth0" in pod.links() and len(host_veths(host)) == 1
    assert len(reservations(tmp_path)) == 1 and len(masq_rules(host)) == 1


def test_del_with_empty_netns_removes_rules_and_reservation(plugins, host, pod,
                                                            tmp_path) -> None:
    c = conf(tmp_path, ipMasq=True, macspoofchk=True)
    add(plugins, c, pod)
    plugins.ok("bridge", "DEL", c, netns="", path=ipam_path())
    assert reservations(tmp_path) == [] and masq_rules(host) == []
    assert spoof_chains(host) == []


def test_del_after_the_netns_is_gone(plugins, host, netns_factory, tmp_path) -> None:
    pod = netns_factory("pycni-pod")
    c = conf(tmp_path, ipMasq=True)
    add(plugins, c, pod)
    veths = host_veths(host)
    assert destroy_netns(pod, host) == veths  # the kernel took the pod's veth pair with it
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert reservations(tmp_path) == [] and masq_rules(host) == [] and host_veths(host) == []


def test_del_removes_only_its_own_rules(plugins, host, netns_factory, tmp_path) -> None:
    """Reference #810: rules are found by comment, never by IP."""
    c = conf(tmp_path, ipMasq=True)
    a, b = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    add(plugins, c, a, container_id="a")
    add(plugins, c, b, container_id="b")
    plugins.ok("bridge", "DEL", c, container_id="a", netns="", path=ipam_path())
    left = masq_rules(host)
    assert len(left) == 1 and left[0]["comment"].endswith("id: b")


# --- CHECK -----------------------------------------------------------------------------------

def test_check_passes_then_notices_what_went_missing(plugins, host, pod, tmp_path) -> None:
    c = conf(tmp_path, ipMasq=True, isDefaultGateway=True)
    out = add(plugins, c, pod)
    with_prev = c | {"prevResult": out}
    plugins.ok("bridge", "CHECK", with_prev, netns=pod.path, path=ipam_path())

    host.run("nft", "flush", "chain", "inet", "cni_plugins_masquerade", "masq_checks")
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and "masquerade rule for 10.22.0.2 is missing" in err["msg"]

    pod.run("ip", "route", "del", "default")
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and "0.0.0.0/0" in err["msg"]

    pod.run("ip", "addr", "flush", "dev", "eth0")
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and "10.22.0.2/24" in err["msg"]


def test_check_reports_the_links_in_order(plugins, host, pod, tmp_path) -> None:
    """CHECK's link errors: a MAC that does not match (bridge, container), a host veth off the
    bridge, a missing container veth, and the bridge's error first when both are gone."""
    c = conf(tmp_path)
    out = add(plugins, c, pod)
    with_prev = c | {"prevResult": out}
    plugins.ok("bridge", "CHECK", with_prev, netns=pod.path, path=ipam_path())
    br, veth, cont = out["interfaces"]

    def other_mac(entry: dict) -> dict:
        return {**entry, "mac": "02:00:00:00:00:99" if entry["mac"] != "02:00:00:00:00:99"
                else "02:00:00:00:00:98"}

    for i, want in ((0, "Bridge interface cni0 Mac doesn't match"),
                    (2, "Interface eth0 Mac 02:00:00:00:00:9")):
        prev = {**out, "interfaces": [other_mac(e) if j == i else e
                                      for j, e in enumerate(out["interfaces"])]}
        code, err, _ = run(plugins, "CHECK", c | {"prevResult": prev}, pod)
        assert code == 1 and err["msg"].startswith(want), err

    host.run("ip", "link", "set", veth["name"], "nomaster")
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and err["msg"] == f"Interface {veth['name']} not attached to bridge cni0"

    pod.run("ip", "link", "del", cont["name"])
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and err["msg"] == "container interface eth0 not found", err

    host.run("ip", "link", "del", br["name"])
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and err["msg"] == 'could not lookup "cni0": Link not found', err


def test_check_needs_prev_result(plugins, pod, tmp_path) -> None:
    c = conf(tmp_path)
    add(plugins, c, pod)
    code, out, _ = run(plugins, "CHECK", c, pod)
    assert code == 1 and out["msg"] == "Required prevResult missing"


_FAIL_LATE = """
import json, sys
from cni import skel
from cni.host import bridge
from cni.spec.errors import CNIError

def stuck(port, delays=(), read=None):
    raise CNIError(999, "bridge port in error state: injected")

bridge.wait_forwarding = stuck  # the last ADD step: everything else was done by then
env = json.loads(sys.argv[1])
reply = skel.run("bridge", env, sys.stdin.buffer.read())
sys.stdout.write(reply.stdout.decode())
"""


_UDEV_AFTER_PIN = """
import json, subprocess, sys
from cni import skel
from cni.host import bridge

pinned_then = bridge.set_vlans  # the step right after attach_pinned

def and_udev(*args, **kwargs):
    # What systemd-udevd's MACAddressPolicy=persistent does to a device it has just been told
    # of, when it gets there after our pin: a new address, set from outside.
    subprocess.run(["ip", "link", "set", "cni0", "address", sys.argv[2]], check=True)
    return pinned_then(*args, **kwargs)

bridge.set_vlans = and_udev
reply = skel.run("bridge", json.loads(sys.argv[1]), sys.stdin.buffer.read())
sys.stdout.write(reply.stdout.decode())
"""


def test_a_new_bridge_readdressed_after_the_pin_is_reported_as_it_ends(
        plugins, host, netns_factory, tmp_path) -> None:
    """The ADD that creates the bridge reports the address the bridge has at its end, not the
    one it pinned: on a systemd node udev may give a new device another MAC after the pin (seen
    in make vm-test: the first pod's CHECK failed on the bridge's MAC). An existing bridge's is
    the pinned one."""
    from cnitest import ROOT, VENV_PY

    c = conf(tmp_path)
    first, second = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "udev1", "CNI_NETNS": first.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": ipam_path()}
    proc = host.run(str(VENV_PY), "-c", _UDEV_AFTER_PIN, json.dumps(env), "02:00:00:5e:aa:01",
                    input=json.dumps(c), cwd=ROOT)
    out = json.loads(proc.stdout)
    assert out["interfaces"][0] == {"name": "cni0", "mac": "02:00:00:5e:aa:01"}, out
    assert host.links()["cni0"]["address"] == "02:00:00:5e:aa:01"
    plugins.ok("bridge", "CHECK", c | {"prevResult": out}, netns=first.path,
               container_id="udev1", path=ipam_path())
    again = add(plugins, c, second, container_id="udev2")
    assert again["interfaces"][0]["mac"] == "02:00:00:5e:aa:01"


def test_add_failing_at_the_last_step_undoes_rules_veth_and_reservation(
        plugins, host, pod, tmp_path) -> None:
    from cnitest import ROOT, VENV_PY

    c = conf(tmp_path, ipMasq=True, macspoofchk=True)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "late", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": ipam_path()}
    proc = host.run(str(VENV_PY), "-c", _FAIL_LATE, json.dumps(env), input=json.dumps(c),
                    cwd=ROOT, check=False)
    out = json.loads(proc.stdout)
    assert out["msg"] == "bridge port in error state: injected"
    tables = {o["table"]["name"] for o in host.nft_ruleset()["nftables"] if "table" in o}
    assert "cni_plugins_masquerade" in tables  # the rules had been made, then removed
    assert reservations(tmp_path) == [] and host_veths(host) == []
    assert "eth0" not in pod.links()
    assert masq_rules(host) == [] and spoof_chains(host) == []


COUNTED_CHECK = """
import json, os, sys
from cni import skel
from cni.host import netns
from cni.host.nsfd import setns

host, pod, path, stdin = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
setns(os.open(host, os.O_RDONLY))
sends = []
made = netns.new_socket

def counted():  # each IPRoute a request makes: count what it sends
    ipr = made()
    send = ipr.asyncore.send
    ipr.asyncore.send = lambda *a, **k: (sends.append(1), send(*a, **k))[1]
    return ipr

netns.new_socket = counted
env = {"CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod, "CNI_IFNAME": "eth0", "CNI_PATH": path,
       "CNI_COMMAND": "CHECK"}
reply = skel.run("bridge", env, stdin)
assert reply.code == 0, reply
print(len(sends))
"""


@pytest.mark.parametrize(("ranges", "routes", "want"), [
    (None, None, 2), (DUAL, None, 2), (None, [{"dst": "10.30.0.0/16"}, {"dst": "10.31.0.0/16"}], 2),
    (DUAL, [{"dst": "10.30.0.0/16"}, {"dst": "fd30::/64"}], 2)])
def test_check_reads_the_pod_veth_and_its_addresses_in_one_send(plugins, host, pod, tmp_path,
                                                                 ranges, routes, want) -> None:
    """What a CHECK sends (in-process, as a daemon's child): the pod's veth, a lookup of each
    of the result's routes (the default route of each family, and the IPAM's routes) and the
    pod's addresses in one send, whatever the number of IPs and routes; the bridge and the
    host end in one. No route dump when each lookup names its route."""
    import sys
    from pathlib import Path

    c = conf(tmp_path, ranges=ranges, isDefaultGateway=True)
    if routes is not None:
        c["ipam"]["routes"] = routes
    out = plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path(), container_id="ctr1")
    stdin = json.dumps(c | {"prevResult": out})
    root = Path(__file__).resolve().parent.parent
    counted = subprocess.run([sys.executable, "-c", COUNTED_CHECK, host.path, pod.path,
                              ipam_path(), stdin], cwd=root, capture_output=True, text=True,
                             check=False)
    assert counted.returncode == 0, counted.stderr
    assert int(counted.stdout) == want


def test_check_finds_the_routes_a_lookup_does_not_name(plugins, host, pod, tmp_path) -> None:
    """CHECK looks each result route up (ip route get fibmatch) in the pod's batch; where the
    answer is another route (a more specific one covers the address asked, the route is in a
    table no rule consults), it reads the family's routes as before: same verdicts."""
    c = conf(tmp_path, ranges=DUAL, isDefaultGateway=True)
    c["ipam"]["routes"] = [{"dst": "10.30.0.0/16"}, {"dst": "fd30::/64"}]
    out = add(plugins, c, pod)
    with_prev = c | {"prevResult": out}
    plugins.ok("bridge", "CHECK", with_prev, netns=pod.path, path=ipam_path())

    # each lookup's answer is now a more specific route, or the route is off the lookup's path
    pod.run("ip", "route", "add", "10.30.0.0/24", "via", "10.22.0.1")
    pod.run("ip", "route", "add", "0.0.0.0/8", "via", "10.22.0.1")
    pod.run("ip", "-6", "route", "add", "::/1", "via", "fd00:22::1")
    pod.run("ip", "-6", "route", "del", "fd30::/64")
    pod.run("ip", "-6", "route", "add", "fd30::/64", "via", "fd00:22::1", "table", "100")
    plugins.ok("bridge", "CHECK", with_prev, netns=pod.path, path=ipam_path())

    pod.run("ip", "route", "del", "10.30.0.0/16")
    code, err, _ = run(plugins, "CHECK", with_prev, pod)
    assert code == 1 and err["msg"] == "Failed to find route '10.30.0.0/16' in container", err


_PIN_WAIT_SHORT = """
import json, sys
from cni import skel
from cni.host import bridge

bridge.PIN_WAIT = 0.3  # (30 s by default)
reply = skel.run("bridge", json.loads(sys.argv[1]), sys.stdin.buffer.read())
sys.stdout.write(reply.stdout.decode())
"""


def test_an_add_that_waits_too_long_for_the_pin_lock_is_error_11_and_undone(
        plugins, host, pod, tmp_path) -> None:
    """Another holds the bridge's pin lock past the wait (a request stuck inside): the ADD
    fails with 11 naming the bridge and the lock, and takes back its veth and its address;
    once the lock is free the same ADD works."""
    from cnitest import ROOT, VENV_PY

    from cni.host import bridge as host_bridge

    c = conf(tmp_path)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "waits", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": ipam_path()}
    path = f"{host_bridge.PIN_LOCK_DIR}/{b'cni0'.hex()}.lock"
    with host_bridge._pinning("cni0"):
        proc = host.run(str(VENV_PY), "-c", _PIN_WAIT_SHORT, json.dumps(env),
                        input=json.dumps(c), cwd=ROOT, check=False)
    out = json.loads(proc.stdout)
    assert out["code"] == 11, out
    assert out["msg"] == (f"bridge cni0: another ADD has held its MAC pin lock {path} for "
                          "0.3s; try again later"), out
    assert reservations(tmp_path) == [] and host_veths(host) == []
    assert "eth0" not in pod.links()
    add(plugins, c, pod, container_id="waits")


@pytest.mark.root
def test_nobody_can_neither_make_nor_take_a_bridge_pin_lock() -> None:
    """/run/pycni is root's: a caller that is not root cannot make the pin lock's file, nor
    open root's to wait on it; its pin goes on unlocked (it can change no bridge anyway)."""
    import os
    import stat
    from pathlib import Path

    from test_daemon import as_nobody

    from cni.host import bridge as host_bridge

    path = Path(f"{host_bridge.PIN_LOCK_DIR}/{b'nobodybr0'.hex()}.lock")

    def pin() -> bytes:
        with host_bridge._pinning("nobodybr0"):
            return b"pinned"

    assert as_nobody(pin) == b"pinned" and not path.exists()
    try:
        with host_bridge._pinning("nobodybr0"):  # root's: made and held
            assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            assert as_nobody(pin) == b"pinned"  # no wait on root's lock: it cannot open it
    finally:
        os.unlink(path)
