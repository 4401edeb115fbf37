"""The Kubernetes network model on a cluster of three nodes (issue 46; topology.py builds it; run
by `make cluster-test`): every pod has its own IP and reaches pods on every other node without
NAT, over v4 and v6; node agents reach pods; hostPorts answer from other nodes and from their own
(hairpin); pods reach outside the cluster masqueraded to their node; bandwidth annotations hold
between nodes; firewall with the node's FORWARD dropping; and the node's life (BIRD stopped and
started, a runtime restarted, a node rebooted, every pod removed).

The no-NAT checks hold because the conflists carry bridge's nonMasqueradeCIDRs (the cluster's
CIDRs); test_without_the_key_a_pod_is_masqueraded shows the same check seeing the NODE's address
without the key, with pycni and with the reference v1.9.1 bridge (which has no such key).
One cluster serves the whole module; the node-life tests come last and change it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import wheels
from clients import need, terminate, wait_for
from cnitest import Netns
from topology import (
    BODY,
    CLUSTER4,
    CLUSTER6,
    HOST_PORT,
    OUTSIDE4,
    OUTSIDE6,
    WEB_PORT,
    Cluster,
    Member,
    Pod,
    cluster,
    conntrack_sources,
    http_get,
    in_pod,
    seen_by_server,
    send,
    wait_body,
)

pytestmark = pytest.mark.root
REFERENCE_BIN = (wheels.ROOT / ".." / "shared" / "reference" / "bin").resolve()  # v1.9.1


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> wheels.Venv:
    need("bird", "birdc", "containerd", "ctr", "runc", "conmon", "buildah", "ncat", "curl",
         "conntrack", "iperf3", "nft", "tc")
    _, wheel = wheels.build(tmp_path_factory.mktemp("dist"))
    return wheels.make_venv(tmp_path_factory.mktemp("wheel-venv") / "venv", wheel)


@pytest.fixture(scope="module")
def c(tmp_path_factory, venv, oci_image, pause_image) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("cluster"), venv, [pause_image, oci_image]) as c:
        for m in c.members:
            m.run_pod(f"web{m.i}", host_port=HOST_PORT)
        yield c


def web(m: Member) -> Pod:
    return m.pods[0]


def pairs(c: Cluster) -> list[tuple[Member, Member]]:
    return [(a, b) for a in c.members for b in c.other(a)]


def pod_ip(pod: Pod, family: str) -> str:
    return pod.ip4 if family == "v4" else pod.ip6


# ---- pod to pod --------------------------------------------------------------------------------


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("family", ["v4", "v6"])
def test_pods_reach_pods_on_every_other_node_by_their_own_ip(c, family, proto) -> None:
    """Server on node B sees the client pod's IP (its socket; conntrack on B says the same)."""
    udp = proto == "udp"
    base = {"v4": 9000, "v6": 9100}[family] + (50 if udp else 0)
    for a, b in pairs(c):
        port = base + 10 * a.i + b.i
        client, server = web(a), web(b)
        dst = pod_ip(server, family)
        seen = seen_by_server(b, server, dst, port, udp=udp,
                              client=lambda a=a, dst=dst, port=port, client=client: send(
                                  a.node, in_pod(client), dst, port, udp=udp))
        assert seen == pod_ip(client, family), (a.i, b.i, seen)
        assert conntrack_sources(b, dst, port, udp) == {pod_ip(client, family)}, (a.i, b.i)
    # what docs/CLUSTER.md tells to look at: each pod's masquerade spares the cluster CIDR
    cluster_cidr = CLUSTER4 if family == "v4" else CLUSTER6
    for m in c.members:
        table = m.node.run("nft", "list", "table", "inet", "cni_plugins_masquerade").stdout
        rule = next(line for line in table.splitlines() if f"saddr {pod_ip(web(m), family)} "
                    in line)
        assert f"daddr != {cluster_cidr} masquerade" in rule, rule


def nokey_conflist(m: Member, name: str, start: int) -> dict:
    """The node's own conflist as an operator without the key has it (no nonMasqueradeCIDRs), a
    network of its own on the same bridge and pod CIDR (addresses from .START up)."""
    conf = copy.deepcopy(m.conflist())
    conf["name"] = name
    [bridge] = [p for p in conf["plugins"] if p["type"] == "bridge"]
    assert bridge["ipMasq"] is True, bridge
    assert bridge.pop("nonMasqueradeCIDRs"), bridge  # what the no-NAT checks rely on
    v4 = m.pod_cidrs[0]
    bridge["ipam"]["ranges"] = [[{"subnet": v4, "rangeStart": v4.replace(".0/24", f".{start}")}]]
    conf["plugins"] = [bridge]
    return conf


@contextlib.contextmanager
def attached(c: Cluster, m: Member, conf: dict, tmp: Path, side: str = "pycni") -> Iterator[Pod]:
    """A netns on node m attached by a runner (pycni's from the wheel, or the reference
    cnitool with the reference v1.9.1 plugins) to the network `conf`; detached at exit."""
    if side == "pycni":
        cnitool, bin_dir = [str(c.venv.pycni)], m.bin_dir
    else:
        if not (REFERENCE_BIN / "bridge").exists():
            pytest.fail(f"no reference plugins in {REFERENCE_BIN}")
        cnitool, bin_dir = [str(REFERENCE_BIN / "cnitool")], REFERENCE_BIN
    name = conf["name"]
    confdir = tmp / f"net.d-{name}"
    confdir.mkdir()
    (confdir / f"{name}.conflist").write_text(json.dumps(conf))
    env = {"CNI_PATH": str(bin_dir), "NETCONFPATH": str(confdir),
           **(m.cri.daemon.env if side == "pycni" else {})}
    m.node.run("ip", "netns", "add", name)
    path = f"/run/netns/{name}"
    try:
        result = json.loads(m.node.run(*cnitool, "add", name, path, env=env).stdout)
        yield Pod(name, name, [ip["address"].split("/")[0] for ip in result["ips"]], path)
    finally:
        m.node.run(*cnitool, "del", name, path, env=env, check=False)
        m.node.run("ip", "netns", "del", name, check=False)


@pytest.mark.parametrize("side", ["pycni", "reference"])
def test_without_the_key_a_pod_is_masqueraded(c, side, tmp_path) -> None:
    """The same check, from a netns attached to node 1's cni0 by a conflist without
    nonMasqueradeCIDRs: pod B's server sees node 1's address, not the pod's. The reference
    v1.9.1 bridge (no such key) with ipMasq does the same: the check above can fail."""
    a, b = c.members[0], c.members[1]
    conf = nokey_conflist(a, f"nokey-{side}", 200 if side == "pycni" else 220)
    conf["cniVersion"] = "1.0.0"
    with attached(c, a, conf, tmp_path, side) as pod:
        dst, port = web(b).ip4, 9300 + (0 if side == "pycni" else 1)
        seen = seen_by_server(b, web(b), dst, port, client=lambda: send(
            a.node, in_pod(pod), dst, port))
        assert seen == a.addr4, (pod.ips, seen)


# ---- node agents, hostPorts, outside ------------------------------------------------------------


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_node_agents_reach_pods_of_their_node_and_of_the_others(c, family) -> None:
    for a in c.members:
        for b in c.members:
            assert wait_body(a.node, (), pod_ip(web(b), family), WEB_PORT) == BODY, (a.i, b.i)


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_host_port_from_other_nodes_their_pods_and_its_own_node(c, family) -> None:
    """Node B's hostPort from node A itself and from a pod on A; for A == B from the node and,
    where portmap makes the hostPort (containerd), from the pod itself (hairpin). CRI-O makes
    hostPorts itself (nft table crio-hostports; portmap gets no portMappings), and its own
    hairpin is CRI-O's business, not the chain's."""
    for b in c.members:
        node_ip = b.addr4 if family == "v4" else b.addr6
        for a in c.members:
            assert wait_body(a.node, (), node_ip, HOST_PORT) == BODY, (a.i, b.i)
            if a is b and b.runtime == "cri-o":
                continue
            assert wait_body(a.node, in_pod(web(a)), node_ip, HOST_PORT) == BODY, (a.i, b.i)


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_pods_reach_outside_masqueraded_to_their_node(c, family) -> None:
    """A namespace beyond a router that knows no pod CIDR answers pods: it sees the node."""
    dst = OUTSIDE4 if family == "v4" else OUTSIDE6
    for m in c.members:
        port = 9400 + m.i + (10 if family == "v6" else 0)
        seen = outside_seen(c.outside, dst, port, lambda m=m, port=port: send(
            m.node, in_pod(web(m)), dst, port))
        assert seen == (m.addr4 if family == "v4" else m.addr6), (m.i, seen)
        # and the answer comes back: an HTTP-less round trip through the router
        assert m.in_pod(web(m), "ping", "-c", "1", "-W", "3", dst, check=False).returncode == 0


def outside_seen(outside: Netns, dst: str, port: int, client) -> str:
    from topology import CONNECTION_FROM

    proc = subprocess.Popen(["ip", "netns", "exec", outside.name, "timeout", "30", "ncat", "-v",
                             "-l", "--recv-only", "-i", "3", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("ncat outside", lambda: f":{port} " in outside.run("ss", "-Hltn").stdout,
                 timeout=20)
        client()
        _, err = proc.communicate(timeout=40)
    finally:
        terminate(proc, grace=2)
    found = CONNECTION_FROM.search(err)
    assert found, err
    return found.group(1)


# ---- bandwidth, firewall ------------------------------------------------------------------------

RATE_MBIT = 10
TOLERANCE = 0.10  # the issue's: the shaped rate within 10%


def test_bandwidth_annotations_hold_between_nodes(c) -> None:
    """iperf3 between a pod on node 1 and a pod on node 2 annotated ingress/egress 10M, both
    ways across the underlay: the receiver measures the shaped rate within 10%. (iperf3 is the
    node's, run in the pods' network namespaces, as test_crio.py does: the shaping is the
    pod's veth and ifb, whoever's process sends.)"""
    a, b = c.members[0], c.members[1]
    shaped = b.run_pod("shaped", annotations={"kubernetes.io/ingress-bandwidth": f"{RATE_MBIT}M",
                                              "kubernetes.io/egress-bandwidth": f"{RATE_MBIT}M"})
    try:
        server = b.pod_popen(shaped, "iperf3", "-s", "-p", "5201",
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("iperf3 server", lambda: ":5201 " in b.in_pod(shaped, "ss", "-Hltn").stdout,
                     timeout=20)
            limit, rates = RATE_MBIT * 1e6, {}
            for way, extra in (("into the shaped pod", ()), ("out of it", ("-R",))):
                said: list[dict] = []

                def measured(extra: tuple[str, ...] = extra,
                             said: list[dict] = said) -> dict | None:
                    said[:] = [json.loads(a.in_pod(
                        web(a), "iperf3", "-c", shaped.ip4, "-p", "5201", "-t", "5", "-O", "2",
                        "-J", *extra, check=False, timeout=60).stdout or "{}")]
                    # iperf3's server takes one test at a time: right after the last one it
                    # can answer "the server is busy" (an "error" in the JSON): ask again
                    return said[0] if "end" in said[0] and "error" not in said[0] else None
                # Up to three runs a way: TCP through a tbf sometimes settles a little under
                # the rate on this 2-core box; the limit is never exceeded (checked on each).
                for _ in range(3):
                    try:
                        report = wait_for(f"iperf3 {way}", measured, timeout=60, interval=1)
                    except TimeoutError:
                        pytest.fail(f"iperf3 {way}: {said[0].get('error', said[0])}")
                    bps = report["end"]["sum_received"]["bits_per_second"]
                    rates.setdefault(way, []).append(bps)
                    if abs(bps - limit) <= TOLERANCE * limit:
                        break
        finally:
            terminate(server, grace=5)
        for way, runs in rates.items():
            assert max(runs) <= limit * (1 + TOLERANCE), (way, rates)  # the shaper's promise
            assert any(abs(bps - limit) <= TOLERANCE * limit for bps in runs), (way, rates)
    finally:
        b.remove_pod(shaped)


def test_firewall_with_forward_drop(c, tmp_path) -> None:
    """Node 1's FORWARD policy DROP (iptables-nft, as Docker sets it). A pod whose chain ends
    in firewall (ingressPolicy same-bridge) still reaches a pod on node 2 by its own IP; the web
    pod, without firewall in its chain, no longer does (the drop is real); a second network on
    its own bridge with firewall too cannot reach the first (isolation), while node 1 itself
    can."""
    a, b = c.members[0], c.members[1]
    fw = {"type": "firewall", "ingressPolicy": "same-bridge"}
    one = nokey_conflist(a, "fw-a", 150)
    one["plugins"][0]["nonMasqueradeCIDRs"] = [CLUSTER4]  # v4 only: the pod has no v6
    one["plugins"].append(fw)
    two = copy.deepcopy(one)
    two["name"] = "fw-b"
    two["plugins"][0]["bridge"] = "cni-iso"
    two["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "10.99.1.0/24"}]]
    for conf in (one, two):
        conf["cniVersion"] = "1.0.0"
    a.node.run("iptables", "-P", "FORWARD", "DROP")  # before the pods, as on a Docker host
    try:
        with attached(c, a, one, tmp_path) as pod_a, attached(c, a, two, tmp_path) as pod_b:
            dst, port = web(b).ip4, 9500
            seen = seen_by_server(b, web(b), dst, port, client=lambda: send(
                a.node, in_pod(pod_a), dst, port))
            assert seen == pod_a.ip4
            assert http_get(a.node, in_pod(web(a)), web(b).ip4, WEB_PORT) == ""
            # isolation: fw-b's pod to fw-a's listener is dropped; node 1 itself gets through
            listener = a.pod_popen(pod_a, "timeout", "60", "ncat", "-l", "-k", "9501",
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_for("ncat in fw-a", lambda: ":9501 " in a.in_pod(
                    pod_a, "ss", "-Hltn").stdout, timeout=20)
                send(a.node, (), pod_a.ip4, 9501)
                blocked = a.node.run(*in_pod(pod_b), "ncat", "--send-only", "-w", "3",
                                     pod_a.ip4, "9501", input="x\n", check=False)
                assert blocked.returncode != 0, blocked
            finally:
                terminate(listener, grace=2)
    finally:
        a.node.run("iptables", "-P", "FORWARD", "ACCEPT")
    assert http_get(a.node, in_pod(web(a)), web(b).ip4, WEB_PORT) == BODY


# ---- node life (last: they change the cluster) --------------------------------------------------


def test_bird_stopped_withdraws_and_started_restores(c) -> None:
    a, b, other = c.members
    for m in c.members:  # `birdc show protocols`: the full mesh, v4 and v6 sessions
        assert sorted(m.bird.established()) == sorted(
            f"node{o.i}_{f}" for o in c.other(m) for f in (4, 6)), m.i
    before = [p.ips for p in b.pods]
    b.bird.stop()
    # the others withdraw b's pod CIDRs (SIGTERM: BIRD closes its sessions; hold time 6 s)
    for m in (a, other):
        wait_for(f"node {m.i} to drop node {b.i}'s routes", lambda m=m: not any(
            r["dst"] in b.pod_cidrs for fam in ("-4", "-6") for r in m.routes(fam)),
            timeout=30)
    # pods elsewhere unaffected: a reaches other's pod
    assert wait_body(a.node, in_pod(web(a)), web(other).ip4, WEB_PORT) == BODY
    b.bird.start()
    c.wait_routes()
    assert [p.ips for p in b.pods] == before
    for m in (a, other):
        assert wait_body(m.node, in_pod(web(m)), web(b).ip4, WEB_PORT) == BODY
        assert wait_body(m.node, in_pod(web(m)), web(b).ip6, WEB_PORT) == BODY


def cni_check(c: Cluster, m: Member, pod: Pod) -> subprocess.CompletedProcess:
    """CNI CHECK of the pod's attachment as its runtime made it (libcni's cached result in the
    node's /var/lib/cni), by the wheel's runner with the node's bin and conf dirs."""
    env = {"CNI_PATH": str(m.bin_dir), "NETCONFPATH": str(m.conf_dir),
           "CNI_CONTAINERID": pod.id, **m.cri.daemon.env}
    return m.node.run(str(c.venv.pycni), "check", m.conflist()["name"], pod.netns, env=env,
                      check=False)


@pytest.mark.parametrize("which", [1, 3], ids=["containerd", "cri-o"])
def test_runtime_restarted_under_running_pods(c, which) -> None:
    """The node's runtime restarted (CRI-O runs CHECK on the pods it restores): its pods keep
    their IPs, answer from the other nodes, and CHECK passes."""
    m = c.members[which - 1]
    before = [(p.id, p.ips) for p in m.pods]
    m.cri.ctrd.restart()
    m.cri.cri.wait_ready()
    assert [(p.id, p.ips) for p in m.pods] == before
    for p in m.pods:
        assert m.cri.cri.pod_ip(p.id) == (p.ips[0], p.ips[1:])
        checked = cni_check(c, m, p)
        assert checked.returncode == 0, checked.stderr
    for o in c.other(m):
        for p in m.pods:
            assert wait_body(o.node, in_pod(web(o)), p.ip4, WEB_PORT) == BODY, (o.i, p.ips)
            assert wait_body(o.node, in_pod(web(o)), p.ip6, WEB_PORT) == BODY, (o.i, p.ips)


def test_node_rebooted_stale_attachments_collected(c) -> None:
    """Node 2 rebooted with its disk kept (topology.Cluster.reboot: its namespaces torn down
    and made again, runtime, daemon and BIRD started on the same dirs). The stale attachments
    (host-local reservations, libcni's cache) are collected by CNI GC (`pycni gc`, no valid
    attachment left); the old sandboxes removed as kubelet would; a new pod works across nodes
    and nothing on the node names an old pod's address."""
    m = c.members[1]
    old = list(m.pods)
    store = m.cri.state / "networks" / "pycni"

    def reserved() -> list[str]:
        return sorted(p.name for p in store.iterdir() if ":" in p.name or p.name[0].isdigit())

    assert reserved() == sorted(ip for p in old for ip in p.ips)
    c.reboot(m)
    c.wait_routes()
    # stale: the old pods' reservations and cache entries are still on disk
    assert reserved() == sorted(ip for p in old for ip in p.ips)
    assert {f"pycni-{p.id}-eth0" for p in old} <= {
        p.name for p in (m.cri.state / "results").iterdir()}
    env = {"CNI_PATH": str(m.bin_dir), "NETCONFPATH": str(m.conf_dir), **m.cri.daemon.env}
    m.node.run(str(c.venv.pycni), "gc", "pycni", "--valid-attachments", "[]", env=env)
    assert reserved() == []
    # (containerd's own loopback network keeps its entries: not pycni's network, nor its GC)
    assert [p.name for p in (m.cri.state / "results").iterdir()
            if p.name.startswith("pycni-")] == []
    for pod in old:  # kubelet removes the sandboxes that did not survive
        with contextlib.suppress(Exception):
            m.cri.cri.stop_remove(pod.id)
        m.pods.remove(pod)
    new = m.run_pod("web2b", host_port=HOST_PORT)
    for o in c.other(m):
        assert wait_body(o.node, in_pod(web(o)), new.ip4, WEB_PORT) == BODY, o.i
        assert wait_body(o.node, in_pod(web(o)), new.ip6, WEB_PORT) == BODY, o.i
        assert wait_body(o.node, in_pod(web(o)), m.addr4, HOST_PORT) == BODY, o.i
    gone = {ip for p in old for ip in p.ips} - set(new.ips)
    ruleset = m.node.run("nft", "list", "ruleset").stdout
    assert [ip for ip in gone if ip in ruleset] == []
    routes = [r.get("dst") for fam in ("-4", "-6") for r in m.routes(fam)]
    assert [ip for ip in gone if ip in routes] == []


def test_no_leftovers_after_every_pod_removed(c) -> None:
    for m in c.members:
        for pod in list(m.pods):
            m.remove_pod(pod)
    time.sleep(0.5)
    for m in c.members:
        left = []
        links = m.netns.ip("-d", "link", "show")
        left += [f"link {x['ifname']}" for x in links
                 if x.get("linkinfo", {}).get("info_kind") in ("veth", "ifb")
                 and x["ifname"] != "eth0"]
        store = m.cri.state / "networks"
        if store.is_dir():
            left += [f"reservation {p}" for p in store.rglob("*")
                     if p.is_file() and p.name != "lock" and not p.name.startswith("last_")]
        results = m.cri.state / "results"
        if results.is_dir():
            left += [f"cache {p.name}" for p in results.iterdir()]
        ruleset = m.node.run("nft", "list", "ruleset").stdout
        left += [f"nft: {line.strip()}" for line in ruleset.splitlines()
                 if "10.100." in line or "fd00:10:100:" in line]
        left += [f"route {r['dst']}" for fam in ("-4", "-6") for r in m.routes(fam)
                 if r["dst"] in m.pod_cidrs and r.get("dev") != "cni0"]
        left += [f"netns {p.name}" for p in m.cri.ctrd.netns_dir.iterdir()] \
            if m.cri.ctrd.netns_dir.exists() else []
        assert left == [], (m.i, left)



