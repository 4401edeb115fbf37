"""cni.host.nft against a real ruleset, inside a throwaway namespace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cnitest import ROOT

pytestmark = pytest.mark.root

PROBE = r"""
import json, sys
sys.path.insert(0, %r)
from cni.host import nft
nft.run('add table ip t\nadd chain ip t c\n'
        'add rule ip t c ip daddr 10.9.9.9 counter comment "a-1"\n'
        'add rule ip t c ip daddr 10.9.9.8 counter comment "b-2"\n')
found = nft.rules("ip", "t", "c")
out = {"comments": [r.get("comment") for r in found]}
try:
    nft.run('add rule ip t c counter comment "ok"\nadd rule ip t nochain counter\n')
except nft.NftError as e:
    out["error"] = str(e)
out["after_failed_batch"] = len(nft.rules("ip", "t"))
nft.run(nft.delete_rules_script([r for r in found if r.get("comment") == "a-1"]))
out["left"] = [r.get("comment") for r in nft.rules("ip", "t")]
out["missing"] = nft.rules("ip", "nosuchtable")
for bad in ('x" ; flush ruleset ; "', "a\nb"):
    try:
        nft.quote(bad)
    except ValueError:
        out.setdefault("refused", []).append(bad)
print(json.dumps(out))
"""


def test_batch_is_atomic_and_rules_are_found_by_comment(host) -> None:
    proc = host.run(sys.executable, "-c", PROBE % str(ROOT))
    out = json.loads(proc.stdout)
    assert out["comments"] == ["a-1", "b-2"]
    assert "nochain" in out["error"] or "No such file" in out["error"]
    assert out["after_failed_batch"] == 2  # the good half of the failed batch did not land
    assert out["left"] == ["b-2"]
    assert out["missing"] == []
    assert len(out["refused"]) == 2
    # and the machine's own ruleset never saw table t
    mine = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "table ip t\n" not in mine


def test_each_namespace_gets_its_own_nftables_context(netns_factory) -> None:
    """libnftables keeps the socket of the namespace a context was made in: one process that
    works in two namespaces (a daemon child, a test) must read and change each one's own."""
    from cni.host import netns, nft

    a, b = netns_factory("pycni-nfta"), netns_factory("pycni-nftb")
    a.run("nft", "add", "table", "ip", "only_in_a")
    with netns.entered(a.path):
        in_a = [o["table"]["name"] for o in nft.list_json("tables") if "table" in o]
    with netns.entered(b.path):
        in_b = [o["table"]["name"] for o in nft.list_json("tables") if "table" in o]
        nft.run("add table ip only_in_b\n")
    assert (in_a, in_b) == (["only_in_a"], [])
    assert "only_in_b" in b.run("nft", "list", "tables").stdout
    assert "only_in_b" not in a.run("nft", "list", "tables").stdout


MASQ_READD = r"""
import json, sys
sys.path.insert(0, %r)
from cni.host import masq, nft
masq.setup(["10.9.0.2/16"], "net", "eth0", "a" * 64)
masq.setup(["10.9.0.3/16"], "net", "eth0", "b" * 64)
masq.setup(["10.9.0.4/16", "fd00::4/64"], "net", "eth0", "a" * 64)  # ADD again: replaces
saddrs = lambda: sorted(str(r["expr"][0]["match"]["right"])
                        for r in nft.rules("inet", masq.TABLE, masq.CHAIN))
out = {"after_readd": saddrs(), "present": sorted(masq.present("net", "eth0", "a" * 64))}
out["removed"] = masq.teardown("net", "eth0", "a" * 64)
out["left"] = saddrs()
out["chains"] = sorted(nft.chains("inet", masq.TABLE))
print(json.dumps(out))
"""


def test_masquerade_add_again_replaces_the_attachments_rules(host) -> None:
    """A second ADD of an attachment (its record chain is there) replaces its rules, whichever
    way the batch finds them; another attachment's stay."""
    from cni.host import masq

    out = json.loads(host.run(sys.executable, "-c", MASQ_READD % str(ROOT)).stdout)
    assert out["after_readd"] == ["10.9.0.3", "10.9.0.4", "fd00::4"]
    assert out["present"] == ["10.9.0.4", "fd00::4"]
    assert out["removed"] == 2 and out["left"] == ["10.9.0.3"]
    assert out["chains"] == sorted([masq.CHAIN, masq.BASE,
                                    masq.record_chain("net", "eth0", "b" * 64)])
