"""The reference Go plugins (Debian's containernetworking-plugins 1.1.1 in /usr/lib/cni) as the
oracle: the same conflist, pod by pod, through theirs and through ours (as `pycni install` puts
them), each in its own throwaway node netns. Same result JSON modulo random veth names, MACs and
netns paths; same pod addresses and routes; same store files; same reachability.

Differences from the reference (v1.9, issue 17), each FIXED (now as the reference) or
DELIBERATE (and why). Swapping binaries under live pods is tested in tests/test_swap.py (our
runner) and integration/test_cri_swap.py (containerd's CRI), the v1.9 nftables naming with
literal strings in tests/test_parity.py.
- FIXED masquerade comment: SHA-512 hashes, `<h(net)>-<h(if:cid)>, net: N, if: I, id: C`, cut
  at 128 (was SHA-256); SHA-256 rules of earlier pycni are still removed by DEL and GC.
- FIXED portmap rule comment: the bare container ID (was "<cid> <net> <ifname>", still removed).
- FIXED macspoofchk names: `cni-br-iface-<cid>-<ifname>[-mac]`, `macspoofchk-<cid>-<ifname>`
  (was a hash; old chains still removed).
- FIXED GC without cni.dev/valid-attachments (cnitool gc) succeeds in every plugin (host-local
  refused it with 7); it removes nothing.
- FIXED IPv4 addresses on the pod and the bridge carry the subnet broadcast.
- FIXED keep_addr_on_down=1 on a pod interface with an IPv6 address.
- FIXED routes are appended (NLM_F_APPEND): a second network's default route no longer fails.
- FIXED a portmap hostIP of a family the pod lacks is skipped (was error 7).
- FIXED portmap conditions: any match nftables accepts (`meta pkttype host`); statements are
  still refused (DELIBERATE: the reference pastes any text into its rules).
- FIXED the bridge is operstate UP (its MAC is pinned after the first port joins, not before);
  host veth ends have txqueuelen 0.
- DELIBERATE the pod's veth end keeps the kernel's txqueuelen 1000, as v1.9's does (1.1.1's
  has 0): a qdisc a pod installs on its eth0 gets a real queue (issue 25).
- FIXED preserveDefaultVlan defaults to false; vlan and vlanTrunk together are accepted.
- DELIBERATE masquerade and hostPorts use nftables only; the 1.1.1 oracle uses iptables, so here
  we compare traffic, not rules. Swapped under a live pod, each side's DEL leaves exactly the
  other's masquerade and hostPort rules of the pod (pycni's go with `pycni gc`, the oracle's
  iptables chains never), and each side's CHECK fails on the other's pod (pycni's at bridge, the
  oracle's at portmap). The oracle's bridge DEL of a pycni attachment fails once (its go-iptables
  misreads iptables-nft's "Chain ... does not exist"); the retry kubelet makes succeeds.
- DELIBERATE portmap keeps a record chain per attachment (`pycni-att-...`) so GC works per
  network; the reference's DEL leaves it, our next GC removes it.
- DELIBERATE GC of spoof checks goes by a missing host veth (their names carry no network); the
  masquerade GC keeps rules by hash prefix (a superset of the reference's whole-comment match).
- DELIBERATE DEL with an empty CNI_NETNS (what containerd's ctr does) leaks the reference's
  masquerade rule (containernetworking/plugins#810); ours leaves nothing.
- DELIBERATE the IPv6 gateway on the bridge skips DAD; ADD waits until the port forwards.
- DELIBERATE ADD/DEL into the plugin's own netns (unless CNI_NETNS_OVERRIDE is 1/true) fails
  with 8 before the plugin runs; the reference's skel (libcni >= 1.2, not the 1.1.1 oracle)
  checks after cmdAdd/cmdDel, so its refused ADD has already changed the host
  (tests/test_own_netns.py).
- DELIBERATE a bridge without ipam at cniVersion 0.1.0/0.2.0 is refused (7, naming cniVersion)
  before anything is made; the reference (v1.9.1 too) makes the veth, fails to print its result
  (999 "cannot convert: no valid IP addresses") and keeps the veth. An IPAM plugin that
  succeeded with an answer the bridge cannot use is DELed again (the reference keeps the
  reservation). tests/test_bridge_no_leak.py.
- FIXED result JSON as v1.9.1's: from 1.0.0 on an empty "dns" is left out (1.1.1 prints
  `"dns": {}` at 1.0.0; `as_v19` drops it from the oracle's output before comparing). Every
  plugin's result at every version is compared with v1.9.1's itself in
  test_result_shape_is_v19s.
- FIXED bandwidth speaks 0.3.0 on, as the reference; its DEL still runs at 0.1.0/0.2.0
  (DELIBERATE: the reference's refuses, and libcni would stop the DEL chain there).
- DELIBERATE loopback before 1.0.0 prints the requested version's shape (0.2.0: ip4/ip6 and dns;
  0.3.x/0.4.0: ips with "version", dns); the reference's loopback (1.1.1 and v1.9.1) prints the
  1.x shape under any cniVersion, which a 0.x reader cannot parse as its own.
- DELIBERATE tuning validates every value before it changes anything and undoes a failed ADD,
  never fails DEL over its config, removes the backup file of a pod that is gone, compares a
  sysctl's words and MACs however written in CHECK, reports the MAC in canonical form, and reads
  promisc from the link's flag (as 1.1.1; v1.9.1 reads the promiscuity count): the list and the
  tests are in cni/plugins/tuning.py and tests/test_tuning.py. v1.9.1 has no tuning binary in
  shared/reference/bin, so test_tuning compares with 1.1.1 (without txQLen, which it lacks).
- DELIBERATE firewall: `backend` "" (or "nftables") is pycni's nftables backend; "iptables" and
  "firewalld" are refused (2), any other value too (7; the reference picks one silently). pycni's
  own `inet cni_firewall` table holds the accepts and the ingressPolicy isolation (the
  reference's CNI-ISOLATION-STAGE chains are iptables'); where iptables' filter FORWARD chain
  exists, the reference's CNI-FORWARD rules are written there as well, with iptables-nft, the
  same lines in iptables-save (test_firewall). Every key is checked before any change: the
  reference's unknown ingressPolicy fails after its accepts are in, and they stay.
- the reference 1.1.1 speaks spec <= 1.0.0, so the conflists here do too (v1.9.1's comparison
  runs every version up to 1.1.0).
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clients import install, need, wait_for
from cnitest import REFERENCE_BIN, REFERENCE_PLUGINS, Netns, Plugins, delete_netns, new_netns
from diffchain import (
    Side,
    as_v19,
    host_veths,
    link_settings,
    node_links,
    normalize,
    pod_state,
    store_files,
    tbf,
)
from rootskips import missing

pytestmark = pytest.mark.root
REF19 = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "bin"
NODE_ADDR = "192.0.2.20"  # the node's own address (on its lo), for hostPort traffic


def bridge_conf(name: str, subnets: list[str], **extra: Any) -> dict[str, Any]:
    routes = [{"dst": "0.0.0.0/0" if ":" not in s else "::/0"} for s in subnets]
    return {"cniVersion": "1.0.0", "name": name, "plugins": [
        {"type": "bridge", "bridge": "cni-diff0", "isGateway": True, "ipMasq": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": s}] for s in subnets],
                  "routes": routes}},
        *extra.get("more", [])]}


@pytest.fixture(scope="module")
def our_bin(tmp_path_factory) -> Path:
    need()
    conf = {"cniVersion": "1.0.0", "name": "unused", "plugins": [{"type": "loopback"}]}
    bin_dir, _ = install(tmp_path_factory.mktemp("pycni-install"), conf)
    return bin_dir


@pytest.fixture
def sides(our_bin, tmp_path) -> Iterator[dict[str, Side]]:
    """Two nodes: "ref" runs /usr/lib/cni, "ours" runs the installed pycni."""
    need()
    if not (REFERENCE_BIN / "bridge").exists():
        missing(REFERENCE_PLUGINS)
    yield from two_nodes(REFERENCE_BIN, our_bin, tmp_path)


@pytest.fixture
def v19_sides(our_bin, tmp_path) -> Iterator[dict[str, Side]]:
    """Two nodes: "ref" runs the reference v1.9.1 (shared/reference/bin), "ours" pycni."""
    need()
    assert (REF19 / "bridge").exists(), "shared/reference/bin must be beside the checkout"
    yield from two_nodes(REF19, our_bin, tmp_path)


def two_nodes(ref_bin: Path, our_bin: Path, tmp_path: Path) -> Iterator[dict[str, Side]]:
    made: list[Netns] = []
    out = {}
    for label, bin_dir in (("ref", ref_bin), ("ours", our_bin)):
        host = new_netns(f"pycni-diff-{label}")
        made.append(host)
        host.run("ip", "addr", "add", f"{NODE_ADDR}/32", "dev", "lo")
        side = Side(label, Plugins(host, bin_dir=bin_dir), tmp_path / f"{label}-store")
        for pod in ("pod1", "pod2"):
            ns = new_netns(f"pycni-diff-{label}-{pod}")
            made.append(ns)
            side.pods[pod] = ns
        out[label] = side
    yield out
    for ns in reversed(made):
        delete_netns(ns)


def both(sides: dict[str, Side], verb: str, conflist: dict, pod: str,
         prevs: dict[str, Any] | None = None, **kw) -> dict[str, Any]:
    """Run the chain on both sides (each with its own prevResult); both must succeed; returns
    each side's output."""
    outs = {}
    for label, side in sides.items():
        prev = prevs[label] if prevs else None
        code, out = side.run(verb, conflist, pod, prev=prev, **kw)
        assert code == 0, f"{label} {verb} {pod}: {out}"
        outs[label] = out
    return outs


def same(sides: dict[str, Side], outs: dict[str, Any]) -> Any:
    ref, ours = (normalize(outs[k], sides[k]) for k in ("ref", "ours"))
    assert ours == as_v19(ref)
    return ours


def reaches(pod: Netns, addr: str) -> bool:
    proc = pod.run("ping", "-c1", "-W2", addr, check=False)
    return proc.returncode == 0


def assert_reachability(sides: dict[str, Side], targets: list[str], pod: str = "pod1") -> None:
    for side in sides.values():
        for addr in targets:
            wait_for(f"{side.label} {pod} to reach {addr}",
                     lambda side=side, addr=addr: reaches(side.pods[pod], addr), timeout=15)


# ---- loopback -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_loopback(sides, version) -> None:
    conf = {"cniVersion": version, "name": "lo-diff", "plugins": [{"type": "loopback"}]}
    outs = both(sides, "ADD", conf, "pod1")
    ref, ours = (normalize(outs[k], sides[k]) for k in ("ref", "ours"))
    assert ours["cniVersion"] == ref["cniVersion"] == version
    if version != "1.0.0":
        # Deliberate: ours converts its result to the requested version, so 0.3.x/0.4.0 ips carry
        # "version"; reference 1.1.1's loopback prints the 1.0.0 shape under any cniVersion.
        assert [ip.pop("version") for ip in ours["ips"]] == ["4", "6"]
        assert all("version" not in ip for ip in ref["ips"])
    assert ours == as_v19(ref)
    assert pod_state(sides["ours"].pods["pod1"]) == pod_state(sides["ref"].pods["pod1"])
    if version != "0.3.1":
        both(sides, "CHECK", conf, "pod1", prevs=outs)
    both(sides, "DEL", conf, "pod1", prevs=outs if version != "0.3.1" else None)
    assert pod_state(sides["ours"].pods["pod1"]) == pod_state(sides["ref"].pods["pod1"])
    assert not pod_state(sides["ours"].pods["pod1"])["links"]["lo"]["up"]


# ---- bridge + host-local --------------------------------------------------------------------


@pytest.mark.parametrize("subnets", [["10.79.0.0/24"], ["fd79::/64"],
                                     ["10.79.0.0/24", "fd79::/64"]],
                         ids=["v4", "v6", "dual-stack"])
@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_bridge_host_local(sides, subnets, version) -> None:
    conf = bridge_conf("br-diff", subnets) | {"cniVersion": version}
    results = {}
    for pod in ("pod1", "pod2"):
        outs = both(sides, "ADD", conf, pod)
        results[pod] = outs
        same(sides, outs)
        ours, ref = pod_state(sides["ours"].pods[pod]), pod_state(sides["ref"].pods[pod])
        # DELIBERATE: the pod's veth keeps the kernel's txqueuelen 1000, as v1.9's does (issue
        # 25); 1.1.1's has 0.
        assert (ours["links"]["eth0"]["txqlen"], ref["links"]["eth0"]["txqlen"]) == (1000, 0)
        ref["links"]["eth0"]["txqlen"] = 1000
        assert ours == ref
    # Same store files (names are the IPs; content "<id>\r\n<ifname>") on both sides.
    assert store_files(sides["ours"].data_dir, "br-diff") == \
        store_files(sides["ref"].data_dir, "br-diff")
    # Bridge UP, veths without a tx queue, on both nodes (addresses' brd: pod_state above).
    assert node_links(sides["ours"].plugins.host, "cni-diff0") == \
        node_links(sides["ref"].plugins.host, "cni-diff0") == {"bridge": "UP",
                                                              "veth txqlen": [0, 0]}
    # The bridge carries the gateway addresses on both nodes.
    gateways = [str(ipaddress.ip_network(s)[1]) for s in subnets]
    expected = sorted(f"{gw}/{ipaddress.ip_network(s).prefixlen}"
                      for gw, s in zip(gateways, subnets, strict=True))
    for side in sides.values():
        on_bridge = side.plugins.host.addresses("cni-diff0")
        assert sorted(a for a in on_bridge if not a.startswith("fe80")) == expected
    pod2_ips = [ip["address"].split("/")[0] for ip in results["pod2"]["ours"]["ips"]]
    assert_reachability(sides, gateways + pod2_ips)
    for pod in ("pod1", "pod2"):
        both(sides, "CHECK", conf, pod, prevs=results[pod])
    for pod in ("pod1", "pod2"):
        for label, side in sides.items():
            code, out = side.run("DEL", conf, pod, prev=results[pod][label])
            assert code == 0, out
    for side in sides.values():
        assert host_veths(side.plugins.host) == []
        assert [f for f in store_files(side.data_dir, "br-diff")
                if not f.startswith("last_reserved_ip")] == []
        assert "eth0" not in pod_state(side.pods["pod1"])["links"]


def test_host_local_alone(sides) -> None:
    """host-local exec'd directly (as an IPAM plugin is): same result and store."""
    conf = {"cniVersion": "1.0.0", "name": "hl-diff", "plugins": [{
        "type": "host-local", "ranges": [[{"subnet": "10.80.0.0/28", "rangeStart": "10.80.0.5"}],
                                         [{"subnet": "fd80::/120"}]],
        "routes": [{"dst": "0.0.0.0/0"}]}]}
    # host-local reads its keys under "ipam": wrap like a main plugin would hand it over.
    ipam = conf["plugins"][0]
    wrapped = {"cniVersion": "1.0.0", "name": "hl-diff",
               "plugins": [{"type": "host-local", "ipam": ipam}]}
    for pod in ("pod1", "pod2"):
        same(sides, both(sides, "ADD", wrapped, pod))
    assert store_files(sides["ours"].data_dir, "hl-diff") == \
        store_files(sides["ref"].data_dir, "hl-diff")
    for pod in ("pod1", "pod2"):
        both(sides, "DEL", wrapped, pod)
    assert store_files(sides["ours"].data_dir, "hl-diff") == \
        store_files(sides["ref"].data_dir, "hl-diff")


# ---- portmap --------------------------------------------------------------------------------


class Httpd:
    """busybox httpd in a pod netns, killed at the end."""

    def __init__(self, pod: Netns, root: Path, body: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text(body)
        self.proc = subprocess.Popen(["ip", "netns", "exec", pod.name, "busybox", "httpd", "-f",
                                      "-p", "80", "-h", str(root)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def http_get(host: Netns, addr: str, port: int) -> str:
    proc = host.run("curl", "-sS", "--max-time", "3", f"http://{addr}:{port}/", check=False)
    return proc.stdout if proc.returncode == 0 else ""


def test_portmap(sides, tmp_path) -> None:
    need("curl", "iptables")
    conf = bridge_conf("pm-diff", ["10.81.0.0/24"], more=[
        {"type": "portmap", "capabilities": {"portMappings": True}}])
    cap = {"portMappings": [{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}]}
    outs = both(sides, "ADD", conf, "pod1", cap_args=cap)
    same(sides, outs)  # portmap passes prevResult through unchanged
    servers = [Httpd(side.pods["pod1"], tmp_path / label, f"from {label}\n")
               for label, side in sides.items()]
    try:
        for label, side in sides.items():
            host = side.plugins.host
            body = wait_for(f"{label} hostPort", lambda host=host: http_get(
                host, NODE_ADDR, 18081), timeout=15)
            assert body == f"from {label}\n"
        # Deliberate: ours writes nftables rules (tagged with the container id), the reference
        # iptables chains; what we compare is the traffic above.
        assert "ctr-pod1" in sides["ours"].plugins.host.run("nft", "list", "ruleset").stdout
        # Reference 1.1.1's portmap CHECK fails on a v4-only pod ("could not check ipv6 dnat:
        # chain CNI-DN-... not found"): a reference bug, so CHECK runs on ours only.
        code, out = sides["ours"].run("CHECK", conf, "pod1", cap_args=cap, prev=outs["ours"])
        assert code == 0, out
        for label, side in sides.items():
            code, out = side.run("DEL", conf, "pod1", cap_args=cap, prev=outs[label])
            assert code == 0, out
            assert http_get(side.plugins.host, NODE_ADDR, 18081) == ""
        assert "ctr-pod1" not in sides["ours"].plugins.host.run("nft", "list", "ruleset").stdout
    finally:
        for s in servers:
            s.stop()


# ---- bandwidth ------------------------------------------------------------------------------


def test_bandwidth(sides) -> None:
    conf = bridge_conf("bw-diff", ["10.82.0.0/24"], more=[
        {"type": "bandwidth", "capabilities": {"bandwidth": True}}])
    cap = {"bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                         "egressRate": 4_000_000, "egressBurst": 400_000}}
    outs = both(sides, "ADD", conf, "pod1", cap_args=cap)
    result = same(sides, outs)
    ifb = [i["name"] for i in result["interfaces"] if i["name"].startswith("bwp")]
    assert len(ifb) == 1  # the ifb is named from sha512(network + container id): same on both
    for side in sides.values():
        host = side.plugins.host
        veth = host_veths(host)[0]["ifname"]
        assert tbf(host, veth) == tbf(sides["ref"].plugins.host, host_veths(
            sides["ref"].plugins.host)[0]["ifname"])
        assert tbf(host, ifb[0]) == tbf(sides["ref"].plugins.host, ifb[0])
        assert tbf(host, veth) and tbf(host, ifb[0])
    both(sides, "CHECK", conf, "pod1", cap_args=cap, prevs=outs)
    for label, side in sides.items():
        code, out = side.run("DEL", conf, "pod1", cap_args=cap, prev=outs[label])
        assert code == 0, out
        assert ifb[0] not in side.plugins.host.links()


# ---- tuning ---------------------------------------------------------------------------------


TXQLEN = {"ours": 1000, "ref": 0}  # the bridge's pod veth (module doc: v1.9's 1000, 1.1.1's 0)


def test_tuning(sides) -> None:
    """bridge + tuning: the MAC from runtimeConfig (capability `mac`), mtu, promisc, allmulti
    and a sysctl on the pod's eth0; same result (the new MAC in it), same link, same backup file
    (its "mac" is the veth's random one), CHECK on both, tuning's DEL restoring the same values.
    txQLen is not here: 1.1.1 has no such key (tests/test_tuning.py covers it). The sysctl names
    eth0: 1.1.1's CHECK does not substitute IFNAME (its ADD does)."""
    rp_filter = "/proc/sys/net/ipv4/conf/eth0/rp_filter"
    tuning = {"type": "tuning", "capabilities": {"mac": True}, "mtu": 1400, "promisc": True,
              "allmulti": True, "sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}}
    conf = bridge_conf("tune-diff", ["10.87.0.0/24"], more=[tuning])
    cap = {"mac": "02:87:00:00:00:01"}
    outs = both(sides, "ADD", conf, "pod1", cap_args=cap)
    same(sides, outs)
    backups = {}
    for label, side in sides.items():
        eth0 = next(i for i in outs[label]["interfaces"] if i["name"] == "eth0")
        assert eth0["mac"] == cap["mac"]
        assert link_settings(side.pods["pod1"], "eth0", (rp_filter,)) == {
            "mac": cap["mac"], "mtu": 1400, "txqlen": TXQLEN[label], "promisc": True,
            "allmulti": True, rp_filter: ["2"]}
        (path,) = (side.data_dir / "tuning").iterdir()
        assert path.name == "ctr-pod1_eth0.json"
        backups[label] = path.read_text()
    mac = '"mac": "<mac>"'
    ours, ref = (re.sub(r'"mac": "[0-9a-f:]{17}"', mac, backups[k]) for k in ("ours", "ref"))
    assert ours == ref == f'{{\n {mac},\n "promisc": false,\n "mtu": 1500,\n "allmulti": false\n}}'
    both(sides, "CHECK", conf, "pod1", cap_args=cap, prevs=outs)
    alone = conf | {"plugins": [tuning]}  # tuning's DEL alone: the veth stays to be read
    for label, side in sides.items():
        code, out = side.run("DEL", alone, "pod1", cap_args=cap, prev=outs[label])
        assert code == 0, out
        veth_mac = json.loads(backups[label])["mac"]
        assert link_settings(side.pods["pod1"], "eth0", (rp_filter,)) == {
            "mac": veth_mac, "mtu": 1500, "txqlen": TXQLEN[label], "promisc": False,
            "allmulti": False, rp_filter: ["2"]}  # sysctls are not restored, by either
        assert list((side.data_dir / "tuning").iterdir()) == []
        code, out = side.run("DEL", conf, "pod1", cap_args=cap, prev=outs[label])
        assert code == 0, out
        assert host_veths(side.plugins.host) == []


# ---- firewall -------------------------------------------------------------------------------


def outside(side: Side, made: list[Netns]) -> str:
    """A neighbour of the node (192.168.79.2) that pod traffic reaches through FORWARD."""
    host = side.plugins.host
    ns = new_netns(f"pycni-diff-{side.label}-out")
    made.append(ns)
    host.run("ip", "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns",
             ns.name)
    host.run("ip", "addr", "add", "192.168.79.1/24", "dev", "vout")
    host.run("ip", "link", "set", "vout", "up")
    ns.run("ip", "addr", "add", "192.168.79.2/24", "dev", "eth0")
    ns.run("ip", "link", "set", "eth0", "up")
    return "192.168.79.2"


def cni_forward(host: Netns) -> list[str]:
    """The CNI-FORWARD / CNI-ADMIN part of iptables-save (the reference's iptables layout)."""
    lines = host.run("iptables-save", "-t", "filter").stdout.splitlines()
    return [line for line in lines if "CNI-FORWARD" in line or "CNI-ADMIN" in line
            or "MY-ADMIN" in line]


@pytest.mark.parametrize("keys", [
    {}, {"backend": ""}, {"ingressPolicy": "open"}, {"iptablesAdminChainName": "MY-ADMIN"},
    {"firewalldZone": "trusted"}, {"ingressPolicy": "same-bridge"},
], ids=["default", "backend-empty", "open", "admin-chain", "zone", "same-bridge"])
def test_firewall(sides, keys) -> None:
    """The chain podman writes (bridge, portmap, firewall) on a node whose iptables FORWARD
    drops (as Docker leaves it): same result, the pod reaches a neighbour through FORWARD on
    both, the same CNI-FORWARD rules in iptables-save (ours: pycni's inet cni_firewall table
    as well), CHECK passes, DEL takes the pod's accepts back."""
    need("iptables")
    conf = bridge_conf("fw-diff", ["10.86.0.0/24"], more=[
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "firewall", **keys}])
    made: list[Netns] = []
    try:
        for side in sides.values():
            side.plugins.host.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
            side.plugins.host.run("iptables", "-P", "FORWARD", "DROP")
            far = outside(side, made)
        outs = both(sides, "ADD", conf, "pod1")
        same(sides, outs)
        assert_reachability(sides, [far])
        assert cni_forward(sides["ours"].plugins.host) == cni_forward(sides["ref"].plugins.host)
        assert any("10.86.0.2/32" in line for line in cni_forward(sides["ours"].plugins.host))
        both(sides, "CHECK", conf, "pod1", prevs=outs)
        for label, side in sides.items():
            code, out = side.run("DEL", conf, "pod1", prev=outs[label])
            assert code == 0, out
            assert not any("10.86.0.2" in line for line in cni_forward(side.plugins.host))
        assert "ctr-pod1" not in sides["ours"].plugins.host.run("nft", "list", "ruleset").stdout
    finally:
        for ns in made:
            delete_netns(ns)


def test_firewall_refuses_what_the_reference_half_applies(sides) -> None:
    """DELIBERATE: an unknown ingressPolicy fails the reference's ADD after its accepts are in
    (they stay); ours refuses it (7) before changing anything. backend "iptables" is refused
    (2): pycni has the nftables backend only."""
    need("iptables")
    for side in sides.values():
        side.plugins.host.run("iptables", "-P", "FORWARD", "DROP")
    bad = bridge_conf("fw-bad", ["10.87.0.0/24"], more=[
        {"type": "firewall", "ingressPolicy": "nope"}])
    codes = {label: side.run("ADD", bad, "pod1") for label, side in sides.items()}
    assert all(code != 0 for code, _ in codes.values()), codes
    assert codes["ours"][1]["error"]["code"] == 7, codes["ours"]
    assert any("10.87.0.2/32" in line for line in cni_forward(sides["ref"].plugins.host))
    assert not any("10.87.0.2" in line for line in cni_forward(sides["ours"].plugins.host))
    iptables = bridge_conf("fw-ipt", ["10.87.0.0/24"], more=[
        {"type": "firewall", "backend": "iptables"}])
    code, out = sides["ours"].run("ADD", iptables, "pod2")
    assert code != 0 and out["error"]["code"] == 2, out


# ---- where we differ on purpose -------------------------------------------------------------


def test_del_with_empty_netns_leaks_nothing_unlike_the_reference(sides) -> None:
    """ctr and others call DEL with CNI_NETNS="" once the task is gone. Both free the address;
    the reference leaves its masquerade rule behind (#810); ours removes it by its comment."""
    need("iptables")
    conf = bridge_conf("masq-diff", ["10.83.0.0/24"])
    outs = both(sides, "ADD", conf, "pod1")
    for label, side in sides.items():
        code, out = side.run("DEL", conf, "pod1", prev=outs[label], netns="")
        assert code == 0, out
        assert [f for f in store_files(side.data_dir, "masq-diff")
                if not f.startswith("last_reserved_ip")] == []
    ref_rules = sides["ref"].plugins.host.run("iptables-save", "-t", "nat").stdout
    assert "ctr-pod1" in ref_rules  # the reference's leak, documented upstream
    ours = sides["ours"].plugins.host
    assert "ctr-pod1" not in ours.run("nft", "list", "ruleset").stdout
    assert "ctr-pod1" not in ours.run("iptables-save", "-t", "nat").stdout


# ---- result JSON against v1.9.1, per version ------------------------------------------------


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0",
                                     "1.1.0"])
def test_result_shape_is_v19s(v19_sides, version) -> None:
    """Each plugin's ADD result at each version, against v1.9.1's on the same conflist: the same
    keys present (an empty "dns" only before 1.0.0), the same values modulo random names."""
    sides = v19_sides
    chain = bridge_conf("shape-diff", ["10.84.0.0/24", "fd84::/64"], more=[
        {"type": "portmap", "capabilities": {"portMappings": True}},
        *([{"type": "bandwidth", "capabilities": {"bandwidth": True}}]
          if version >= "0.3.0" else [])]) | {"cniVersion": version}
    cap = {"portMappings": [{"hostPort": 18084, "containerPort": 80, "protocol": "tcp"}],
           "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                         "egressRate": 4_000_000, "egressBurst": 400_000}}
    outs = both(sides, "ADD", chain, "pod1", cap_args=cap)
    result = same(sides, outs)
    assert ("dns" in result) is (version < "1.0.0")
    assert result["cniVersion"] == version
    for label, side in sides.items():
        code, out = side.run("DEL", chain, "pod1", cap_args=cap, prev=outs[label])
        assert code == 0, out

    alone = {"cniVersion": version, "name": "shape-hl", "plugins": [{
        "type": "host-local", "ipam": {"type": "host-local",
                                       "ranges": [[{"subnet": "10.85.0.0/28"}]]}}]}
    same(sides, both(sides, "ADD", alone, "pod2"))
    both(sides, "DEL", alone, "pod2")

    lo = {"cniVersion": version, "name": "shape-lo", "plugins": [{"type": "loopback"}]}
    outs = both(sides, "ADD", lo, "pod2")
    if version >= "1.0.0":
        same(sides, outs)
    else:  # DELIBERATE (module doc): v1.9.1's loopback prints the 1.x shape at any version
        ref = outs["ref"]
        assert "dns" not in ref and all("version" not in ip for ip in ref["ips"]), ref
        assert "dns" in outs["ours"]
    both(sides, "DEL", lo, "pod2")
