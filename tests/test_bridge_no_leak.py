"""bridge ADDs that cannot end in a printed result: refused before anything is made, or undone.

skel prints ADD's result in the config's cniVersion after the plugin returned, so a result that
version cannot carry would fail only once the veth exists. A 0.1.0 / 0.2.0 result is its IP
addresses (the reference's "cannot convert: no valid IP addresses"), so a bridge without ipam at
those versions is refused up front; the reference v1.9.1 makes the veth, fails to print and
leaves the veth behind. An IPAM plugin that reserved an address but answered with something the
bridge cannot use is released again (the reference arms its IPAM DEL only after a decoded result).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from bridge_util import conf, host_veths, ipam_path, reservations
from cnitest import BIN, Plugins

pytestmark = pytest.mark.root

REF19 = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "bin"


def l2(version: str) -> dict:
    return {"cniVersion": version, "name": "l2", "type": "bridge", "bridge": "br-l2"}


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_no_ipam_before_0_3_0_is_refused_before_anything_is_made(plugins, host, pod,
                                                                 netns_factory,
                                                                 version) -> None:
    # The reference says it is an error too, but only after it made the bridge and the veth.
    assert (REF19 / "bridge").exists(), "shared/reference/bin must be beside the checkout"
    ref_host = netns_factory("pycni-host")
    code, out, _ = Plugins(ref_host).exec("bridge", "ADD", l2(version),
                                          netns=netns_factory("pycni-pod").path,
                                          bin_dir=REF19)
    assert code == 1 and out == {"code": 999, "msg": "cannot convert: no valid IP addresses"}

    code, out, _ = plugins.exec("bridge", "ADD", l2(version), netns=pod.path)
    assert host_veths(host) == [] and "br-l2" not in host.links(), "the ADD left its veth"
    assert "eth0" not in pod.links()
    assert code == 1 and out["code"] == 7, out
    assert f'cniVersion "{version}"' in out["msg"] and "ipam" in out["msg"], out
    assert "cannot convert: no valid IP addresses" in out["msg"]
    plugins.ok("bridge", "DEL", l2(version), netns=pod.path)  # DEL at that version still works


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_no_ipam_from_0_3_0_on_attaches_and_deletes(plugins, host, pod, version) -> None:
    out = plugins.ok("bridge", "ADD", l2(version), netns=pod.path)
    assert out["cniVersion"] == version and "ips" not in out
    veth = out["interfaces"][1]["name"]
    assert [i["name"] for i in out["interfaces"]] == ["br-l2", veth, "eth0"]
    assert host.links()[veth]["master"] == "br-l2" and "UP" in pod.links()["eth0"]["flags"]
    plugins.ok("bridge", "DEL", l2(version), netns=pod.path)
    assert host_veths(host) == [] and "eth0" not in pod.links()


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_two_addresses_of_a_family_before_0_3_0_leave_nothing(plugins, host, pod, tmp_path,
                                                              version) -> None:
    # host-local refuses them (the reference's too, after its bridge made the veth, which it
    # keeps): the veth is undone, nothing is reserved. One of each family is printed.
    ranges = [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd00:22::/64"}],
              [{"subnet": "10.23.0.0/24"}]]
    code, out, _ = plugins.exec("bridge", "ADD", conf(tmp_path, version, ranges=ranges),
                                netns=pod.path, path=ipam_path())
    assert code == 1 and out["code"] == 7 and f'cniVersion "{version}"' in out["msg"], out
    assert "more than 1 address per family" in out["msg"]
    assert reservations(tmp_path) == [] and host_veths(host) == []
    assert "eth0" not in pod.links()
    out = plugins.ok("bridge", "ADD", conf(tmp_path, version, ranges=ranges[:2]),
                     netns=pod.path, path=ipam_path())
    assert (out["ip4"]["ip"], out["ip6"]["ip"]) == ("10.22.0.2/24", "fd00:22::2/64"), out
    assert pod.addresses("eth0")[:2] == ["10.22.0.2/24", "fd00:22::2/64"]


# An IPAM plugin in CNI_PATH that runs our host-local (so a real reservation is made), then
# answers ADD with something else; every other verb is host-local's own.
_UNUSABLE_IPAM = """#!/bin/sh
out=$({host_local}) || {{ printf '%s' "$out"; exit 1; }}
if [ "$CNI_COMMAND" = ADD ]; then printf '%s' '{answer}'; else printf '%s' "$out"; fi
"""


@pytest.mark.parametrize("answer, error", [
    ("", "IPAM plugin answering returned no result"),
    ("reserved!", "failed to unmarshal raw result"),
    ('{"cniVersion": "1.0.0", "ips": [{"address": "10.22.0.2/24", "interface": 3}]}',
     "ip interface index 3 out of range"),
    ('{"cniVersion": "9.9.9"}', 'unsupported CNI result version "9.9.9"'),
], ids=["empty", "not-json", "bad-index", "bad-version"])
def test_an_ipam_answer_bridge_cannot_use_is_released(plugins, host, pod, tmp_path, answer,
                                                      error) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "answering"
    script.write_text(_UNUSABLE_IPAM.format(host_local=BIN / "host-local", answer=answer))
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
    c = conf(tmp_path)
    c["ipam"]["type"] = "answering"
    code, out, _ = plugins.exec("bridge", "ADD", c, netns=pod.path,
                                path=f"{bindir}:{ipam_path()}")
    assert code == 1 and error in out["msg"], out
    assert reservations(tmp_path) == [], "the IPAM plugin's reservation leaked"
    assert host_veths(host) == [] and "eth0" not in pod.links()
