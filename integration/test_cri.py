"""A pod the way kubelet makes one: CRI calls to containerd 1.6's CRI plugin, which runs the CNI
chain through go-cni/libcni. Once with pycni (`pycni install`, its daemon on), once with the
reference plugins (/usr/lib/cni, iptables backends) as the oracle: the same assertions on both,
for conf/'s IPv4 and dual-stack conflists.

containerd sends capability args with Go-cased keys (go-cni's structs have no JSON tags):
portMappings `[{"HostPort":8080,"ContainerPort":80,"Protocol":"tcp","HostIP":""}]` and
bandwidth `{"IngressRate":1000000,"IngressBurst":4294967295,...}`, the latter filled from the
pod's kubernetes.io/ingress-bandwidth / egress-bandwidth annotations. It adds loopback itself.
Everything runs on a throwaway node (its own netns and mount ns; integration/clients.py).
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clients import (
    PAUSE_CMD,
    PAUSE_IMAGE,
    ROOT,
    VENV_PY,
    CRIContainerd,
    Node,
    PycniDaemon,
    build_image,
    cgroup_parent,
    cleanup,
    cri_conflist,
    install,
    leftovers,
    need,
    wait_for,
)
from cnitest import REFERENCE_BIN, Netns

pytestmark = pytest.mark.root
HTTPD = "localhost/pycni-busybox:test"  # conftest's oci_image
NODE_ADDR = "192.0.2.30"  # the node's own addresses (on its lo); hostPort traffic goes to them
NODE_ADDR6 = "2001:db8::30"
HOST_PORT = 8080
RATE = 1_000_000  # "1M" in the annotations: bit/s
BODY = "hello from pycni\n"  # busybox_rootfs's /www/index.html


@pytest.fixture(scope="module")
def pause_image(tmp_path_factory) -> Path:
    """CRI's sandbox_image: busybox sleeping forever (no registry: nothing is pulled)."""
    need("buildah")
    return build_image(tmp_path_factory.mktemp("pause"), PAUSE_IMAGE, cmd=PAUSE_CMD)


def cli(sock: Path, *args: str) -> Any:
    """`python -m integration.cri.client --socket SOCK ...`, its JSON answer."""
    proc = subprocess.run([str(VENV_PY), "-m", "integration.cri.client", "--socket", str(sock),
                           *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def http_get(node: Node, addr: str, port: int) -> str:
    proc = node.run("curl", "-sS", "--max-time", "3", f"http://{addr}:{port}/", check=False)
    return proc.stdout if proc.returncode == 0 else ""


def tbfs(node_netns: Netns, dev: str) -> list[dict[str, int]]:
    """The options of each tbf qdisc on dev (rate in bytes/s, burst in bytes)."""
    out = node_netns.run("tc", "-j", "qdisc", "show", "dev", dev).stdout
    return [q["options"] for q in json.loads(out or "[]") if q.get("kind") == "tbf"]


def tbf_rates(node_netns: Netns, dev: str) -> list[int]:
    return [q["rate"] for q in tbfs(node_netns, dev)]


def links_of_kind(node_netns: Netns, kind: str) -> list[dict[str, Any]]:
    return [link for link in node_netns.ip("-d", "link", "show")
            if link.get("linkinfo", {}).get("info_kind") == kind]


def firewall(node: Node) -> list[str]:
    """The node's nftables ruleset and iptables (v4, v6) dumps, line by line."""
    dumps = [node.run("nft", "list", "ruleset").stdout]
    dumps += [node.run(tool, check=False).stdout for tool in ("iptables-save", "ip6tables-save")]
    return [line for text in dumps for line in text.splitlines()]


def rules_naming(node: Node, *words: str) -> list[str]:
    return [line for line in firewall(node) if any(w in line for w in words)]


# The reference's per-pod iptables chains are named by a hash, not the pod: CNI-<24 hex>
# (bridge's masquerade) and CNI-DN-<24 hex> (portmap's DNAT).
POD_CHAIN = re.compile(r"\bCNI-(DN-)?[0-9a-f]{24}\b")


@pytest.mark.parametrize("conflist", ["10-pycni.conflist", "20-pycni-dualstack.conflist"],
                         ids=["v4", "dualstack"])
@pytest.mark.parametrize("side", ["pycni", "reference"])
def test_kubelet_pod_through_containerd_cri(side, conflist, node_netns, oci_image, pause_image,
                                            tmp_path) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc", "iptables-save")
    from cri.client import CRIClient, PortMap

    conf = cri_conflist(reference=side == "reference", name=conflist)
    bridge = conf["plugins"][0]["bridge"]
    if side == "pycni":
        bin_dir, conf_dir = install(tmp_path / "cni", conf)
    else:
        if not (REFERENCE_BIN / "portmap").exists():
            pytest.skip("reference plugins not installed (containernetworking-plugins)")
        bin_dir, conf_dir = REFERENCE_BIN, tmp_path / "net.d"
        conf_dir.mkdir()
        (conf_dir / conflist).write_text(json.dumps(conf))
    subnets = [ipaddress.ip_network(r[0]["subnet"]) for r in conf["plugins"][0]["ipam"]["ranges"]]
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR}/32", "dev", "lo")
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR6}/128", "dev", "lo", "nodad")
    state = tmp_path / "var-lib-cni"  # the node's /var/lib/cni
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(node.stop), cgroup_parent() as cgroup:
        daemon = PycniDaemon(node, tmp_path / "daemon") if side == "pycni" else None
        ctrd = CRIContainerd(node, tmp_path / "containerd", cni_bin=bin_dir, cni_conf=conf_dir,
                             sandbox_image=PAUSE_IMAGE, env=daemon.env if daemon else None)
        with cleanup(ctrd.stop, *([daemon.stop] if daemon else [])):
            ctrd.ctr("images", "import", str(pause_image))
            ctrd.ctr("images", "import", str(oci_image))
            with CRIClient(str(ctrd.sock)) as cri:
                info = cri.wait_ready()
                assert info["runtime_name"] == "containerd", info
                cri.wait_image(PAUSE_IMAGE)
                cri.wait_image(HTTPD)

                # ---- what kubelet does to start a pod with a hostPort and bandwidth limits
                pod = cri.run_pod(
                    "web", port_mappings=[PortMap(HOST_PORT, 80)],
                    annotations={"kubernetes.io/ingress-bandwidth": "1M",
                                 "kubernetes.io/egress-bandwidth": "1M"},
                    log_directory=str(tmp_path / "pod-logs"), cgroup_parent=cgroup,
                    dns_servers=["10.96.0.10"])
                cri.create_start(pod, "httpd", HTTPD, ["/bin/httpd", "-f", "-p", "80",
                                                       "-h", "/www"])
                ip, more = cri.pod_ip(pod.id)
                ips = [ip, *more]  # one per range, in the conflist's order (v4 first)
                assert [ipaddress.ip_address(a) in net for a, net in zip(ips, subnets,
                                                                         strict=True)] == \
                    [True] * len(subnets), (ips, subnets)
                # the client's CLI (the VM scenario's scripts use it) says the same
                assert cli(ctrd.sock, "ip", pod.id) == {"ip": ip, "additional_ips": more}

                # host-local's reservations, in the node's /var/lib/cni
                for addr in ips:
                    reservation = state / "networks" / conf["name"] / addr
                    assert reservation.read_bytes() == f"{pod.id}\r\neth0".encode()

                # libcni's result cache, with what containerd sent as capability args
                cache = state / "results" / f"{conf['name']}-{pod.id}-eth0"
                entry = json.loads(cache.read_text())
                assert entry["containerId"] == pod.id
                caps = entry["capabilityArgs"]
                assert caps["portMappings"] == [{"HostPort": HOST_PORT, "ContainerPort": 80,
                                                 "Protocol": "tcp", "HostIP": ""}], caps
                assert caps["bandwidth"]["IngressRate"] == RATE, caps
                assert caps["bandwidth"]["EgressRate"] == RATE, caps
                assert all(a in json.dumps(entry["result"]["ips"]) for a in ips)

                # the hostPort: via the node's address(es) and via 127.0.0.1, from the node
                for addr in (NODE_ADDR, "127.0.0.1", *([f"[{NODE_ADDR6}]"] if more else [])):
                    body = wait_for(f"{addr}:{HOST_PORT} to answer",
                                    lambda addr=addr: http_get(node, addr, HOST_PORT),
                                    timeout=30, interval=0.5)
                    assert body == BODY

                # shaping: tbf at 1 Mbit/s (125000 B/s) on the host veth (traffic to the pod)
                # and on the ifb the veth's ingress is redirected to (traffic from the pod)
                veths = links_of_kind(node_netns, "veth")
                assert [v.get("master") for v in veths] == [bridge], veths
                assert tbf_rates(node_netns, veths[0]["ifname"]) == [RATE // 8]
                ifbs = [i for i in links_of_kind(node_netns, "ifb")
                        if i["ifname"].startswith("bwp")]
                assert len(ifbs) == 1, ifbs
                assert tbf_rates(node_netns, ifbs[0]["ifname"]) == [RATE // 8]
                redirect = node_netns.run("tc", "filter", "show", "dev", veths[0]["ifname"],
                                          "ingress").stdout
                assert f"Egress Redirect to device {ifbs[0]['ifname']}" in redirect, redirect
                if side == "pycni":
                    # containerd knows no burst and sends 4294967295 bits; the reference
                    # makes that a ~21 MB bucket (line rate for many seconds, #609), pycni a
                    # few MTUs (README "bandwidth: where limits come from")
                    for dev in (veths[0]["ifname"], ifbs[0]["ifname"]):
                        assert [q["burst"] <= 64 * 1024 for q in tbfs(node_netns, dev)] == \
                            [True], tbfs(node_netns, dev)
                assert all(rules_naming(node, a) for a in ips)  # the DNATs to the pod
                if side == "reference":  # what the leak check looks for after removal
                    assert any(POD_CHAIN.search(line) for line in firewall(node))
                if daemon:  # the plugins containerd exec'd went through the daemon
                    assert daemon.served() > 0, daemon.log.read_text()

                # ---- what kubelet does to delete it
                cri.stop_remove(pod.id, pod.containers)
                assert cri.pod_ids() == []

            assert leftovers(node_netns.ip, state, conf["name"], [pod.id]) == []
            assert [i["ifname"] for i in links_of_kind(node_netns, "ifb")
                    if i["ifname"].startswith("bwp")] == []
            assert not cache.exists()
            assert [q for q in json.loads(node_netns.run("tc", "-j", "qdisc", "show").stdout)
                    if q["kind"] in ("tbf", "ingress")] == []
            assert rules_naming(node, pod.id, *ips) == []
            assert [line for line in firewall(node) if POD_CHAIN.search(line)] == []
            assert http_get(node, NODE_ADDR, HOST_PORT) == ""
            assert http_get(node, f"[{NODE_ADDR6}]", HOST_PORT) == ""
            assert not ctrd.netns_dir.exists() or list(ctrd.netns_dir.iterdir()) == []
