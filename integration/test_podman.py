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


def start_web(podman: Podman, net: str | None, subnet: ipaddress.IPv4Network, rootfs: Path,
              *flags: str) -> tuple[str, str]:
    """`podman run -d -p HOSTPORT:80` of busybox httpd named web on `net` (None: podman's
    default network); its container ID and its address, which is in `subnet`."""
    network = ["--network", net] if net else []
    cid = podman.run("run", "-d", *flags, "--name", "web", *network, "-p", f"{HOSTPORT}:80",
                     "--rootfs", str(rootfs), "/bin/httpd", "-f", "-p", "80", "-h",
                     "/www").stdout.strip()
    assert cid
    inspect = json.loads(podman.run("inspect", "web").stdout)[0]
    ip = inspect["NetworkSettings"]["Networks"][net or "podman"]["IPAddress"]
    assert ipaddress.ip_address(ip) in subnet
    return cid, ip


def hostport_answers(node_netns) -> str:
    """The hostPort answers from the node itself, on its own address and on localhost."""
    body = wait_for("the hostPort to answer",
                    lambda: http_get(node_netns, NODE_ADDR, HOSTPORT), timeout=20)
    assert body == "hello from a podman pod\n"
    assert http_get(node_netns, "127.0.0.1", HOSTPORT) == body
    return body


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
            cid, ip = start_web(podman, net, subnet, rootfs, "--rm")
            # The hostPort, from the node itself: its own address and localhost.
            body = hostport_answers(node_netns)
            # And the pod directly, through the bridge.
            assert http_get(node_netns, ip, 80) == body
            assert cid in node_netns.run("nft", "list", "ruleset").stdout  # our DNAT, by id

            podman.run("stop", "--time", "0", "web", timeout=60)
            wait_for("podman --rm to remove the container",
                     lambda: podman.run("ps", "-aq").stdout.strip() == "", timeout=30)
            assert leftovers(node_netns.ip, state, net, [cid]) == []
            assert cid not in node_netns.run("nft", "list", "ruleset").stdout
            assert http_get(node_netns, NODE_ADDR, HOSTPORT) == ""


# ---- podman's own networks: `podman network create` and the default "podman" network ----------
#
# podman 4 writes (and, for "podman", generates) bridge + portmap + firewall + tuning: run as
# written, every plugin pycni's own.

NODE_PORT = 18081  # the node's own server the container reaches


def _podman_network_round(node_netns, podman: Podman, state: Path, net: str | None,
                          subnet: ipaddress.IPv4Network, rootfs: Path) -> None:
    """podman run -p on `net` (None: podman's default network): the hostPort answers, the
    container reaches the node, CHECK-free `podman rm` leaves nothing."""
    name = net or "podman"
    cid, _ = start_web(podman, net, subnet, rootfs)
    hostport_answers(node_netns)
    ruleset = node_netns.run("nft", "list", "ruleset").stdout
    assert f'comment "{cid} eth0 {name}"' in ruleset  # firewall's accepts, by owner
    # The container reaches the node: the node's own address, through the bridge's gateway.
    # (busybox-static's wget crashes in a container; nc speaks the HTTP itself)
    got = podman.run("exec", "web", "/bin/sh", "-c",
                     f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {NODE_ADDR} {NODE_PORT}",
                     check=False)
    assert got.stdout.endswith("hello from the node\n"), (got.returncode, got.stderr)

    podman.run("rm", "--force", "--time", "0", "web", timeout=60)
    assert podman.run("ps", "-aq").stdout.strip() == ""
    assert leftovers(node_netns.ip, state, name, [cid]) == []
    assert cid not in node_netns.run("nft", "list", "ruleset").stdout
    assert http_get(node_netns, NODE_ADDR, HOSTPORT) == ""


def _node_server(node: Node, www: Path) -> subprocess.Popen:
    """busybox httpd in the node's netns on NODE_ADDR:NODE_PORT (killed by the caller)."""
    www.mkdir(parents=True, exist_ok=True)
    (www / "index.html").write_text("hello from the node\n")
    return node.popen("busybox", "httpd", "-f", "-p", f"{NODE_ADDR}:{NODE_PORT}", "-h",
                      str(www), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("which", ["network-create", "default-podman", "default-generated"])
def test_podmans_own_networks_on_pycni_alone(which, node_netns, tmp_path) -> None:
    """The conflist `podman network create` writes, and podman's default network, with only
    pycni in cni_plugin_dirs: the hostPort answers, the container reaches the node, `podman rm`
    leaves nothing (links, reservations, cached results, nft rules)."""
    need("podman", "conmon", "runc", "nsenter", "unshare", "curl", "busybox")
    node_netns.run("ip", "addr", "add", f"{NODE_ADDR}/32", "dev", "lo")
    bin_dir, conf_dir = install(tmp_path / "cni", CHAIN, cni_version="1.0.0")
    for ours in conf_dir.glob("*.conflist"):  # podman's own networks only
        ours.unlink()
    rootfs = busybox_rootfs(tmp_path / "rootfs", www="hello from a podman pod\n")
    state = tmp_path / "var-lib-cni"
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(node.stop):
        server = _node_server(node, tmp_path / "node-www")
        podman = Podman(node, tmp_path / "podman", bin_dir, conf_dir)
        with cleanup(podman.stop, server.kill, server.wait):
            if which == "network-create":
                net: str | None = "pmnet"
                subnet = ipaddress.ip_network("10.79.0.0/24")
                podman.run("network", "create", "--subnet", str(subnet), net)
                written = conf_dir / f"{net}.conflist"
                conf = json.loads(written.read_text())
                assert [p["type"] for p in conf["plugins"]] == [
                    "bridge", "portmap", "firewall", "tuning"]
                assert conf["plugins"][2] == {"type": "firewall", "backend": ""}
            elif which == "default-podman":
                net, subnet = None, ipaddress.ip_network("10.88.0.0/16")
                # Debian's podman ships "podman" as 87-podman-bridge.conflist in net.d.
                written = conf_dir / "87-podman-bridge.conflist"
                written.write_text(json.dumps(PODMAN_DEFAULT, indent=2))
            else:  # no file: podman 4 makes its default network in memory
                net, subnet = None, ipaddress.ip_network("10.88.0.0/16")
            _podman_network_round(node_netns, podman, state, net, subnet, rootfs)


# podman 4.3's default network as Debian's podman package ships it (87-podman-bridge.conflist)
PODMAN_DEFAULT = {
    "cniVersion": "0.4.0", "name": "podman",
    "plugins": [
        {"type": "bridge", "bridge": "cni-podman0", "isGateway": True, "ipMasq": True,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}],
                  "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "firewall"},
        {"type": "tuning"},
    ],
}


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
