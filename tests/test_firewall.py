"""firewall through the exec'd binary: real rules in a throwaway host namespace, real traffic.

The node is portmap_util's (a bridge br0 with pods, an outside neighbour); its iptables FORWARD
policy is set per test, as a host would have it (accept, or drop as Docker leaves it), with
iptables-nft inside the throwaway namespace only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from cnitest import REFERENCE_BIN, Netns
from portmap_util import OUTSIDE, answered_by, node, servers
from rootskips import missing

from cni import skel
from cni.host import forward, netns, xtforward
from cni.plugins import firewall

__all__ = ["node", "servers"]  # the fixtures, used by name
pytestmark = pytest.mark.root

PORT = 9000
OWNER = "ctr-a eth0 fwnet"


def pods(node) -> list[Netns]:
    return [ns for ns, _ in node.pods.values()]


def conf(prev: dict | None, **keys) -> dict:
    out: dict = {"cniVersion": "1.0.0", "name": "fwnet", "type": "firewall", **keys}
    if prev is not None:
        out["prevResult"] = {**prev, "cniVersion": out["cniVersion"]}
    return out


def forward_policy(host: Netns, policy: str) -> None:
    """`iptables -P FORWARD <policy>` for both families, in the throwaway host only."""
    host.run("iptables-nft", "-P", "FORWARD", policy)
    host.run("ip6tables-nft", "-P", "FORWARD", policy)


def iptables_save(host: Netns, family: int = 4) -> list[str]:
    """The rules as iptables-save prints them, without its dated comments and counters;
    asserting it had nothing to warn about (a table it cannot read)."""
    proc = host.run("iptables-nft-save" if family == 4 else "ip6tables-nft-save")
    text = proc.stdout + proc.stderr
    assert "incompatible" not in text and "Warning" not in text, text
    return [re.sub(r"\[\d+:\d+\]", "[0:0]", line) for line in proc.stdout.splitlines()
            if not line.startswith("#")]


def pod_rules(host: Netns, comment: str = OWNER) -> list[dict]:
    return [o["rule"] for o in host.nft_ruleset().get("nftables", [])
            if "rule" in o and o["rule"].get("comment") == comment]


def ruleset_text(host: Netns) -> str:
    return host.run("nft", "list", "ruleset").stdout


def add(plugins, node, pod, cid="ctr-a", **keys):
    return plugins.ok("firewall", "ADD", conf(node.prev_result(pod), **keys), container_id=cid,
                      netns=pod.path)


# --- traffic ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("policy", ["ACCEPT", "DROP"])
def test_pod_traffic_passes_forward_whatever_the_iptables_policy(plugins, node, servers, host,
                                                                 policy, family) -> None:
    pod_a, _ = pods(node)
    forward_policy(host, policy)
    servers.start(node.outside, "tcp", PORT, "OUT")
    before = answered_by(pod_a, "tcp", OUTSIDE[family], PORT)
    assert before == ("OUT" if policy == "ACCEPT" else "TIMEOUT")

    out = add(plugins, node, pod_a)
    assert out == {**node.prev_result(pod_a), "cniVersion": "1.0.0"}  # passed through
    assert answered_by(pod_a, "tcp", OUTSIDE[family], PORT) == "OUT"
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_a)), container_id="ctr-a",
               netns=pod_a.path)
    ip = node.pod_ip(pod_a, family)
    prefix = f"{ip}/{32 if family == 4 else 128}"
    assert f"-A CNI-FORWARD -s {prefix} -j ACCEPT" in iptables_save(host, family)
    assert len(pod_rules(host)) == 4  # two accepts per address, both families

    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-a", netns=pod_a.path)
    assert pod_rules(host) == []
    assert not any(prefix in line for line in iptables_save(host, family))
    assert answered_by(pod_a, "tcp", OUTSIDE[family], PORT) == before


@pytest.mark.parametrize("policy", ["open", "same-bridge"])
def test_same_bridge_drops_traffic_from_another_isolated_bridge(plugins, node, servers, host,
                                                                netns_factory, policy) -> None:
    pod_a, pod_b = pods(node)
    # A second bridge, br1 10.89.0.1/24, with pod c at 10.89.0.2.
    pod_c = netns_factory("pycni-podc")
    host.run("ip", "link", "add", "br1", "type", "bridge")
    host.run("ip", "link", "set", "br1", "up")
    host.run("ip", "addr", "add", "10.89.0.1/24", "dev", "br1")
    host.run("ip", "link", "add", "vc", "type", "veth", "peer", "name", "eth0", "netns",
             pod_c.name)
    host.run("ip", "link", "set", "vc", "master", "br1", "up")
    pod_c.run("ip", "link", "set", "eth0", "up")
    pod_c.run("ip", "addr", "add", "10.89.0.2/24", "dev", "eth0")
    pod_c.run("ip", "route", "add", "default", "via", "10.89.0.1")
    prev_c = {"cniVersion": "1.0.0", "interfaces": [{"name": "br1"}, {"name": "vc"},
                                                    {"name": "eth0", "sandbox": pod_c.path}],
              "ips": [{"interface": 2, "address": "10.89.0.2/24", "gateway": "10.89.0.1"}]}
    servers.start(pod_a, "tcp", PORT, "A")
    servers.start(pod_c, "tcp", PORT, "C")
    assert answered_by(pod_c, "tcp", node.pod_ip(pod_a, 4), PORT) == "A"

    add(plugins, node, pod_a, ingressPolicy=policy)
    plugins.ok("firewall", "ADD", conf(prev_c, ingressPolicy=policy), container_id="ctr-c",
               netns=pod_c.path)
    isolated = "TIMEOUT" if policy == "same-bridge" else None
    assert answered_by(pod_c, "tcp", node.pod_ip(pod_a, 4), PORT) == (isolated or "A")
    assert answered_by(pod_a, "tcp", "10.89.0.2", PORT) == (isolated or "C")
    # The same bridge and a neighbour that is no isolated bridge still get through.
    assert answered_by(pod_b, "tcp", node.pod_ip(pod_a, 4), PORT) == "A"
    assert answered_by(node.outside, "tcp", node.pod_ip(pod_a, 4), PORT) == "A"
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_a), ingressPolicy=policy),
               container_id="ctr-a", netns=pod_a.path)

    # As the reference's: a bridge's isolation stays after its pods' DEL (others may share it).
    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-a", netns=pod_a.path)
    left = [r["comment"] for r in pod_rules(host, "same-bridge br0")]
    assert left == (["same-bridge br0"] * 2 if policy == "same-bridge" else [])


# --- rules and their owners -------------------------------------------------------------------

def test_del_removes_only_its_own_rules_and_is_idempotent(plugins, node, host) -> None:
    pod_a, pod_b = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_a)
    add(plugins, node, pod_a)  # a re-ADD replaces, never duplicates
    add(plugins, node, pod_b, cid="ctr-b")
    assert len(pod_rules(host)) == 4 and len(pod_rules(host, "ctr-b eth0 fwnet")) == 4
    assert sum("10.88.0.2/32" in line for line in iptables_save(host)) == 2

    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-a", netns=pod_a.path)
    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-a", netns=pod_a.path)
    assert pod_rules(host) == []
    assert len(pod_rules(host, "ctr-b eth0 fwnet")) == 4
    saved = iptables_save(host)
    assert not any("10.88.0.2/32" in line for line in saved)
    assert sum("10.88.0.3/32" in line for line in saved) == 2
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_b)), container_id="ctr-b",
               netns=pod_b.path)


def recorded(host: Netns, cid: str) -> tuple[list[int], list[str]]:
    """The handles of the pod rules the attachment's record names, and its addresses."""
    chain = forward.record_chain(cid, "eth0", "fwnet")
    with netns.entered(host.path):
        rec = forward.read_record(chain)
    assert rec is not None, f"no record {chain}"
    return sorted(rec.handles.get(forward.PODS, [])), rec.addresses


def chains(host: Netns) -> set[str]:
    return {o["chain"]["name"] for o in host.nft_ruleset().get("nftables", [])
            if "chain" in o and o["chain"]["table"] == forward.TABLE}


def test_the_record_points_at_exactly_the_attachments_rules(plugins, node, host) -> None:
    """ADD, CHECK and DEL find an attachment's rules through its record chain (handles), not a
    listing of the table: each record names exactly its own pod rules, for pods added one after
    another and a re-ADD; each address's index chain names the attachment that has it; DEL
    takes the record and the index along."""
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_a)
    add(plugins, node, pod_b, cid="ctr-b")
    add(plugins, node, pod_a)  # a re-ADD: new rules, a new record
    for cid in ("ctr-a", "ctr-b"):
        handles, addrs = recorded(host, cid)
        owner = f"{cid} eth0 fwnet"
        assert handles == sorted(r["handle"] for r in pod_rules(host, owner)), cid
        assert len(handles) == 4 and addrs == [forward.pod_address(r)
                                               for r in pod_rules(host, owner)][::2]
    index = [o["rule"] for o in host.nft_ruleset()["nftables"] if "rule" in o
             and o["rule"]["chain"] == forward.index_chain("10.88.0.2")]
    assert [r["comment"] for r in index] == [forward.record_chain("ctr-a", "eth0", "fwnet")]
    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-a", netns=pod_a.path)
    left = chains(host)
    assert forward.record_chain("ctr-a", "eth0", "fwnet") not in left
    assert forward.index_chain("10.88.0.2") not in left and forward.index_chain("fd88::2") \
        not in left
    assert forward.record_chain("ctr-b", "eth0", "fwnet") in left
    assert forward.index_chain("10.88.0.3") in left
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_b)), container_id="ctr-b",
               netns=pod_b.path)


def request(command: str, prev: dict | None, cid: str) -> skel.Request:
    config = conf(prev)
    return skel.Request("firewall", command, cid, "/dev/null", "eth0", [], [], config, "1.0.0",
                        json.dumps(config).encode(), {},
                        prev_result=config.get("prevResult"))


def test_verbs_list_no_table(plugins, node, host, monkeypatch) -> None:
    """The cost of a verb must not grow with the pods on the node: once the host has its
    chains, ADD, CHECK and DEL read the attachment's own record and index chains and ask
    iptables rule by rule; nothing lists pycni's table or iptables' (GC alone may)."""
    pod_a, pod_b = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_b, cid="ctr-b")  # the host's first pod: its chains made

    def listed(*_args):
        raise AssertionError("a verb listed a table")

    monkeypatch.setattr(forward, "listed", listed)
    monkeypatch.setattr(xtforward, "listing", listed)
    prev = node.prev_result(pod_a)
    with netns.entered(host.path):
        for _ in range(2):  # a fresh ADD, then a re-ADD
            firewall.add(request("ADD", prev, "ctr-a"))
            firewall.check(request("CHECK", prev, "ctr-a"))
        firewall.delete(request("DEL", None, "ctr-a"))
        firewall.delete(request("DEL", prev, "ctr-a"))  # idempotent
    assert pod_rules(host) == []
    saved = iptables_save(host)
    assert not any("10.88.0.2/32" in line for line in saved)
    assert sum("10.88.0.3/32" in line for line in saved) == 2


def test_del_keeps_the_accepts_of_an_address_another_attachment_has(plugins, node,
                                                                     host) -> None:
    """An address reused while a stale attachment still holds it (its DEL comes late): that
    DEL removes its own nft rules, not the iptables accepts the new attachment needs."""
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_a, cid="ctr-old")
    add(plugins, node, pod_a, cid="ctr-new")  # the same addresses
    plugins.ok("firewall", "DEL", conf(node.prev_result(pod_a)), container_id="ctr-old",
               netns=pod_a.path)
    assert pod_rules(host, "ctr-old eth0 fwnet") == []
    assert sum("10.88.0.2/32" in line for line in iptables_save(host)) == 2
    assert sum("fd88::2/128" in line for line in iptables_save(host, 6)) == 2
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_a)), container_id="ctr-new",
               netns=pod_a.path)
    plugins.ok("firewall", "DEL", conf(None), container_id="ctr-new", netns=pod_a.path)
    assert not any("10.88.0.2/32" in line for line in iptables_save(host))
    assert not any(c.startswith(("pycni-att-", "pycni-ip-")) for c in chains(host))


def test_gc_removes_the_rules_of_this_networks_stale_attachments(plugins, node, host) -> None:
    pod_a, pod_b = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_a)
    add(plugins, node, pod_b, cid="ctr-b")
    other = {**conf(node.prev_result(pod_a)), "name": "othernet"}
    plugins.ok("firewall", "ADD", other, container_id="ctr-c", netns=pod_a.path)
    # Without the valid list (libcni's GC without args) nothing goes.
    gc = conf(None) | {"cniVersion": "1.1.0"}
    plugins.ok("firewall", "GC", gc)
    assert len(pod_rules(host)) == 4
    plugins.ok("firewall", "GC", gc | {"cni.dev/valid-attachments": [
        {"containerID": "ctr-b", "ifname": "eth0"}]})
    assert pod_rules(host) == []
    assert len(pod_rules(host, "ctr-b eth0 fwnet")) == 4
    assert len(pod_rules(host, "ctr-c eth0 othernet")) == 4  # another network's: kept
    saved = iptables_save(host)
    # pod a's address is still ctr-c's (othernet): its accepts stay; pod b's too.
    assert sum("10.88.0.2/32" in line for line in saved) == 2
    assert sum("10.88.0.3/32" in line for line in saved) == 2
    plugins.ok("firewall", "GC", gc | {"name": "othernet", "cni.dev/valid-attachments": []})
    assert pod_rules(host, "ctr-c eth0 othernet") == []
    assert not any("10.88.0.2/32" in line for line in iptables_save(host))


def test_check_fails_when_a_rule_is_gone(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_a)
    check = conf(node.prev_result(pod_a))
    plugins.ok("firewall", "CHECK", check, container_id="ctr-a", netns=pod_a.path)

    host.run("iptables-nft", "-D", "CNI-FORWARD", "-s", "10.88.0.2/32", "-j", "ACCEPT")
    code, out, _ = plugins.exec("firewall", "CHECK", check, container_id="ctr-a",
                                netns=pod_a.path)
    assert code != 0 and "10.88.0.2/32" in out["msg"], out

    add(plugins, node, pod_a)  # puts it back
    plugins.ok("firewall", "CHECK", check, container_id="ctr-a", netns=pod_a.path)
    rule = next(r for r in pod_rules(host) if "fd88::2" in str(r["expr"]))
    host.run("nft", "delete", "rule", "inet", forward.TABLE, rule["chain"], "handle",
             str(rule["handle"]))
    code, out, _ = plugins.exec("firewall", "CHECK", check, container_id="ctr-a",
                                netns=pod_a.path)
    assert code != 0 and "fd88::2" in out["msg"], out


def test_host_without_iptables_gets_no_iptables_table(plugins, node, host) -> None:
    """An nftables-only host: nothing written through iptables-nft, no `ip filter` made."""
    pod_a, _ = pods(node)
    add(plugins, node, pod_a)
    tables = {(o["table"]["family"], o["table"]["name"])
              for o in host.nft_ruleset()["nftables"] if "table" in o}
    assert ("ip", "filter") not in tables and ("ip6", "filter") not in tables
    assert ("inet", forward.TABLE) in tables


@pytest.mark.parametrize("keys,named", [
    ({"ingressPolicy": "bogus"}, "ingressPolicy"),
    ({"ingressPolicy": 5}, "ingressPolicy"),
    ({"backend": "nope"}, "backend"),
    ({"iptablesAdminChainName": "-A FORWARD"}, "iptablesAdminChainName"),
    ({"iptablesAdminChainName": "CNI-FORWARD"}, "iptablesAdminChainName"),
    ({"iptablesAdminChainName": "FORWARD"}, "iptablesAdminChainName"),
    ({"iptablesAdminChainName": "ACCEPT"}, "iptablesAdminChainName"),
    ({"firewalldZone": 3}, "firewalldZone"),
], ids=["policy", "policy-type", "backend", "admin-chain", "admin-is-priv", "admin-builtin",
        "admin-verdict", "zone-type"])
def test_bad_keys_are_refused_with_nothing_changed(plugins, node, host, keys, named) -> None:
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    before = (ruleset_text(host), iptables_save(host))
    code, out, _ = plugins.exec("firewall", "ADD", conf(node.prev_result(pod_a), **keys),
                                container_id="ctr-a", netns=pod_a.path)
    assert code != 0 and out["code"] == 7 and named in out["msg"], out
    assert (ruleset_text(host), iptables_save(host)) == before
    # DEL never fails over a config value.
    plugins.ok("firewall", "DEL", conf(node.prev_result(pod_a), **keys), container_id="ctr-a",
               netns=pod_a.path)


def test_a_failed_iptables_add_takes_its_nft_rules_back(plugins, node, host) -> None:
    """iptables refuses the admin chain (a target's name: "chain name may not clash with target
    name"): ADD fails, and its pod and new isolation rules are gone again; iptables' table is as
    it was (its batch failed whole)."""
    pod_a, pod_b = pods(node)
    forward_policy(host, "DROP")
    add(plugins, node, pod_b, cid="ctr-b")
    before = iptables_save(host)
    code, out, _ = plugins.exec("firewall", "ADD", conf(node.prev_result(pod_a),
                                                        iptablesAdminChainName="MARK",
                                                        ingressPolicy="same-bridge"),
                                container_id="ctr-a", netns=pod_a.path)
    assert code != 0 and out["code"] == 999 and "iptables" in out["msg"], out
    assert pod_rules(host) == [] and pod_rules(host, "same-bridge br0") == []
    assert len(pod_rules(host, "ctr-b eth0 fwnet")) == 4
    assert iptables_save(host) == before


def test_isolation_needs_a_bridge_in_the_prev_result(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    before = ruleset_text(host)
    ips = [{"address": ip["address"]} for ip in node.prev_result(pod_a)["ips"]]
    for prev, named in (({"ips": ips}, "ingressPolicy"),
                        ({"ips": ips, "interfaces": [{"name": 'br"0'}]},
                         "prevResult.interfaces[0].name")):
        code, out, _ = plugins.exec("firewall", "ADD", conf(prev, ingressPolicy="same-bridge"),
                                    container_id="ctr-a", netns=pod_a.path)
        assert code != 0 and out["code"] == 7 and named in out["msg"], out
    assert ruleset_text(host) == before


@pytest.mark.parametrize("backend", ["iptables", "firewalld"])
def test_unsupported_backend_is_error_2(plugins, node, host, backend) -> None:
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    before = (ruleset_text(host), iptables_save(host))
    code, out, _ = plugins.exec("firewall", "ADD", conf(node.prev_result(pod_a),
                                                        backend=backend),
                                container_id="ctr-a", netns=pod_a.path)
    assert code != 0 and out["code"] == 2 and backend in out["msg"], out
    assert (ruleset_text(host), iptables_save(host)) == before


def test_missing_prev_result_is_refused(plugins, node) -> None:
    pod_a, _ = pods(node)
    code, out, _ = plugins.exec("firewall", "ADD", conf(None), container_id="ctr-a",
                                netns=pod_a.path)
    assert code != 0 and out["code"] == 7 and "prevResult" in out["msg"], out


def test_concurrent_adds_on_a_fresh_dropping_host_keep_every_rule(plugins, node, host) -> None:
    """The first ADDs on a host race to make the chains: none may lose another's rules (an
    iptables-restore `:CNI-FORWARD` line would flush them), none may double the entry jumps."""
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    ips = [f"10.88.1.{n}" for n in range(2, 12)]
    procs = [subprocess.Popen(
        ["ip", "netns", "exec", host.name, str(plugins.bin_dir / "firewall")],
        env={"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"c{n}",
             "CNI_NETNS": pod_a.path, "CNI_IFNAME": "eth0", "CNI_PATH": str(plugins.bin_dir)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for n in range(len(ips))]
    for proc, ip in zip(procs, ips, strict=True):
        proc.stdin.write(json.dumps(conf({"cniVersion": "1.0.0",
                                          "ips": [{"address": f"{ip}/16"}]})).encode())
        proc.stdin.close()
    for proc in procs:
        assert proc.wait(timeout=120) == 0, (proc.stdout.read(), proc.stderr.read())
    saved = iptables_save(host)
    for ip in ips:
        assert sum(f"{ip}/32" in line for line in saved) == 2, (ip, saved)
    assert sum("-j CNI-FORWARD" in line for line in saved) == 1, saved
    assert sum("-j CNI-ADMIN" in line for line in saved) == 1, saved
    entry = [r for o in host.nft_ruleset()["nftables"] if "rule" in o
             for r in [o["rule"]] if r["table"] == forward.TABLE and r["chain"] == "forward"]
    assert len(entry) == 3
    assert sum(len(pod_rules(host, f"c{n} eth0 fwnet")) for n in range(len(ips))) == 2 * len(ips)


# --- the host's iptables ----------------------------------------------------------------------

DOCKER_LIKE = """*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A DOCKER-USER -j RETURN
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
COMMIT
"""


def test_iptables_save_lists_the_hosts_rules_intact(plugins, node, host) -> None:
    pod_a, pod_b = pods(node)
    host.run("iptables-nft-restore", input=DOCKER_LIKE)
    before = iptables_save(host)

    add(plugins, node, pod_a)
    add(plugins, node, pod_b, cid="ctr-b")
    during = iptables_save(host)
    assert [line for line in during if line in before] == before  # all there, in order
    ours = [line for line in during if line not in before]
    assert sorted(ours) == sorted([
        ":CNI-ADMIN - [0:0]", ":CNI-FORWARD - [0:0]",
        '-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD',
        '-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN',
        *[spec for ip in ("10.88.0.2", "10.88.0.3") for spec in (
            f"-A CNI-FORWARD -d {ip}/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            f"-A CNI-FORWARD -s {ip}/32 -j ACCEPT")]])
    # Our jump comes first in FORWARD, before Docker's own.
    forward_rules = [line for line in during if line.startswith("-A FORWARD")]
    assert "CNI-FORWARD" in forward_rules[0]
    # What iptables-save printed restores as it is.
    host.run("iptables-nft-restore", "--test", input="\n".join(during) + "\n")

    for cid, pod in (("ctr-a", pod_a), ("ctr-b", pod_b)):
        plugins.ok("firewall", "DEL", conf(None), container_id=cid, netns=pod.path)
    after = iptables_save(host)
    assert [line for line in after if line in before] == before
    assert not any("10.88.0." in line for line in after)


def test_pycni_del_removes_the_references_iptables_rules(plugins, node, host) -> None:
    """A node that ran the reference's firewall (iptables backend, Debian's v1.1.1) before
    pycni: its pod's accepts go with pycni's DEL of that pod (given the prevResult, as the
    reference's own DEL needs)."""
    pod_a, _ = pods(node)
    forward_policy(host, "DROP")
    ref = REFERENCE_BIN / "firewall"
    if not ref.exists():
        missing(f"the reference firewall in {REFERENCE_BIN} (scripts/setup.sh)")
    prev = node.prev_result(pod_a)
    plugins.ok("firewall", "ADD", conf(prev, backend="iptables"), container_id="ctr-a",
               netns=pod_a.path, bin_dir=REFERENCE_BIN)
    assert sum("10.88.0.2/32" in line for line in iptables_save(host)) == 2
    plugins.ok("firewall", "DEL", conf(prev), container_id="ctr-a", netns=pod_a.path)
    assert not any("10.88.0.2/32" in line for line in iptables_save(host))
    assert not any("fd88::2/128" in line for line in iptables_save(host, 6))
