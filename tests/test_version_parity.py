"""Which spec versions each plugin speaks, and what it prints at the edges of them, against the
reference v1.9.1 (shared/reference/bin) run on the same input in a throwaway namespace.

- VERSION's supportedVersions per plugin: bandwidth speaks 0.3.0 on (the reference's
  VersionsStartingFrom("0.3.0")), the others 0.1.0 on.
- An unsupported cniVersion: code 1, msg "incompatible CNI versions", the list in details.
- bandwidth at 0.1.0/0.2.0: ADD refused as the reference refuses it, nothing made. DEL succeeds
  (DELIBERATE: the reference refuses it too, and libcni stops a DEL chain at the first error,
  so the bridge's DEL before it would never run).
- portmap at 0.1.0/0.2.0 with a prevResult without IP addresses prints that prevResult.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bandwidth_util import conf as bw_conf
from bandwidth_util import ifbs, kinds, runtime_bw, wire
from cnitest import BIN, Plugins

pytestmark = pytest.mark.root

REF19 = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "bin"
PLUGINS = ["bridge", "host-local", "loopback", "portmap", "bandwidth"]


@pytest.fixture(scope="module", autouse=True)
def reference_present() -> None:
    assert (REF19 / "bandwidth").exists(), "shared/reference/bin must be beside the checkout"


def version_of(bin_dir: Path, plugin: str, asked: str) -> dict:
    proc = subprocess.run([str(bin_dir / plugin)], env={"CNI_COMMAND": "VERSION"},
                          input=json.dumps({"cniVersion": asked}).encode(),
                          capture_output=True, check=True, cwd="/tmp")
    return json.loads(proc.stdout)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_supported_versions_are_the_references(plugin) -> None:
    ref = version_of(REF19, plugin, "1.1.0")
    ours = version_of(BIN, plugin, "1.1.0")
    assert ours["supportedVersions"] == ref["supportedVersions"]
    if plugin == "bandwidth":
        assert ref["supportedVersions"][0] == "0.3.0"
        # a version the plugin does not speak is not echoed (the reference answers its own)
        assert version_of(BIN, plugin, "0.2.0")["cniVersion"] == "1.1.0"


def test_an_unknown_version_is_refused_with_the_references_error(host, pod) -> None:
    cfg = {"cniVersion": "9.9.9", "name": "n", "type": "bridge", "bridge": "br-v"}
    ref = Plugins(host).exec("bridge", "ADD", cfg, netns=pod.path, bin_dir=REF19)
    ours = Plugins(host).exec("bridge", "ADD", cfg, netns=pod.path)
    assert ref[0] == ours[0] == 1
    assert {k: ours[1][k] for k in ("code", "msg", "details")} == ref[1]
    assert "br-v" not in host.links()


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_bandwidth_before_0_3_0_is_refused_as_the_reference_and_makes_nothing(
        plugins, host, pod, netns_factory, version) -> None:
    limits = runtime_bw((8_000_000, 80_000), (8_000_000, 80_000))
    prev = {"cniVersion": version, "ip4": {"ip": "10.77.1.2/24"}}
    sides = {}
    for label, bin_dir, node, ns in (("ref", REF19, netns_factory("pycni-host"),
                                      netns_factory("pycni-pod")), ("ours", BIN, host, pod)):
        w = wire(node, ns, 1)
        cfg = bw_conf(version, **limits) | {"prevResult": prev}
        sides[label] = Plugins(node).exec("bandwidth", "ADD", cfg, netns=ns.path,
                                          bin_dir=bin_dir)
        assert kinds(node, w.veth) == ["noqueue"] and not ifbs(node), label
    (ref_code, ref, _), (code, ours, _) = sides["ref"], sides["ours"]
    assert ref_code == code == 1
    assert ref == {"code": 1, "msg": "incompatible CNI versions",
                   "details": f'config is "{version}", plugin supports '
                              '["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]'}
    assert {k: ours[k] for k in ref} == ref
    # DELIBERATE: our DEL at that version succeeds (the reference's fails with the same error)
    plugins.ok("bandwidth", "DEL", bw_conf(version, **limits), netns=pod.path)


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
@pytest.mark.parametrize("dns", [None, {"nameservers": ["10.0.0.53"]}])
def test_portmap_02_prev_result_without_ips_is_printed_as_it_came(host, pod, netns_factory,
                                                                  version, dns) -> None:
    prev = {"cniVersion": version} | ({"dns": dns} if dns else {})
    cfg = {"cniVersion": version, "name": "pm", "type": "portmap",
           "capabilities": {"portMappings": True}, "prevResult": prev,
           "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 80,
                                               "protocol": "tcp"}]}}
    ref_host = netns_factory("pycni-host")
    ref = Plugins(ref_host).exec("portmap", "ADD", cfg, netns=netns_factory("pycni-pod").path,
                                 bin_dir=REF19)
    ours = Plugins(host).exec("portmap", "ADD", cfg, netns=pod.path)
    assert ref[0] == ours[0] == 0, (ref, ours)
    assert ours[1] == ref[1] == {"cniVersion": version, "dns": dns or {}}
    assert "18080" not in host.run("nft", "list", "ruleset").stdout  # no pod address: no rule


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_portmap_refuses_a_prev_result_of_another_version_without_ips(host, pod, netns_factory,
                                                                     version) -> None:
    """A prevResult that says 1.0.0 under a 0.2.0 config is not a 0.2.0 result handed on: the
    reference cannot parse it, ours cannot print it; both refuse."""
    cfg = {"cniVersion": version, "name": "pm", "type": "portmap",
           "prevResult": {"cniVersion": "1.0.0", "ips": []}}
    ref = Plugins(netns_factory("pycni-host")).exec(
        "portmap", "ADD", cfg, netns=netns_factory("pycni-pod").path, bin_dir=REF19)
    ours = Plugins(host).exec("portmap", "ADD", cfg, netns=pod.path)
    assert ref[0] == ours[0] == 1 and ref[1]["code"] == ours[1]["code"] == 999, (ref, ours)
    assert "cannot convert: no valid IP addresses" in ours[1]["msg"]
