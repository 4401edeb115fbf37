"""containerd: `ctr run --cni` against a private containerd on a throwaway node.

ctr (1.6) reads the first conflist in /etc/cni/net.d and execs plugins from /opt/cni/bin; on our
node those are the dirs `pycni install` wrote (never /usr/lib/cni, never the machine's own). The
container gets its address and reaches the gateway; after it exits nothing is left. ctr calls
DEL with an empty CNI_NETNS (the task is gone): the reference bridge leaks its masquerade rule
then (#810); ours removes it by its comment.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
from clients import Containerd, Node, cleanup, install, leftovers, need

pytestmark = pytest.mark.root
IMAGE = "localhost/pycni-busybox:test"

# loopback + bridge/host-local: what ctr gives a container (it passes no capability args).
BRIDGE = {
    "cniVersion": "1.0.0", "name": "ctrnet",
    "plugins": [
        {"type": "loopback"},
        {"type": "bridge", "bridge": "cni-ctr0", "isGateway": True, "ipMasq": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}],
                                                   [{"subnet": "fd77::/64"}]],
                  "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
    ],
}
CONF = Path(__file__).resolve().parent.parent / "conf"


def conflists() -> list:
    """Our own minimal chain, and each conflist shipped in conf/ (the full Kubernetes chain)."""
    cases = [pytest.param(BRIDGE, id="bridge-dual-stack")]
    cases += [pytest.param(json.loads(p.read_text()), id=p.stem)
              for p in sorted(CONF.glob("*.conflist"))]
    return cases


@pytest.mark.parametrize("conflist", conflists())
def test_ctr_run_cni_gets_address_reaches_gateway_leaves_nothing(conflist, node_netns,
                                                                 oci_image, tmp_path) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare")
    # containerd 1.6's libcni knows spec versions up to 1.0.0: install rewrites cniVersion.
    bin_dir, conf_dir = install(tmp_path / "cni", conflist, cni_version="1.0.0")
    assert not (bin_dir / "bridge").resolve().is_relative_to("/usr/lib/cni")
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir,
                state_dir=tmp_path / "var-lib-cni")
    with cleanup(node.stop):
        ctrd = Containerd(node, tmp_path / "containerd")
        with cleanup(ctrd.stop):
            ctrd.ctr("images", "import", str(oci_image))
            bridge = next(p for p in conflist["plugins"] if p["type"] == "bridge")
            ranges = [ipaddress.ip_network(r[0]["subnet"]) for r in bridge["ipam"]["ranges"]]
            gateways = [str(net[1]) for net in ranges]
            script = "ip -o addr show dev eth0; ip -o link show dev lo; " + "; ".join(
                f"ping -c1 -W5 {gw} >/dev/null && echo reached {gw}" for gw in gateways)
            out = ctrd.ctr("run", "--rm", "--cni", IMAGE, "c1", "sh", "-c", script,
                           timeout=180).stdout

            addrs = re.findall(r"inet6? (\S+)/\d+ .*scope global", out)
            for net in ranges:
                assert any(ipaddress.ip_address(a) in net for a in addrs), out
            for gw in gateways:
                assert f"reached {gw}" in out, out
            assert "LOOPBACK,UP" in out, out  # loopback (first in the chain) is up

            # After exit: ctr ran DEL (empty netns). No veth, no reservation, no cache, no rule.
            assert leftovers(node_netns.ip, tmp_path / "var-lib-cni", conflist["name"],
                             ["default-c1"]) == []
            ruleset = node_netns.run("nft", "list", "ruleset").stdout
            assert "default-c1" not in ruleset, ruleset
            assert ctrd.ctr("containers", "ls", "-q").stdout.split() == []
