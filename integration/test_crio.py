"""A pod the way kubelet makes one, through CRI-O 1.33 (../shared/reference/bin; crionode.py):
pycni installed with its daemon, the chain bridge (ipMasq on nftables) + portmap (nftables) +
bandwidth, at cniVersion 1.0.0 (no STATUS or GC calls, so the daemon's count is exact).

How CRI-O drives the chain, asserted here: ADD then CHECK right after, each over the three
plugins; one DEL over them per pod (StopPodSandbox); hostPorts made by CRI-O itself in nft table
`ip crio-hostports` (portmap gets no portMappings, and the hostPort does not answer on
127.0.0.1); runtimeConfig.bandwidth built from the annotations with both bursts 34359738359 (its
"no burst given"). CRI-O runs with PYCNI_SHIM_FALLBACK=0: every plugin call is the daemon's.
Also: CRI-O restarted under a live pod (it runs CHECK on the pods it restores), the bin dir
swapped with the reference v1.9.1 under a live pod both ways, and a 1M-annotated pod's traffic
against an unshaped one's (iperf3).
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients import ROOT, VENV_PY, cri_conflist, install, missing_tools, need, pycni, wait_for
from crinode import (
    BODY,
    HOST_PORT,
    NODE_ADDR,
    RATE,
    CRINode,
    cache_path,
    http_get,
    links_of_kind,
    rules_naming,
    run_web_pod,
    shared_leftovers,
    tbf_rates,
)
from crionode import PLUGINS, SHARED_BIN, TOOLS, crio_node, missing_crio

from cni.host import links, tc
from cni.host import netns as hostns
from cni.plugins.bandwidth import derived_burst

pytestmark = pytest.mark.root

CRIO_NO_BURST = 34359738359  # math.MaxUint32 * 8 - 1
CALLS_PER_POD = {"ADD": 3, "CHECK": 3, "DEL": 3}  # bridge, portmap, bandwidth each
GATEWAY = "10.88.0.1"
MASQ_TABLE = "cni_plugins_masquerade"  # the reference v1.9 nftables layout, pycni's too


def h16(text: str) -> str:
    return hashlib.sha512(text.encode()).hexdigest()[:16]


def crio_conflist() -> dict:
    """conf/10-pycni.conflist as a CRI-O node has it: no loopback (CRI-O brings lo up), the
    masquerade on nftables, as both pycni and the reference v1.9.1 understand it."""
    conf = cri_conflist()
    conf["plugins"][0]["ipMasqBackend"] = "nftables"
    return conf


def require_crio(*tools: str) -> None:
    """Root and namespaces (else a skip, which rootskips fails as root), then a failure, not a
    skip, for anything of shared/ or setup.sh's APT_TEST that is missing."""
    need()
    if missing := missing_crio() + missing_tools(*TOOLS, *tools):
        pytest.fail(f"CRI-O's test tools missing (../shared/reference/bin, scripts/setup.sh): "
                    f"{missing}")


def pod_netns(n: CRINode) -> Path:
    [netns] = n.ctrd.netns_dir.iterdir()
    return netns


def in_pod(n: CRINode, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return n.node.run("nsenter", f"--net={pod_netns(n)}", "--", *cmd, **kw)


def ip_json(n: CRINode, *args: str) -> list[dict]:
    return json.loads(in_pod(n, "ip", "-j", *args).stdout)


def crio_hostports(n: CRINode) -> str:
    return n.node.run("nft", "list", "table", "ip", "crio-hostports", check=False).stdout


def masquerade_rules(n: CRINode, pod_id: str) -> list[str]:
    out = n.node.run("nft", "list", "table", "inet", MASQ_TABLE, check=False).stdout
    return [line.strip() for line in out.splitlines() if pod_id in line]


def assert_pod_network(n: CRINode, ip: str) -> None:
    """The pod's eth0 address, its routes (the subnet, the default via the bridge), the
    gateway on the bridge; lo up (CRI-O's doing: the conflist has no loopback)."""
    addrs = {a["ifname"]: a for a in ip_json(n, "addr", "show")}
    assert [(x["local"], x["prefixlen"]) for x in addrs["eth0"]["addr_info"]
            if x["family"] == "inet"] == [(ip, 16)], addrs["eth0"]
    assert "UP" in addrs["lo"]["flags"], addrs["lo"]
    routes = {(r["dst"], r.get("gateway")) for r in ip_json(n, "route", "show")}
    assert routes == {("default", GATEWAY), ("10.88.0.0/16", None)}, routes
    bridge = json.loads(n.node.run("ip", "-j", "addr", "show", "cni0").stdout)[0]
    assert [(x["local"], x["prefixlen"]) for x in bridge["addr_info"]
            if x["family"] == "inet"] == [(GATEWAY, 16)], bridge


def assert_shaped(n: CRINode, by: str = "pycni") -> None:
    """tbf at the annotation's 1 Mbit/s on the host veth (to the pod) and on the ifb the
    veth's ingress is redirected to (from the pod). pycni's burst is a few MTUs; the reference
    v1.9.1 takes CRI-O's 34359738359 literally, its buffer wraps, and its queue limit is 25 ms
    of the rate plus a wrapped burst: about 3 KB."""
    veths = links_of_kind(n.netns, "veth")
    assert [v.get("master") for v in veths] == ["cni0"], veths
    ifbs = [i for i in links_of_kind(n.netns, "ifb") if i["ifname"].startswith("bwp")]
    assert len(ifbs) == 1, ifbs
    for dev in (veths[0]["ifname"], ifbs[0]["ifname"]):
        assert tbf_rates(n.netns, dev) == [RATE // 8]
        with hostns.iproute(n.netns.path) as ipr:
            link = links.get(ipr, dev)
            assert link is not None, dev
            tbf = tc.read_tbf(ipr, link.index)
        if by == "pycni":  # the derived burst: 4 MTUs at this rate
            assert tbf == tc.tbf_for(RATE, derived_burst(RATE, 1500)), tbf
        else:
            assert tbf is not None and tbf.limit < 4096, tbf


def wait_http(n: CRINode, addr: str, port: int) -> None:
    body = wait_for(f"{addr}:{port} to answer", lambda: http_get(n.node, addr, port),
                    timeout=30, interval=0.5)
    assert body == BODY


def assert_answered(n: CRINode, since: int, calls: int) -> None:
    """The daemon's own count grew by exactly `calls` (it counts a request once its child is
    back, just after the reply: a bounded wait for the last one, then exact)."""
    assert n.daemon is not None
    wait_for(f"the daemon to count {calls} requests",
             lambda: n.daemon.answered() - since >= calls, timeout=10)
    assert n.daemon.answered() - since == calls, n.daemon.log.read_text()


def assert_clean(n: CRINode, network: str, pod_id: str, ips: list[str]) -> None:
    assert n.cri.pod_ids() == []
    assert shared_leftovers(n, network, pod_id) == []
    assert rules_naming(n.node, pod_id, *ips) == []  # CRI-O's hostPort DNAT, our masquerade
    assert http_get(n.node, NODE_ADDR, HOST_PORT) == ""


@contextlib.contextmanager
def pycni_crio_node(node_netns, tmp_path: Path, images: list[Path], *tools: str) -> \
        Iterator[tuple[CRINode, dict]]:
    """A CRI-O node with pycni installed and its daemon on; the node and the conflist."""
    require_crio(*tools)
    conf = crio_conflist()
    bin_dir, conf_dir = install(tmp_path / "cni", conf)
    with crio_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir, images=images,
                   daemon=True) as n:
        assert n.daemon is not None
        yield n, conf


def test_kubelet_pod_through_crio(node_netns, oci_image, pause_image, tmp_path) -> None:
    with pycni_crio_node(node_netns, tmp_path, [pause_image, oci_image]) as (n, conf):
        before = n.daemon.answered()
        pod, ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        [ip] = ips
        # ADD then CHECK over the chain, each plugin's call answered by the daemon (the
        # shims' fallback is off in CRI-O's environment: a missed call would fail the pod)
        assert_answered(n, before, CALLS_PER_POD["ADD"] + CALLS_PER_POD["CHECK"])

        assert (tmp_path / "var-lib-cni" / "networks" / conf["name"] / ip).read_bytes() == \
            f"{pod.id}\r\neth0".encode()
        entry = json.loads(cache_path(n, conf["name"], pod.id).read_text())
        caps = entry["capabilityArgs"]
        # CRI-O passes no portMappings (it does hostPorts itself), no dns, lowercase bandwidth
        # keys with its "no burst" value, and the annotations
        assert set(caps) == {"bandwidth", "io.kubernetes.cri.pod-annotations", "cgroupPath"}, \
            caps
        assert caps["bandwidth"] == {"ingressRate": RATE, "ingressBurst": CRIO_NO_BURST,
                                     "egressRate": RATE, "egressBurst": CRIO_NO_BURST}, caps

        assert_pod_network(n, ip)
        assert_shaped(n)
        wait_http(n, ip, 80)
        wait_http(n, NODE_ADDR, HOST_PORT)
        assert re.search(rf"tcp \. {HOST_PORT} comment \"\w+\" : {re.escape(ip)} \. 80\b",
                         crio_hostports(n)), crio_hostports(n)
        assert http_get(n.node, "127.0.0.1", HOST_PORT) == ""  # CRI-O's rules: not on lo
        assert len(masquerade_rules(n, pod.id)) == 1, masquerade_rules(n, pod.id)

        n.cri.stop_remove(pod.id, pod.containers)
        assert_answered(n, before, sum(CALLS_PER_POD.values()))
        assert_clean(n, conf["name"], pod.id, ips)
        assert masquerade_rules(n, pod.id) == []


def test_crio_restarted_under_a_live_pod(node_netns, oci_image, pause_image, tmp_path) -> None:
    with pycni_crio_node(node_netns, tmp_path, [pause_image, oci_image]) as (n, conf):
        before = n.daemon.answered()
        pod, [ip] = run_web_pod(n, conf, tmp_path / "pod-logs")
        wait_http(n, NODE_ADDR, HOST_PORT)
        assert_answered(n, before, CALLS_PER_POD["ADD"] + CALLS_PER_POD["CHECK"])
        n.ctrd.restart()
        n.cri.wait_ready()
        # the restarted CRI-O checks each pod it restores: one more CHECK over the chain
        assert_answered(n, before, CALLS_PER_POD["ADD"] + 2 * CALLS_PER_POD["CHECK"])
        # the pod kept its network: same address, answering directly and on the hostPort
        assert n.cri.pod_ids() == [pod.id]
        assert n.cri.pod_ip(pod.id) == (ip, [])
        assert_pod_network(n, ip)
        assert_shaped(n)
        wait_http(n, ip, 80)
        wait_http(n, NODE_ADDR, HOST_PORT)
        n.cri.stop_remove(pod.id, pod.containers)
        assert_answered(n, before, sum(CALLS_PER_POD.values()) + CALLS_PER_POD["CHECK"])
        assert_clean(n, conf["name"], pod.id, [ip])
        assert masquerade_rules(n, pod.id) == []


def put_reference(bin_dir: Path) -> None:
    """The reference v1.9.1's plugins over whatever bin_dir holds (an operator's rollback)."""
    for name in PLUGINS:
        with contextlib.suppress(FileNotFoundError):
            (bin_dir / name).unlink()
        shutil.copy2(SHARED_BIN / name, bin_dir / name)


@pytest.mark.parametrize("adder", ["pycni", "reference"], ids=["pycni-add", "reference-add"])
def test_swap_with_the_reference_under_a_crio_pod(adder, node_netns, oci_image, pause_image,
                                                  tmp_path) -> None:
    """The pod is made by one side; the bin dir CRI-O reads is swapped to the other while it
    runs; kubelet's removal runs the other side's DEL. Both write the v1.9 nftables layout, so
    nothing is left either way (the containerd swap, against v1.1.1's iptables, leaves rules)."""
    require_crio()
    conf = crio_conflist()
    bin_dir, conf_dir = tmp_path / "cni" / "bin", tmp_path / "cni" / "net.d"
    bin_dir.mkdir(parents=True)
    conf_dir.mkdir()
    (conf_dir / "10-pycni.conflist").write_text(json.dumps(conf))
    upgrade = ("install", "--force", "--bin-dir", str(bin_dir), "--conflist", "")
    if adder == "pycni":
        pycni(*upgrade)
    else:
        put_reference(bin_dir)
    with crio_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir,
                   images=[pause_image, oci_image], daemon=True) as n:
        pod, [ip] = run_web_pod(n, conf, tmp_path / "pod-logs")
        wait_http(n, NODE_ADDR, HOST_PORT)
        assert_shaped(n, by=adder)
        masq = masquerade_rules(n, pod.id)
        assert len(masq) == 1, masq
        if adder == "pycni":
            put_reference(bin_dir)
            assert all(filecmp.cmp(bin_dir / p, SHARED_BIN / p, shallow=False)
                       for p in PLUGINS)
        else:
            pycni(*upgrade)
            assert os.readlink(bin_dir / "portmap") == "pycni-plugin"
        wait_http(n, ip, 80)
        assert n.daemon is not None
        served = n.daemon.answered()
        n.cri.stop_remove(pod.id, pod.containers)
        # the DEL was the other side's: through the daemon only if pycni is in bin_dir now
        assert_answered(n, served, CALLS_PER_POD["DEL"] if adder == "reference" else 0)
        if adder == "pycni":
            # the reference's DEL removed the masquerade rule and left pycni's record chain of
            # the attachment (README, swapping), which pycni's GC removes
            record = f"pycni-masq-{h16(conf['name'])}-{h16(f'eth0:{pod.id}')}"
            assert record in n.node.run("nft", "list", "table", "inet", MASQ_TABLE).stdout
            gc_bin, gc_conf = install(tmp_path / "pycni-gc", conf, cni_version="1.1.0")
            n.node.run(str(VENV_PY), "-m", "cni.cli", "gc", conf["name"],
                       "--valid-attachments", "[]", cwd=ROOT,
                       env={"NETCONFPATH": str(gc_conf), "CNI_PATH": str(gc_bin)})
            assert record not in n.node.run("nft", "list", "table", "inet", MASQ_TABLE).stdout
        assert_clean(n, conf["name"], pod.id, [ip])
        assert masquerade_rules(n, pod.id) == []


@pytest.fixture
def iperf_server(node_netns):
    """An iperf3 server on the node (every address it has, the bridge's gateway among them)."""
    proc = subprocess.Popen(["ip", "netns", "exec", node_netns.name, "iperf3", "-s", "-p",
                             "5201"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    yield
    proc.kill()
    proc.wait()


def iperf(n: CRINode, netns: Path, reverse: bool) -> float:
    """Bits/s the receiver saw between the pod of `netns` and the node: reverse=True is
    node -> pod (the pod's ingress)."""
    cmd = ["nsenter", f"--net={netns}", "--", "iperf3", "-c", GATEWAY, "-p", "5201", "-t", "3",
           "-O", "1", "-J", "--connect-timeout", "2000", *(["-R"] if reverse else [])]
    for _ in range(3):  # the server serves one client at a time: retry a refused start
        proc = n.node.run(*cmd, check=False, timeout=30)
        report = json.loads(proc.stdout or "{}")
        if proc.returncode == 0 and "error" not in report:
            return float(report["end"]["sum_received"]["bits_per_second"])
        time.sleep(0.5)
    raise AssertionError(f"iperf3 failed: {proc.stdout[-500:]} {proc.stderr[-500:]}")


def test_a_1m_annotated_crio_pod_runs_at_1_mbit(node_netns, oci_image, pause_image, tmp_path,
                                                iperf_server) -> None:
    """A pod annotated 1M both ways, against an unshaped pod of the same node, same test: the
    shaper, not the busy box, sets the rate (ratios, as tests/test_bandwidth_traffic.py)."""
    with pycni_crio_node(node_netns, tmp_path, [pause_image, oci_image], "iperf3") as (n, conf):
        shaped = n.cri.run_pod("shaped", cgroup_parent=n.cgroup, annotations={
            "kubernetes.io/ingress-bandwidth": "1M", "kubernetes.io/egress-bandwidth": "1M"})
        [shaped_ns] = n.ctrd.netns_dir.iterdir()
        free = n.cri.run_pod("free", cgroup_parent=n.cgroup)
        [free_ns] = set(n.ctrd.netns_dir.iterdir()) - {shaped_ns}
        rates = {"free in": iperf(n, free_ns, True), "free out": iperf(n, free_ns, False),
                 "in": iperf(n, shaped_ns, True), "out": iperf(n, shaped_ns, False)}
        shown = {k: round(v / RATE, 2) for k, v in rates.items()}
        print(f"measured (Mbit/s): {shown}")
        for side in ("in", "out"):
            assert rates[side] <= RATE * 1.10, shown  # the limit, plus a few MTUs of burst
            assert rates[side] >= RATE * 0.5, shown  # shaped, not starved
            assert rates[f"free {side}"] >= 10 * rates[side], shown
        for pod in (shaped, free):
            n.cri.stop_remove(pod.id)
        assert n.cri.pod_ids() == []
        assert shared_leftovers(n, conf["name"], shaped.id) == []
