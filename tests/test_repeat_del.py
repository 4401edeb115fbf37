"""containerd 1.6 runs the DEL chain twice per pod, the second time with an empty CNI_NETNS: a
DEL of an attachment a DEL already cleaned answers at once (cni.deleted), and only then."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from bridge_util import conf, ipam_path, masq_rules, reservations
from cnitest import HEAVY_MODULES, probe_binary

from cni import deleted, skel

pytestmark = pytest.mark.root
MARKER = Path(deleted.MARKER_DIR) / "bridge@ctr1@eth0"


def test_second_del_with_empty_netns_is_answered_without_work(plugins, host, netns_factory,
                                                              tmp_path) -> None:
    c = conf(tmp_path, ipMasq=True)
    pod = netns_factory("pycni-pod")
    plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert not MARKER.exists() and reservations(tmp_path) and masq_rules(host)
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert MARKER.is_file() and not reservations(tmp_path) and not masq_rules(host)

    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_PATH": ipam_path(), "PYCNI_SOCKET": "/nonexistent"}
    watch = (*HEAVY_MODULES, "cni.fast.protocol", "cni.plugins.bridge")
    out, code, loaded = probe_binary("bridge", env, json.dumps(c).encode(), watch=watch)
    assert (out.strip(), code, loaded) == ("", 0, [])
    # The same through skel (the daemon's child and the in-process path): the same answer.
    assert skel.run("bridge", env, json.dumps(c).encode()) == skel.Reply(b"", b"", 0)


def test_add_makes_the_attachment_unclean_again(plugins, host, netns_factory, tmp_path) -> None:
    """ADD removes the marker before changing anything, so the empty-netns DEL that follows it
    (ctr's only DEL) does the full work: the reservation and the masquerade rule go."""
    c = conf(tmp_path, ipMasq=True)
    pod = netns_factory("pycni-pod")
    plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    assert MARKER.is_file()
    plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert not MARKER.exists() and reservations(tmp_path) and masq_rules(host)
    plugins.ok("bridge", "DEL", c, netns="", path=ipam_path())
    assert not reservations(tmp_path) and not masq_rules(host)
    assert MARKER.is_file()


@pytest.mark.parametrize("age,netns,expect_fast", [
    (0, "", True),
    (deleted.TTL + 5, "", False),  # too old to trust: the full DEL runs
    (0, "/run/netns/gone", False),  # a netns given: the full DEL runs
])
def test_marker_gate(age, netns, expect_fast) -> None:
    """Stdin the full DEL cannot decode (6; DEL takes any config it can decode) tells which
    path answered."""
    deleted.mark("bridge", "gate1", "eth0", time.time() - age)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "gate1", "CNI_NETNS": netns,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    reply = skel.run("bridge", env, b'{"cniVersion": "1.0.0", "name": "n", "type": "bri')
    if expect_fast:
        assert reply == skel.Reply(b"", b"", 0)
    else:
        assert reply.code == 1 and json.loads(reply.stdout)["code"] == 6


def test_marker_names_are_safe_and_old_markers_are_pruned() -> None:
    """Pruning runs at most once every PRUNE_EVERY seconds (it stats every marker)."""
    for cid, ifname in (("../x", "eth0"), ("a", ".."), ("a", "x/y"), ("", "eth0"),
                        ("a" * 300, "eth0"), (".a", "eth0")):
        deleted.mark("bridge", cid, ifname, time.time())
        assert not deleted.already_clean("bridge", {"CNI_COMMAND": "DEL", "CNI_PATH": "/x",
                                                    "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname},
                                         time.time())
    assert all("/" not in name for name in os.listdir(deleted.MARKER_DIR))
    deleted.mark("loopback", "old", "eth0", time.time() - deleted.TTL - 1)
    deleted.mark("loopback", "new", "eth0", time.time() + deleted.PRUNE_EVERY)  # a prune is due
    names = os.listdir(deleted.MARKER_DIR)
    assert "loopback@old@eth0" not in names and "loopback@new@eth0" in names
