"""portmap through the exec'd binary: real rules in a throwaway host namespace, real traffic.

Pods are wired by hand (bridge, veths, addresses) and the prevResult describes that wiring, so
these tests do not depend on the bridge plugin.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from cnitest import ROOT, VENV_PY
from portmap_util import (
    BR,
    FAR,
    HOST_OUT,
    LOCALHOST,
    OUTSIDE,
    answered_by,
    ask,
    node,
    portmap_conf,
    records,
    rules_with,
    servers,
)

from cni import skel
from cni.host import hostport, nft

__all__ = ["node", "servers"]  # the fixtures, used by name
pytestmark = pytest.mark.root

HOST_PORT, POD_PORT = 8080, 80


def pods(node):
    return [ns for ns, _ in node.pods.values()]


def mapping(proto: str = "tcp", host_ip: str | None = None, host_port: int = HOST_PORT,
            pod_port: int = POD_PORT) -> dict:
    m = {"hostPort": host_port, "containerPort": pod_port, "protocol": proto}
    if host_ip is not None:
        m["hostIP"] = host_ip
    return m


def add(plugins, node, pod, mappings, cid="ctr-a", **keys):
    conf = portmap_conf(node.prev_result(pod), mappings, **keys)
    return plugins.ok("portmap", "ADD", conf, container_id=cid, netns=pod.path)


def delete(plugins, node, pod, mappings=None, cid="ctr-a", **keys):
    conf = portmap_conf(None, mappings, **keys)
    return plugins.ok("portmap", "DEL", conf, container_id=cid, netns=pod.path)


# --- traffic ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_hostport_answers_from_everywhere_then_not_after_del(plugins, node, servers, host,
                                                             proto, family) -> None:
    pod_a, pod_b = pods(node)
    servers.start(pod_a, proto, POD_PORT, "A")
    out = add(plugins, node, pod_a, [mapping(proto)])
    assert out == node.prev_result(pod_a)  # passed through unchanged

    pod_a_ip = node.pod_ip(pod_a, family)
    via_bridge = ask(host, proto, BR[family], HOST_PORT)
    assert via_bridge.startswith("A "), via_bridge
    assert answered_by(pod_b, proto, BR[family], HOST_PORT) == "A"
    from_outside = ask(node.outside, proto, HOST_OUT[family], HOST_PORT)
    assert from_outside == f"A {OUTSIDE[family]}"  # the client's address is kept
    hairpin = ask(pod_a, proto, BR[family], HOST_PORT)
    assert hairpin.startswith("A ") and hairpin != f"A {pod_a_ip}"  # masqueraded
    if family == 4:
        assert ask(host, proto, LOCALHOST[4], HOST_PORT) == f"A {BR[4]}"
        assert host.run("sysctl", "-n", "net.ipv4.conf.br0.route_localnet").stdout.strip() == "1"

    delete(plugins, node, pod_a, [mapping(proto)])
    assert rules_with(host, "ctr-a") == []
    gone = "REFUSED" if proto == "tcp" else ("REFUSED", "TIMEOUT")
    assert answered_by(node.outside, proto, HOST_OUT[family], HOST_PORT) in gone
    assert answered_by(host, proto, BR[family], HOST_PORT) in gone


@pytest.mark.parametrize("family", [4, 6])
def test_host_ip_answers_only_on_that_address(plugins, node, servers, host, family) -> None:
    pod_a, _ = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    add(plugins, node, pod_a, [mapping("tcp", host_ip=HOST_OUT[family])])
    assert answered_by(node.outside, "tcp", HOST_OUT[family], HOST_PORT) == "A"
    assert answered_by(node.outside, "tcp", BR[family], HOST_PORT) == "REFUSED"
    assert answered_by(host, "tcp", BR[family], HOST_PORT) == "REFUSED"
    # The other family gets no rule at all from a hostIP of this one.
    other = {4: "ip6", 6: "ip"}[family]
    assert {r["family"] for r in rules_with(host, "ctr-a") if r["chain"] == "hostports"} == {
        {4: "ip", 6: "ip6"}[family]} != {other}


@pytest.mark.parametrize("family", [4, 6])
def test_transit_traffic_is_not_dnated(plugins, node, servers, family) -> None:
    """CVE-2025-67499: a packet routed through the node to another host keeps its target."""
    pod_a, _ = pods(node)
    servers.start(pod_a, "udp", POD_PORT, "A")
    servers.start(node.far, "udp", HOST_PORT, "FAR")
    add(plugins, node, pod_a, [mapping("udp")])
    assert answered_by(node.outside, "udp", FAR[family], HOST_PORT) == "FAR"
    assert answered_by(node.outside, "udp", HOST_OUT[family], HOST_PORT) == "A"


def test_udp_hostport_moved_to_another_pod_answers_at_once(plugins, node, servers,
                                                           host) -> None:
    """#123/#1190: a client that keeps sending (one socket, one flow) reaches B at once."""
    pod_a, pod_b = pods(node)
    servers.start(pod_a, "udp", POD_PORT, "A")
    servers.start(pod_b, "udp", POD_PORT, "B")
    add(plugins, node, pod_a, [mapping("udp")], cid="ctr-a")
    client = servers.stepped_udp_client(node.outside, HOST_OUT[4], HOST_PORT)
    assert client.send().startswith("A ")
    assert "src=10.88.0.2 " in udp_conntrack(host, HOST_PORT)  # the flow is bound to A
    delete(plugins, node, pod_a, cid="ctr-a")
    assert udp_conntrack(host, HOST_PORT) == ""  # DEL dropped it (A still runs)
    add(plugins, node, pod_b, [mapping("udp")], cid="ctr-b")
    assert client.send().startswith("B ")


def udp_conntrack(ns, port: int) -> str:
    return ns.run("conntrack", "-L", "-p", "udp", "--orig-port-dst", str(port)).stdout


def insert_udp_conntrack(ns, dst: str, port: int) -> None:
    """A conntrack entry as a client of `dst:port` leaves it (confirmed, replied)."""
    ns.run("conntrack", "-I", "-p", "udp", "-s", OUTSIDE[4], "-d", dst, "--sport", "40000",
           "--dport", str(port), "-r", dst, "-q", OUTSIDE[4], "--reply-port-src", str(port),
           "--reply-port-dst", "40000", "-t", "60", "-u", "SEEN_REPLY")


def test_add_and_del_flush_udp_conntrack_of_their_host_ports_only(plugins, node,
                                                                  host) -> None:
    pod_a, _ = pods(node)
    for port in (HOST_PORT, 9999):
        insert_udp_conntrack(host, HOST_OUT[4], port)
    add(plugins, node, pod_a, [mapping("udp"), mapping("tcp", host_port=9999)])
    assert udp_conntrack(host, HOST_PORT) == ""  # a stale flow would have skipped the DNAT
    assert "dport=9999" in udp_conntrack(host, 9999)  # TCP mapping: UDP entry untouched
    insert_udp_conntrack(host, HOST_OUT[4], HOST_PORT)
    delete(plugins, node, pod_a, mappings=None)  # ports found from the rules themselves
    assert udp_conntrack(host, HOST_PORT) == ""


def test_masq_all_hides_the_client_address(plugins, node, servers) -> None:
    pod_a, _ = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    add(plugins, node, pod_a, [mapping("tcp")], masqAll=True)
    assert ask(node.outside, "tcp", HOST_OUT[4], HOST_PORT) == f"A {BR[4]}"


def test_snat_false_adds_no_masquerade(plugins, node, servers, host) -> None:
    pod_a, _ = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    add(plugins, node, pod_a, [mapping("tcp")], snat=False)
    assert [r["chain"] for r in rules_with(host, "ctr-a")] == ["hostports", "hostports"]
    assert ask(node.outside, "tcp", HOST_OUT[4], HOST_PORT) == f"A {OUTSIDE[4]}"


def test_conditions_take_any_match_nftables_accepts(plugins, node, servers, host) -> None:
    """`meta pkttype host` was refused by the old word allow-list; nft accepts it."""
    pod_a, _ = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    add(plugins, node, pod_a, [mapping("tcp")], conditionsV4=["meta pkttype host"],
        conditionsV6=["meta", "pkttype", "host", "ip6 saddr != fd99::/64"])
    pre = [r for r in host.nft_ruleset()["nftables"] if "rule" in r
           and r["rule"]["chain"] == "prerouting"]
    assert {r["rule"]["family"] for r in pre if "pkttype" in str(r["rule"]["expr"])} == {
        "ip", "ip6"}
    assert answered_by(node.outside, "tcp", HOST_OUT[4], HOST_PORT) == "A"
    assert answered_by(node.outside, "tcp", HOST_OUT[6], HOST_PORT) == "A"


def test_conditions_restrict_who_is_forwarded(plugins, node, servers) -> None:
    pod_a, pod_b = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    add(plugins, node, pod_a, [mapping("tcp")],
        conditionsV4=["ip", "saddr", "!=", "{ 192.168.77.0/24, 192.0.2.1 }"])
    assert answered_by(node.outside, "tcp", HOST_OUT[4], HOST_PORT) == "REFUSED"
    assert answered_by(pod_b, "tcp", BR[4], HOST_PORT) == "A"
    assert answered_by(node.outside, "tcp", HOST_OUT[6], HOST_PORT) == "A"  # v4 only


# --- rules: ownership, DEL, re-ADD, CHECK, GC -------------------------------------------------

def test_readd_replaces_and_del_needs_no_mappings(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    add(plugins, node, pod_a, [mapping("tcp"), mapping("udp", host_port=5353, pod_port=53)])
    first = len(rules_with(host, "ctr-a"))
    assert first == 2 * 2 + 2 + 1  # a DNAT per mapping and family; v4 2 masq, v6 1
    add(plugins, node, pod_a, [mapping("tcp"), mapping("udp", host_port=5353, pod_port=53)])
    assert len(rules_with(host, "ctr-a")) == first
    delete(plugins, node, pod_a, mappings=None)
    assert rules_with(host, "ctr-a") == []
    delete(plugins, node, pod_a, mappings=None)  # idempotent
    tables = {o["table"]["family"] for o in host.nft_ruleset()["nftables"] if "table" in o}
    assert tables == {"ip", "ip6"}  # tables and chains stay


def test_del_without_any_table_is_success(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    delete(plugins, node, pod_a, [mapping("tcp")])
    assert host.nft_ruleset()["nftables"][1:] == []  # only the metainfo object


def test_del_of_one_container_keeps_the_others(plugins, node, host) -> None:
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")
    before_b = rules_with(host, "ctr-b")
    delete(plugins, node, pod_a, cid="ctr-a")
    assert rules_with(host, "ctr-a") == [] and rules_with(host, "ctr-b") == before_b


def test_check_passes_then_fails_when_a_rule_is_gone(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    conf = portmap_conf(node.prev_result(pod_a), [mapping("tcp")])
    plugins.ok("portmap", "ADD", conf, container_id="ctr-a", netns=pod_a.path)
    plugins.ok("portmap", "CHECK", conf, container_id="ctr-a", netns=pod_a.path)
    dnat = next(r for r in rules_with(host, "ctr-a") if r["family"] == "ip6"
                and r["chain"] == "hostports")
    host.run("nft", "delete", "rule", "ip6", "cni_hostport", "hostports",
             "handle", str(dnat["handle"]))
    code, out, _ = plugins.exec("portmap", "CHECK", conf, container_id="ctr-a",
                                netns=pod_a.path)
    assert code == 1 and "missing hostport rule" in out["msg"], out


def recorded_rules(host, family: str, chain: str) -> list[dict]:
    """The rules a record's meta points at (record chain handle + offsets), as listed."""
    objs = host.nft_ruleset().get("nftables", [])
    base = next(o["chain"]["handle"] for o in objs if "chain" in o
                and o["chain"]["family"] == family and o["chain"]["name"] == chain)
    wanted = set()
    for o in objs:
        rule = o.get("rule", {})
        words = str(rule.get("comment", "")).split(" ")
        if rule.get("family") == family and rule.get("chain") == chain and words[0] == "=h":
            wanted |= {(words[1], base + int(n)) for n in words[2].split(",")}
    return [o["rule"] for o in objs if "rule" in o and o["rule"]["family"] == family
            and (o["rule"]["chain"], o["rule"]["handle"]) in wanted]


def test_the_record_points_at_exactly_the_attachments_rules(plugins, node, host) -> None:
    """DEL and CHECK find an attachment's rules through its record (handles), not a listing of
    the table: each record must name exactly its own rules, for pods added one after another."""
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_a, [mapping("tcp"), mapping("udp")], cid="ctr-a")
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")
    add(plugins, node, pod_a, [mapping("tcp", host_port=8082)], cid="ctr-a")  # a re-ADD
    for cid in ("ctr-a", "ctr-b"):
        chain = hostport.record_chain(cid, "pmnet", "eth0")
        for family in ("ip", "ip6"):
            mine = [r for r in rules_with(host, cid) if r["family"] == family]
            assert mine and sorted(r["handle"] for r in recorded_rules(host, family, chain)) \
                == sorted(r["handle"] for r in mine)
    assert not any("8080" in str(r["expr"]) for r in rules_with(host, "ctr-a"))
    delete(plugins, node, pod_a, cid="ctr-a")
    assert rules_with(host, "ctr-a") == [] and rules_with(host, "ctr-b")
    assert [c for _, c, _ in records(host)] == 2 * [hostport.record_chain("ctr-b", "pmnet",
                                                                         "eth0")]


def second_network(node, pod, name="othernet", ifname="net1", n=5) -> dict:
    """A second attachment of the same container: another network, interface and address."""
    prev = node.prev_result(pod, ifname=ifname)
    prev["ips"] = [{"interface": 2, "address": f"10.66.0.{n}/24"},
                   {"interface": 2, "address": f"fd66::{n}/64"}]
    conf = portmap_conf(prev, [mapping("tcp", host_port=9090)])
    conf["name"] = name
    return conf


def test_rules_carry_the_bare_container_id_and_a_record_per_attachment(plugins, node,
                                                                        host) -> None:
    """The reference's DEL and CHECK select rules whose comment equals the container ID."""
    pod_a, _ = pods(node)
    add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
    assert {r["comment"] for r in rules_with(host, "ctr-a")} == {"ctr-a"}
    assert {r["chain"] for r in rules_with(host, "ctr-a")} == {"hostports", "masquerading"}
    # sha512("pmnet")[:16] - sha512("eth0:ctr-a")[:16], worked out once by hand (hashlib).
    chain = "pycni-att-283a4b7588489c88-376ebbf2634c3ec2"
    assert records(host) == [("ip", chain, "ctr-a"), ("ip6", chain, "ctr-a")]
    delete(plugins, node, pod_a, cid="ctr-a")
    assert rules_with(host, "ctr-a") == [] and records(host) == []


def test_del_of_one_network_keeps_the_same_containers_other_network(plugins, node,
                                                                    host) -> None:
    pod_a, _ = pods(node)
    add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
    plugins.ok("portmap", "ADD", second_network(node, pod_a), container_id="ctr-a",
               netns=pod_a.path, ifname="net1")
    delete(plugins, node, pod_a, cid="ctr-a")  # pmnet / eth0
    left = rules_with(host, "ctr-a")
    assert left and all("10.66.0.5" in str(r["expr"]) or "fd66::5" in str(r["expr"])
                        for r in left)
    assert len(records(host)) == 2  # othernet's, v4 and v6
    plugins.ok("portmap", "DEL", second_network(node, pod_a) | {"prevResult": None},
               container_id="ctr-a", netns=pod_a.path, ifname="net1")
    assert rules_with(host, "ctr-a") == [] and records(host) == []


def test_gc_removes_rules_of_attachments_not_valid(plugins, node, host) -> None:
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
    add(plugins, node, pod_b, [mapping("udp")], cid="ctr-b")
    plugins.ok("portmap", "ADD", second_network(node, pod_b), container_id="ctr-b",
               netns=pod_b.path, ifname="net1")
    # A rule the reference wrote: no record, so no network; GC can't tell whose it is.
    for line in REFERENCE_ENTRY:
        host.run("nft", line)
    host.run("nft", 'add rule ip cni_hostport hostports tcp dport 7777 dnat to 10.88.0.50:80 '
             'comment "ctr-ref"')
    gc = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap",
          "cni.dev/valid-attachments": [{"containerID": "ctr-b", "ifname": "eth0"}]}
    plugins.ok("portmap", "GC", gc)
    assert rules_with(host, "ctr-a") == []
    b_rules = rules_with(host, "ctr-b")
    assert any("10.88.0.3" in str(r["expr"]) for r in b_rules)
    gc["cni.dev/valid-attachments"] = []
    plugins.ok("portmap", "GC", gc)
    b_rules = rules_with(host, "ctr-b")
    assert b_rules and not any("10.88.0.3" in str(r["expr"]) or "fd88::3" in str(r["expr"])
                               for r in b_rules)
    # another network's rules are not ours to collect, nor are rules without a record
    assert [c for _, c, _ in records(host)] == 2 * [hostport.record_chain("ctr-b", "othernet",
                                                                         "net1")]
    assert len(rules_with(host, "ctr-ref")) == 1
    code, out, err = plugins.exec("portmap", "GC", {k: v for k, v in gc.items()
                                                   if k != "cni.dev/valid-attachments"})
    assert code == 0 and "no rule removed" in err, (out, err)
    assert len(rules_with(host, "ctr-b")) == len(b_rules)
    delete(plugins, node, pod_a, cid="ctr-ref")  # the reference's rule goes by its comment
    assert rules_with(host, "ctr-ref") == []


def test_a_record_left_by_the_references_del_goes_at_the_next_gc(plugins, node, host) -> None:
    """The reference's DEL removes the rules whose comment is the container ID (ours too), not
    our record chain: a GC of any network removes the orphan."""
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")
    for r in rules_with(host, "ctr-a"):  # what the reference's unforwardPorts deletes
        host.run("nft", "delete", "rule", r["family"], "cni_hostport", r["chain"], "handle",
                 str(r["handle"]))
    assert len(records(host)) == 4
    plugins.ok("portmap", "GC", {"cniVersion": "1.1.0", "name": "elsewhere", "type": "portmap",
                                 "cni.dev/valid-attachments": []})
    assert {c for _, c, _ in records(host)} == {hostport.record_chain("ctr-b", "pmnet",
                                                                      "eth0")}
    assert rules_with(host, "ctr-b")


# Every ADD, the reference's (knftables) and every pycni release's, writes its entry rules anew
# in the same transaction as its container rules (hostport.ALL_RECORDED relies on it).
REFERENCE_ENTRY = [f"{verb} ip{six} cni_hostport {chain}{rule}"
                   for six in ("", "6") for chain in ("prerouting", "output")
                   for verb, rule in (("flush chain", ""),
                                      ("add rule", " fib daddr type local jump hostports_all"))]

REFERENCE_V19 = [  # what the reference's forwardPorts (knftables) writes for ctr-a / pod a
    *REFERENCE_ENTRY,
    'add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.88.0.2:80 comment "ctr-a"',
    "add rule ip cni_hostport masquerading ip saddr 10.88.0.2 ip daddr 10.88.0.2 masquerade "
    'comment "ctr-a"',
    "add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr 10.88.0.2 masquerade "
    'comment "ctr-a"',
    'add rule ip6 cni_hostport hostports tcp dport 8080 dnat to [fd88::2]:80 comment "ctr-a"',
    "add rule ip6 cni_hostport masquerading ip6 saddr fd88::2 ip6 daddr fd88::2 masquerade "
    'comment "ctr-a"',
]


def test_rules_the_reference_wrote_pass_our_check_and_go_with_our_del(plugins, node,
                                                                      host) -> None:
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")  # the tables
    for line in REFERENCE_V19:
        host.run("nft", line)
    conf = portmap_conf(node.prev_result(pod_a), [mapping("tcp")])
    plugins.ok("portmap", "CHECK", conf, container_id="ctr-a", netns=pod_a.path)
    delete(plugins, node, pod_a, cid="ctr-a")
    assert rules_with(host, "ctr-a") == [] and rules_with(host, "ctr-b")


REF19 = ROOT.parent / "shared" / "reference" / "bin"


def test_del_without_mappings_removes_what_the_reference_add_made(plugins, node, host) -> None:
    """The reference v1.9.1's own ADD (after a swap), on a table our ADD vouched for: our DEL,
    given no portMappings, still finds its rules (by their comment; it has no record)."""
    assert (REF19 / "portmap").exists(), "shared/reference/bin must be beside the checkout"
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")
    conf = portmap_conf(node.prev_result(pod_a), [mapping("tcp")], backend="nftables")
    plugins.ok("portmap", "ADD", conf, container_id="ctr-a", netns=pod_a.path, bin_dir=REF19)
    assert len(rules_with(host, "ctr-a")) == 5  # v4: dnat, 2 masquerade; v6: dnat, masquerade
    delete(plugins, node, pod_a, cid="ctr-a")
    assert rules_with(host, "ctr-a") == [] and len(rules_with(host, "ctr-b")) == 5


def test_del_of_an_attachment_without_a_record_lists_no_table(plugins, node, host) -> None:
    """A pod whose ADD had no mappings: its DEL reads the small chains that say nothing of it
    is there, not the table, which grows with every pod on the node (hostport.ALL_RECORDED)."""
    pod_a, pod_b = pods(node)
    add(plugins, node, pod_b, [mapping("tcp", host_port=8081)], cid="ctr-b")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "ctr-a", "CNI_NETNS": pod_a.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    script = ("import json\nfrom cni import skel\nfrom cni.host import nft\n"
              "seen, list_json = [], nft.list_json\n"
              "nft.list_json = lambda what: seen.append(what) or list_json(what)\n"
              f"reply = skel.run('portmap', {env!r}, {json.dumps(portmap_conf(None, None))!r}"
              ".encode())\nprint(json.dumps([reply.code, reply.stdout.decode(), seen]))\n")
    proc = subprocess.run(["ip", "netns", "exec", host.name, str(VENV_PY), "-c", script],
                          cwd=ROOT, capture_output=True, check=True)
    code, out, seen = json.loads(proc.stdout)
    assert code == 0, out
    assert seen and not [what for what in seen if what.startswith("table ")], seen
    assert len(rules_with(host, "ctr-b")) == 5


LEGACY = [  # what pycni wrote before the v1.9 layout: comment "<cid> <network> <ifname>"
    *REFERENCE_ENTRY,
    "add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.88.0.2:80 "
    'comment "ctr-a pmnet eth0"',
    "add rule ip cni_hostport masquerading ip saddr 10.88.0.2 ip daddr 10.88.0.2 masquerade "
    'comment "ctr-a pmnet eth0"',
    "add rule ip6 cni_hostport hostports tcp dport 8080 dnat to [fd88::2]:80 "
    'comment "ctr-a pmnet eth0"',
]


@pytest.mark.parametrize("verb", ["DEL", "GC", "ADD"])
def test_rules_of_earlier_releases_are_removed(plugins, node, host, verb) -> None:
    pod_a, _ = pods(node)
    add(plugins, node, pod_a, [mapping("tcp", host_port=8081)], cid="ctr-z")
    for line in LEGACY:
        host.run("nft", line)
    for family in ("ip", "ip6"):  # a table an older release wrote to: it says nothing of legacy
        host.run("nft", "delete", "chain", family, "cni_hostport", hostport.NO_LEGACY)
    assert len(rules_with(host, "ctr-a pmnet eth0")) == 3
    if verb == "DEL":
        delete(plugins, node, pod_a, cid="ctr-a")
    elif verb == "GC":
        plugins.ok("portmap", "GC", {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap",
                                     "cni.dev/valid-attachments": [
                                         {"containerID": "ctr-z", "ifname": "eth0"}]})
    else:  # a re-ADD after the upgrade replaces them
        add(plugins, node, pod_a, [mapping("tcp")], cid="ctr-a")
        assert {r["comment"] for r in rules_with(host, "ctr-a")} == {"ctr-a"}
    assert rules_with(host, "ctr-a pmnet eth0") == []
    assert rules_with(host, "ctr-z")  # someone else's stay


def test_status(plugins, monkeypatch) -> None:
    """STATUS checks that nftables is usable: ready here; 50 naming nftables when it is not."""
    conf = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap"}
    assert plugins.ok("portmap", "STATUS", conf) is None  # ready: nothing on stdout
    monkeypatch.setattr(nft, "available", lambda: (False, "libnftables is not usable: test"))
    reply = skel.run("portmap", {"CNI_COMMAND": "STATUS", "CNI_PATH": "/nonexistent"},
                     json.dumps(conf).encode())
    out = json.loads(reply.stdout)
    assert reply.code == 1 and out["code"] == 50, out
    assert out["msg"] == "portmap: nftables is not usable: libnftables is not usable: test"


# --- chaining contract ------------------------------------------------------------------------

def test_no_mappings_passes_prev_result_through_and_touches_nothing(plugins, node,
                                                                    host) -> None:
    pod_a, _ = pods(node)
    for mappings in (None, []):
        out = add(plugins, node, pod_a, mappings)
        assert out == node.prev_result(pod_a)
    assert host.nft_ruleset()["nftables"][1:] == []  # only the metainfo object


def test_add_without_prev_result_is_an_error(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    code, out, _ = plugins.exec("portmap", "ADD", portmap_conf(None, [mapping()]),
                                container_id="ctr-a", netns=pod_a.path)
    assert code == 1 and out["code"] == 7 and "prevResult" in out["msg"]
    assert host.nft_ruleset()["nftables"][1:] == []


BAD = [
    ({"backend": "iptables"}, None, 2, "backend"),
    ({"backend": "ebpf"}, None, 7, "backend"),
    ({"externalSetMarkChain": "KUBE MARK; flush ruleset"}, None, 7,
     'externalSetMarkChain "KUBE MARK; flush ruleset"'),
    ({"externalSetMarkChain": "-j"}, None, 7, 'externalSetMarkChain "-j"'),
    ({"externalSetMarkChain": "K" * 29}, None, 7, "externalSetMarkChain"),
    ({"externalSetMarkChain": 5}, None, 7, "externalSetMarkChain"),
    ({"externalSetMarkChain": "KUBE-MARK-MASQ", "markMasqBit": 14}, None, 7, "markMasqBit 14"),
    ({"markMasqBit": 32}, None, 7, "markMasqBit"),
    ({"snat": "yes"}, None, 7, "snat"),
    ({}, {"hostPort": 0, "containerPort": 80, "protocol": "tcp"}, 7,
     "portMappings[1].hostPort 0"),
    ({}, {"hostPort": 8081, "containerPort": 65536, "protocol": "tcp"}, 7,
     "portMappings[1].containerPort 65536"),
    ({}, {"hostPort": "8081", "containerPort": 80, "protocol": "tcp"}, 7, "hostPort"),
    ({}, {"hostPort": 8081, "containerPort": 80, "protocol": "icmp"}, 7,
     'portMappings[1].protocol "icmp"'),
    ({}, {"hostPort": 8081, "containerPort": 80,
          "protocol": "tcp dport 1 accept; flush ruleset"}, 7, "protocol"),
    ({}, {"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": "10.0.0.300"},
     7, "hostIP"),
    ({}, {"hostPort": 8081, "containerPort": 80, "protocol": "tcp",
          "hostIP": "1.2.3.4 tcp dport 22 accept"}, 7, "hostIP"),
    ({"conditionsV4": ["ip daddr 1.2.3.4; flush ruleset"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["ip", "daddr", "1.2.3.4", "accept"]}, None, 7, "conditionsV4"),
    ({"conditionsV6": ["jump", "hostports"]}, None, 7, "conditionsV6"),
    ({"conditionsV4": ["ip daddr 1.2.3.4\nadd rule ip cni_hostport hostports drop"]}, None,
     7, "conditionsV4"),
    ({"conditionsV4": ["meta mark set 1"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["ip daddr 10.0.0.1 counter"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["tcp dport", "{ 1, 2 } dnat to 1.2.3.4"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": "ip daddr 1.2.3.4"}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["meta pkttype bogus"]}, None, 7, "conditionsV4"),  # nft refuses it
    ({"conditionsV6": ["ip saddr 10.0.0.0/8"]}, None, 7, "conditionsV6"),  # wrong family
    ({"conditionsV4": ["ip saddr @evil"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["ip saddr 10.0.0.1 log"]}, None, 7, "conditionsV4"),
    ({"conditionsV4": ["ct count over 10"]}, None, 7, "conditionsV4"),
]


@pytest.mark.parametrize("keys,extra,code,named", BAD)
def test_bad_input_is_refused_and_changes_nothing(plugins, node, host, keys, extra, code,
                                                  named) -> None:
    pod_a, _ = pods(node)
    add(plugins, node, pod_a, [mapping()], cid="ctr-ok")  # tables exist, with a rule
    before = host.run("nft", "list", "ruleset").stdout
    mappings = [mapping("udp")] + ([extra] if extra else [])
    conf = portmap_conf(node.prev_result(pod_a), mappings, **keys)
    rc, out, _ = plugins.exec("portmap", "ADD", conf, container_id="ctr-bad", netns=pod_a.path)
    assert rc == 1 and out["code"] == code and named in out["msg"], out
    assert host.run("nft", "list", "ruleset").stdout == before


def test_host_ip_of_a_family_the_pod_lacks_is_skipped(plugins, node, host, servers) -> None:
    """As the reference: a wrong-family hostIP maps nothing, the rest is set up; we say so."""
    pod_a, _ = pods(node)
    servers.start(pod_a, "tcp", POD_PORT, "A")
    prev = node.prev_result(pod_a)
    prev["ips"] = prev["ips"][:1]  # v4 only
    conf = portmap_conf(prev, [mapping(host_ip="fd77::1"), mapping(host_port=8082)])
    rc, out, err = plugins.exec("portmap", "ADD", conf, container_id="ctr-a", netns=pod_a.path)
    assert rc == 0 and out == prev, out
    assert "portMappings[0]: hostIP fd77::1 skipped" in err
    dnat = [r for r in rules_with(host, "ctr-a") if r["chain"] == "hostports"]
    assert [r["family"] for r in dnat] == ["ip"] and "8082" in str(dnat[0]["expr"])
    assert answered_by(node.outside, "tcp", HOST_OUT[4], 8082) == "A"
    assert answered_by(node.outside, "tcp", HOST_OUT[6], HOST_PORT) == "REFUSED"


def test_failing_batch_changes_nothing(plugins, node, host) -> None:
    """A prerouting chain of another type makes nft refuse the batch half-way through."""
    pod_a, _ = pods(node)
    host.run("nft", "add table ip cni_hostport; add chain ip cni_hostport prerouting "
             "{ type filter hook prerouting priority 0 ; }")
    before = host.run("nft", "list", "ruleset").stdout
    rc, out, _ = plugins.exec("portmap", "ADD",
                              portmap_conf(node.prev_result(pod_a), [mapping()]),
                              container_id="ctr-a", netns=pod_a.path)
    assert rc == 1 and "nftables" in out["msg"], out
    assert host.run("nft", "list", "ruleset").stdout == before


def test_chain_with_the_real_bridge_plugin(plugins, host, pod, servers) -> None:
    bridge_conf = {"cniVersion": "1.1.0", "name": "pmchain", "type": "bridge",
                   "bridge": "cni-pm0", "isGateway": True, "hairpinMode": True,
                   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]]}}
    prev = plugins.ok("bridge", "ADD", bridge_conf, container_id="ctr-chain", netns=pod.path)
    conf = portmap_conf(prev, [mapping("tcp")])
    conf["name"] = "pmchain"
    assert plugins.ok("portmap", "ADD", conf, container_id="ctr-chain", netns=pod.path) == prev
    servers.start(pod, "tcp", POD_PORT, "P")
    assert answered_by(host, "tcp", "10.77.0.1", HOST_PORT) == "P"
    assert answered_by(host, "tcp", LOCALHOST[4], HOST_PORT) == "P"
    assert answered_by(pod, "tcp", "10.77.0.1", HOST_PORT) == "P"  # hairpin
    plugins.ok("portmap", "DEL", conf, container_id="ctr-chain", netns=pod.path)
    plugins.ok("bridge", "DEL", bridge_conf, container_id="ctr-chain", netns=pod.path)
    assert rules_with(host, "ctr-chain") == []
