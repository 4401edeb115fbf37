"""firewall across a swap with the reference (Debian's v1.1.1, iptables backend: v1.9.1's
iptables.go writes and checks the same rules), on a throwaway host whose FORWARD drops, with
iptables-nft and with iptables-legacy (x_tables, which nft cannot see), and real TCP from a pod
through the host's bridge to a neighbour.

The reference calls `iptables` from PATH: it is given a PATH whose iptables and ip6tables are
the chosen backend's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cnitest import REFERENCE_BIN, Netns, Plugins
from portmap_util import OUTSIDE, answered_by, node, servers
from rootskips import missing, skip_unless
from test_daemon import scenario, start_daemon
from test_firewall import PORT, chains, conf, pod_rules, pods

__all__ = ["node", "servers", "start_daemon"]  # the fixtures, used by name
pytestmark = [pytest.mark.root,
              skip_unless((REFERENCE_BIN / "firewall").exists(),
                          f"the reference firewall in {REFERENCE_BIN} (scripts/setup.sh)")]

BACKENDS = ("nft", "legacy")


def reference_path(tmp_path: Path, backend: str) -> dict[str, str]:
    """PATH for the reference: its `iptables` and `ip6tables` are `backend`'s."""
    bin_dir = tmp_path / f"iptables-{backend}"
    bin_dir.mkdir()
    for tool in ("iptables", "ip6tables"):
        for suffix in ("", "-save", "-restore"):
            (bin_dir / f"{tool}{suffix}").symlink_to(f"/usr/sbin/{tool}-{backend}{suffix}")
    return {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}


def drop_forward(host: Netns, backend: str, families: tuple[int, ...]) -> None:
    """`iptables -P FORWARD DROP` with that backend, in the throwaway host only."""
    if backend == "legacy" and not Path("/proc/net/ip_tables_names").exists():
        missing("x_tables in the kernel (ip_tables, ip6_tables), for iptables-legacy")
    for family in families:
        host.run(f"{'ip6' if family == 6 else 'ip'}tables-{backend}", "-P", "FORWARD", "DROP")


def saved(host: Netns, backend: str, family: int = 4) -> list[str]:
    tool = f"{'ip6' if family == 6 else 'ip'}tables-{backend}-save"
    return [line for line in host.run(tool).stdout.splitlines() if line.startswith("-A")]


def reaches(pod: Netns) -> list[str]:
    return [answered_by(pod, "tcp", OUTSIDE[family], PORT) for family in (4, 6)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pycni_checks_and_deletes_the_references_attachment(plugins, node, servers, host,
                                                            tmp_path, backend) -> None:
    """A node swapped from the reference to pycni: CRI-O CHECKs every pod after its restart,
    then DELs them; pycni's CHECK passes on the reference's rules and its DEL removes them
    (else a later pod with the same address inherits them)."""
    pod_a, _ = pods(node)
    drop_forward(host, backend, (4, 6))
    servers.start(node.outside, "tcp", PORT, "OUT")
    assert reaches(pod_a) == ["TIMEOUT", "TIMEOUT"]
    prev = node.prev_result(pod_a)
    ref = {"bin_dir": REFERENCE_BIN, "env": reference_path(tmp_path, backend)}

    plugins.ok("firewall", "ADD", conf(prev), container_id="ctr-a", netns=pod_a.path, **ref)
    assert "-A CNI-FORWARD -s 10.88.0.2/32 -j ACCEPT" in saved(host, backend)
    assert "-A CNI-FORWARD -s fd88::2/128 -j ACCEPT" in saved(host, backend, 6)
    assert reaches(pod_a) == ["OUT", "OUT"]

    plugins.ok("firewall", "CHECK", conf(prev), container_id="ctr-a", netns=pod_a.path)
    # A rule gone is still seen as gone.
    rule = ["CNI-FORWARD", "-d", "fd88::2/128", "-m", "conntrack", "--ctstate",
            "RELATED,ESTABLISHED", "-j", "ACCEPT"]
    host.run(f"ip6tables-{backend}", "-D", *rule)
    code, out, _ = plugins.exec("firewall", "CHECK", conf(prev), container_id="ctr-a",
                                netns=pod_a.path)
    assert code != 0 and out["code"] == 999 and "fd88::2/128" in out["msg"], out
    host.run(f"ip6tables-{backend}", "-A", *rule)

    plugins.ok("firewall", "DEL", conf(prev), container_id="ctr-a", netns=pod_a.path)
    assert not any("10.88.0.2/32" in line for line in saved(host, backend))
    assert not any("fd88::2/128" in line for line in saved(host, backend, 6))
    assert reaches(pod_a) == ["TIMEOUT", "TIMEOUT"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_reference_checks_and_deletes_pycnis_attachment(plugins, node, servers, host,
                                                            tmp_path, backend) -> None:
    """A node swapped back from pycni to the reference, FORWARD dropping in IPv4 alone (Docker
    without IPv6): pycni's ADD has written the reference's rules in both families (the reference
    makes both and its CHECK wants both), so its CHECK and DEL work; the accepts its DEL leaves
    in `inet cni_firewall` (no-ops in a chain whose policy accepts) go with pycni's GC."""
    pod_a, pod_b = pods(node)
    drop_forward(host, backend, (4,))
    servers.start(node.outside, "tcp", PORT, "OUT")
    assert reaches(pod_a) == ["TIMEOUT", "OUT"]
    prev = node.prev_result(pod_a)
    ref = {"bin_dir": REFERENCE_BIN, "env": reference_path(tmp_path, backend)}

    plugins.ok("firewall", "ADD", conf(prev), container_id="ctr-a", netns=pod_a.path)
    plugins.ok("firewall", "ADD", conf(node.prev_result(pod_b)), container_id="ctr-b",
               netns=pod_b.path)
    assert reaches(pod_a) == ["OUT", "OUT"]
    assert "-A CNI-FORWARD -s fd88::2/128 -j ACCEPT" in saved(host, backend, 6)

    plugins.ok("firewall", "CHECK", conf(prev), container_id="ctr-a", netns=pod_a.path, **ref)
    plugins.ok("firewall", "DEL", conf(prev), container_id="ctr-a", netns=pod_a.path, **ref)
    assert not any("10.88.0.2/32" in line for line in saved(host, backend))
    assert reaches(pod_a) == ["TIMEOUT", "OUT"]
    assert len(pod_rules(host, "ctr-a eth0 fwnet")) == 4  # left by the reference's DEL

    gc = conf(None) | {"cniVersion": "1.1.0", "cni.dev/valid-attachments": [
        {"containerID": "ctr-b", "ifname": "eth0"}]}
    plugins.ok("firewall", "GC", gc)
    assert pod_rules(host, "ctr-a eth0 fwnet") == []
    left = chains(host)
    assert not any(c.endswith(("10.88.0.2", "fd88__2")) for c in left), left
    assert len(pod_rules(host, "ctr-b eth0 fwnet")) == 4
    assert sum("10.88.0.3/32" in line for line in saved(host, backend)) == 2
    plugins.ok("firewall", "CHECK", conf(node.prev_result(pod_b)), container_id="ctr-b",
               netns=pod_b.path, **ref)


def test_the_daemon_writes_the_callers_legacy_iptables(netns_factory, start_daemon,
                                                        tmp_path) -> None:
    """x_tables are per network namespace: the daemon (in another namespace) finds and writes
    the caller's."""
    home, caller, pod = (netns_factory("pycni-host"), netns_factory("pycni-host"),
                         netns_factory("pycni-pod"))
    drop_forward(caller, "legacy", (4,))
    daemon = start_daemon(home)
    bridge, _, firewall = scenario("firewall", tmp_path)
    firewall = {k: v for k, v in firewall.items() if k != "ingressPolicy"}
    prev = Plugins(caller).ok("bridge", "ADD", bridge, netns=pod.path, env=daemon.env)
    Plugins(caller).ok("firewall", "ADD", firewall | {"prevResult": prev}, netns=pod.path,
                       env=daemon.env)
    daemon.wait_served(2)
    assert "-A CNI-FORWARD -s 10.77.0.2/32 -j ACCEPT" in saved(caller, "legacy")
    assert saved(home, "legacy") == []
    Plugins(caller).ok("firewall", "DEL", firewall, netns=pod.path, env=daemon.env)
    assert not any("10.77.0.2" in line for line in saved(caller, "legacy"))


def test_pycni_gc_removes_its_legacy_accepts(plugins, node, host) -> None:
    pod_a, _ = pods(node)
    drop_forward(host, "legacy", (4, 6))
    plugins.ok("firewall", "ADD", conf(node.prev_result(pod_a)), container_id="ctr-a",
               netns=pod_a.path)
    assert sum("10.88.0.2/32" in line for line in saved(host, "legacy")) == 2
    plugins.ok("firewall", "GC", conf(None) | {"cniVersion": "1.1.0",
                                               "cni.dev/valid-attachments": []})
    assert not any("10.88.0.2/32" in line for line in saved(host, "legacy"))
    assert not any("fd88::2/128" in line for line in saved(host, "legacy", 6))


INCOMPATIBLE = """table ip filter {
    chain FORWARD {
        type filter hook forward priority filter; policy drop;
        ct mark set 1
    }
}
"""


def test_an_incompatible_filter_table_is_a_clear_error(plugins, node, host) -> None:
    """`ip filter` made with nft, holding a rule iptables-nft has no syntax for: ADD cannot put
    the pod's accepts there; it says so (error 50: the host's to fix) and changes nothing."""
    pod_a, _ = pods(node)
    host.run("nft", "-f", "-", input=INCOMPATIBLE)
    before = host.run("nft", "list", "tables").stdout, filter_tables(host)
    code, out, _ = plugins.exec("firewall", "ADD", conf(node.prev_result(pod_a)),
                                container_id="ctr-a", netns=pod_a.path)
    assert code != 0 and out["code"] == 50, out
    assert "iptables-nft cannot read the host's iptables filter table" in out["msg"], out
    assert "incompatible" in out["msg"], out
    assert pod_rules(host) == []  # its accepts taken back
    assert filter_tables(host) == before[1]
    assert "ip6 filter" not in host.run("nft", "list", "tables").stdout
    plugins.ok("firewall", "DEL", conf(node.prev_result(pod_a)), container_id="ctr-a",
               netns=pod_a.path)


def filter_tables(host: Netns) -> str:
    return host.run("nft", "list", "table", "ip", "filter").stdout


# The README's steps ("Swapping with the reference plugins") for a swap back on a host with no
# iptables filter table, where pycni wrote no iptables rule: the reference's chains and jumps,
# then each live pod address's two accepts.
NFT_ONLY_STEPS = [
    ("-N", "CNI-FORWARD"), ("-N", "CNI-ADMIN"),
    ("-I", "FORWARD", "1", "-m", "comment", "--comment", "CNI firewall plugin rules", "-j",
     "CNI-FORWARD"),
    ("-I", "CNI-FORWARD", "1", "-m", "comment", "--comment",
     "CNI firewall plugin admin overrides", "-j", "CNI-ADMIN")]


def pod_steps(prefix: str) -> list[tuple[str, ...]]:
    return [("-A", "CNI-FORWARD", "-d", prefix, "-m", "conntrack", "--ctstate",
             "RELATED,ESTABLISHED", "-j", "ACCEPT"),
            ("-A", "CNI-FORWARD", "-s", prefix, "-j", "ACCEPT")]


def test_on_an_nftables_only_host_the_documented_steps_let_the_reference_check(
        plugins, node, host, tmp_path) -> None:
    """No iptables filter table: pycni writes no iptables rule, the reference's CHECK of its
    pod fails until the operator adds the reference's rules as the README says."""
    pod_a, _ = pods(node)
    prev = node.prev_result(pod_a)
    ref = {"bin_dir": REFERENCE_BIN, "env": reference_path(tmp_path, "nft")}
    plugins.ok("firewall", "ADD", conf(prev), container_id="ctr-a", netns=pod_a.path)
    assert "filter" not in host.run("nft", "list", "tables").stdout
    code, out, _ = plugins.exec("firewall", "CHECK", conf(prev), container_id="ctr-a",
                                netns=pod_a.path, **ref)
    assert code != 0 and "expected FORWARD rule" in out["msg"], out

    for tool, prefix in (("iptables", "10.88.0.2/32"), ("ip6tables", "fd88::2/128")):
        for step in NFT_ONLY_STEPS + pod_steps(prefix):
            # `-N` of a chain the reference's failed CHECK made fails, harmlessly
            host.run(f"{tool}-nft", *step, check=step[0] != "-N")
    plugins.ok("firewall", "CHECK", conf(prev), container_id="ctr-a", netns=pod_a.path, **ref)
    plugins.ok("firewall", "DEL", conf(prev), container_id="ctr-a", netns=pod_a.path, **ref)
    assert not any("10.88.0.2/32" in line for line in saved(host, "nft"))
    assert not any("fd88::2/128" in line for line in saved(host, "nft", 6))


def test_a_host_with_both_backends(plugins, node, servers, host, tmp_path) -> None:
    """iptables-nft's and x_tables' filter tables side by side (each dropping): pycni writes
    both, and its CHECK wants both of its own; the reference writes one (its `iptables`'s),
    which is whole, and pycni's CHECK of it passes, its DEL removes it."""
    pod_a, pod_b = pods(node)
    drop_forward(host, "nft", (4,))
    drop_forward(host, "legacy", (4,))
    servers.start(node.outside, "tcp", PORT, "OUT")
    prev_a, prev_b = node.prev_result(pod_a), node.prev_result(pod_b)
    plugins.ok("firewall", "ADD", conf(prev_a), container_id="ctr-a", netns=pod_a.path,
               bin_dir=REFERENCE_BIN, env=reference_path(tmp_path, "legacy"))
    assert "-A CNI-FORWARD -s 10.88.0.2/32 -j ACCEPT" in saved(host, "legacy")
    assert not any("10.88.0.2" in line for line in saved(host, "nft"))
    plugins.ok("firewall", "CHECK", conf(prev_a), container_id="ctr-a", netns=pod_a.path)

    assert answered_by(pod_b, "tcp", OUTSIDE[4], PORT) == "TIMEOUT"
    plugins.ok("firewall", "ADD", conf(prev_b), container_id="ctr-b", netns=pod_b.path)
    assert answered_by(pod_b, "tcp", OUTSIDE[4], PORT) == "OUT"
    plugins.ok("firewall", "CHECK", conf(prev_b), container_id="ctr-b", netns=pod_b.path)
    host.run("iptables-nft", "-D", "CNI-FORWARD", "-s", "10.88.0.3/32", "-j", "ACCEPT")
    code, out, _ = plugins.exec("firewall", "CHECK", conf(prev_b), container_id="ctr-b",
                                netns=pod_b.path)
    assert code != 0 and "10.88.0.3/32" in out["msg"] and "nftables ip filter" in out["msg"], out

    plugins.ok("firewall", "DEL", conf(prev_a), container_id="ctr-a", netns=pod_a.path)
    assert not any("10.88.0.2" in line for line in saved(host, "legacy"))
