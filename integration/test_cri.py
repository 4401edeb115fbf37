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

import json

import pytest
from clients import cri_conflist, install, need
from cnitest import REFERENCE_BIN, REFERENCE_PLUGINS
from crinode import (
    HOST_PORT,
    NODE_ADDR,
    NODE_ADDR6,
    POD_CHAIN,
    RATE,
    cache_path,
    cli,
    cri_node,
    firewall,
    http_get,
    links_of_kind,
    rules_naming,
    run_web_pod,
    shared_leftovers,
    tbf_rates,
    tbfs,
    wait_host_port,
)
from rootskips import missing

pytestmark = pytest.mark.root


@pytest.mark.parametrize("conflist", ["10-pycni.conflist", "20-pycni-dualstack.conflist"],
                         ids=["v4", "dualstack"])
@pytest.mark.parametrize("side", ["pycni", "reference"])
def test_kubelet_pod_through_containerd_cri(side, conflist, node_netns, oci_image, pause_image,
                                            tmp_path) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc", "iptables-save")
    conf = cri_conflist(reference=side == "reference", name=conflist)
    bridge = conf["plugins"][0]["bridge"]
    if side == "pycni":
        bin_dir, conf_dir = install(tmp_path / "cni", conf)
    else:
        if not (REFERENCE_BIN / "portmap").exists():
            missing(REFERENCE_PLUGINS)
        bin_dir, conf_dir = REFERENCE_BIN, tmp_path / "net.d"
        conf_dir.mkdir()
        (conf_dir / conflist).write_text(json.dumps(conf))
    with cri_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir,
                  images=[pause_image, oci_image], daemon=side == "pycni") as n:
        node, state = n.node, n.state
        pod, ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        ip, *more = ips
        # the client's CLI (the VM scenario's scripts use it) says the same
        assert cli(n.ctrd.sock, "ip", pod.id) == {"ip": ip, "additional_ips": more}

        # host-local's reservations, in the node's /var/lib/cni
        for addr in ips:
            reservation = state / "networks" / conf["name"] / addr
            assert reservation.read_bytes() == f"{pod.id}\r\neth0".encode()

        # libcni's result cache, with what containerd sent as capability args
        cache = cache_path(n, conf["name"], pod.id)
        entry = json.loads(cache.read_text())
        assert entry["containerId"] == pod.id
        caps = entry["capabilityArgs"]
        assert caps["portMappings"] == [{"HostPort": HOST_PORT, "ContainerPort": 80,
                                         "Protocol": "tcp", "HostIP": ""}], caps
        assert caps["bandwidth"]["IngressRate"] == RATE, caps
        assert caps["bandwidth"]["EgressRate"] == RATE, caps
        assert all(a in json.dumps(entry["result"]["ips"]) for a in ips)

        # the hostPort: via the node's address(es) and via 127.0.0.1, from the node
        wait_host_port(n, ips)

        # shaping: tbf at 1 Mbit/s (125000 B/s) on the host veth (traffic to the pod)
        # and on the ifb the veth's ingress is redirected to (traffic from the pod)
        veths = links_of_kind(node_netns, "veth")
        assert [v.get("master") for v in veths] == [bridge], veths
        assert tbf_rates(node_netns, veths[0]["ifname"]) == [RATE // 8]
        ifbs = [i for i in links_of_kind(node_netns, "ifb") if i["ifname"].startswith("bwp")]
        assert len(ifbs) == 1, ifbs
        assert tbf_rates(node_netns, ifbs[0]["ifname"]) == [RATE // 8]
        redirect = node_netns.run("tc", "filter", "show", "dev", veths[0]["ifname"],
                                  "ingress").stdout
        assert f"Egress Redirect to device {ifbs[0]['ifname']}" in redirect, redirect
        if side == "pycni":
            # containerd knows no burst and sends 4294967295 bits; the reference makes that
            # a ~21 MB bucket (line rate for many seconds, #609), pycni a few MTUs (README
            # "bandwidth: where limits come from")
            for dev in (veths[0]["ifname"], ifbs[0]["ifname"]):
                assert [q["burst"] <= 64 * 1024 for q in tbfs(node_netns, dev)] == [True], \
                    tbfs(node_netns, dev)
        assert all(rules_naming(node, a) for a in ips)  # the DNATs to the pod
        if side == "reference":  # what the leak check looks for after removal
            assert len({m.group(0) for line in firewall(node)
                        if (m := POD_CHAIN.search(line))}) == 2  # CNI-<h>, CNI-DN-<h>
        if n.daemon:  # the plugins containerd exec'd went through the daemon (fallback off)
            assert n.daemon.served() > 0, n.daemon.log.read_text()
            assert n.daemon.answered() > 0, n.daemon.log.read_text()  # its own count

        # ---- what kubelet does to delete it
        n.cri.stop_remove(pod.id, pod.containers)
        assert n.cri.pod_ids() == []

        assert shared_leftovers(n, conf["name"], pod.id) == []
        assert rules_naming(node, pod.id, *ips) == []
        assert [line for line in firewall(node) if POD_CHAIN.search(line)] == []
        assert http_get(node, NODE_ADDR, HOST_PORT) == ""
        assert http_get(node, f"[{NODE_ADDR6}]", HOST_PORT) == ""
