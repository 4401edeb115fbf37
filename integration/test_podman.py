"""podman with the CNI backend: `podman run --network <ours> -p HOSTPORT:80 --rootfs ... httpd`.

podman runs on a throwaway node with its own storage, runroot and containers.conf
(network_backend "cni", cni_plugin_dirs and network_config_dir pointing at what `pycni install`
wrote). No image pull: the container's root is a busybox-static directory (--rootfs). The
hostPort answers from the node's own network namespace; after `--rm` nothing is left.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

import pytest
from clients import Node, Podman, busybox_rootfs, cleanup, install, leftovers, need, wait_for

pytestmark = pytest.mark.root
HOSTPORT = 18080
NODE_ADDR = "192.0.2.10"  # TEST-NET-1, the throwaway node's own address (on its lo)

CHAIN = {
    "cniVersion": "1.0.0", "name": "podnet",
    "plugins": [
        {"type": "bridge", "bridge": "cni-pod0", "isGateway": True, "ipMasq": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    ],
}


SHIPPED = Path(__file__).resolve().parent.parent / "conf" / "10-pycni.conflist"


def conflists() -> list:
    cases = [pytest.param(CHAIN, id="bridge-portmap-bandwidth")]
    if SHIPPED.exists():
        cases.append(pytest.param(json.loads(SHIPPED.read_text()), id=SHIPPED.stem))
    return cases


def http_get(node_netns, addr: str, port: int) -> str:
    """curl from the node's netns (the host side of the hostPort), bounded."""
    proc = node_netns.run("curl", "-sS", "--max-time", "5", f"http://{addr}:{port}/",
                          check=False)
    return proc.stdout if proc.returncode == 0 else ""


@pytest.mark.parametrize("conflist", conflists())
def test_podman_cni_hostport_answers_and_rm_leaves_nothing(conflist, node_netns,
                                                           tmp_path) -> None:
    need("podman", "conmon", "runc", "nsenter", "unshare", "curl")
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR}/32", "dev", "lo")
    # podman 4's libcni knows spec versions up to 1.0.0.
    bin_dir, conf_dir = install(tmp_path / "cni", conflist, cni_version="1.0.0")
    net = conflist["name"]
    bridge = next(p for p in conflist["plugins"] if p["type"] == "bridge")
    subnet = ipaddress.ip_network(bridge["ipam"]["ranges"][0][0]["subnet"])
    rootfs = busybox_rootfs(tmp_path / "rootfs", www="hello from a podman pod\n")
    state = tmp_path / "var-lib-cni"
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(node.stop):
        podman = Podman(node, tmp_path / "podman", bin_dir, conf_dir)
        with cleanup(podman.stop):
            nets = json.loads(podman.run("network", "ls", "--format", "json").stdout)
            assert net in {n["name"] for n in nets}
            cid = podman.run("run", "-d", "--rm", "--name", "web", "--network", net,
                             "-p", f"{HOSTPORT}:80", "--rootfs", str(rootfs),
                             "/bin/httpd", "-f", "-p", "80", "-h", "/www").stdout.strip()
            assert cid
            inspect = json.loads(podman.run("inspect", "web").stdout)[0]
            ip = inspect["NetworkSettings"]["Networks"][net]["IPAddress"]
            assert ipaddress.ip_address(ip) in subnet

            # The hostPort, from the node itself: its own address and localhost.
            body = wait_for("the hostPort to answer",
                            lambda: http_get(node_netns, NODE_ADDR, HOSTPORT), timeout=20)
            assert body == "hello from a podman pod\n"
            assert http_get(node_netns, "127.0.0.1", HOSTPORT) == body
            # And the pod directly, through the bridge.
            assert http_get(node_netns, ip, 80) == body
            assert cid in node_netns.run("nft", "list", "ruleset").stdout  # our DNAT, by id

            podman.run("stop", "--time", "0", "web", timeout=60)
            wait_for("podman --rm to remove the container",
                     lambda: podman.run("ps", "-aq").stdout.strip() == "", timeout=30)
            assert leftovers(node_netns.ip, state, net, [cid]) == []
            assert cid not in node_netns.run("nft", "list", "ruleset").stdout
            assert http_get(node_netns, NODE_ADDR, HOSTPORT) == ""


def test_podman_sees_only_our_plugins(node_netns, tmp_path) -> None:
    """cni_plugin_dirs is the install dir only: a type that is not there fails, naming it."""
    need("podman", "conmon", "runc", "nsenter", "unshare")
    broken = {"cniVersion": "1.0.0", "name": "nosuch", "plugins": [{"type": "macvlan"}]}
    bin_dir, conf_dir = install(tmp_path / "cni", broken, cni_version="1.0.0")
    rootfs = busybox_rootfs(tmp_path / "rootfs")
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir,
                state_dir=tmp_path / "var-lib-cni")
    with cleanup(node.stop):
        podman = Podman(node, tmp_path / "podman", bin_dir, conf_dir)
        with cleanup(podman.stop):
            try:
                proc = podman.run("run", "--rm", "--network", "nosuch", "--rootfs",
                                  str(rootfs), "/bin/true", check=False)
            except subprocess.TimeoutExpired:
                pytest.fail("podman hung on a missing plugin")
            assert proc.returncode != 0
            assert "macvlan" in proc.stderr
