"""Swapping the node's CNI binaries under a live CRI pod (issue 17 item 5, the CRI half; the
runner half is tests/test_swap.py): containerd 1.6's CRI runs test_cri's web pod (hostPort, the
two bandwidth annotations, httpd) with one side's plugins, then the files in the bin dir
containerd reads are replaced by the other side's while the pod runs, as an operator upgrading
or rolling back does (`pycni install --force` over Debian's package, `pycni uninstall` back to
it; containerd and its conf stay), and kubelet's StopPodSandbox + RemovePodSandbox run the other
side's DEL.

The reference is Debian's v1.1.1 (/usr/lib/cni): its masquerade and hostPorts are iptables,
pycni's nftables only (a deliberate difference), so neither side's DEL or CHECK finds the other's
firewall rules. Everything else both name alike (host-local reservation, veth, `bwp` ifb, tc
qdiscs, libcni cache entry, pod netns) is gone after the removal; what is left is exactly the
adder's firewall rules of that pod, asserted line by line:
- pycni ADD, reference DEL: pycni's hostPort rules (commented with the pod ID), their
  per-attachment record chain, the masquerade rule; `pycni gc` with an empty valid list for
  the network removes them all. The first StopPodSandbox fails: v1.1.1's bridge DEL takes
  iptables-nft's "Chain ... does not exist" for the masquerade chain it never made as an error
  (its go-iptables predates coreos/go-iptables#108); kubelet's retry succeeds.
- reference ADD, pycni DEL: the reference's CNI-<hash> (masquerade) and CNI-DN-<hash> (DNAT)
  chains and the jumps to them; removed by the test (pycni never touches iptables).
Before the removal the new side's CHECK runs on the old side's pod through our runner, with the
cached capability args, as libcni would: pycni's fails at bridge (no nftables masquerade
rule), the reference's at portmap (no CNI-DN chain).
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import grpc
import pytest
from clients import cri_conflist, install, need, pycni
from cnitest import REFERENCE_BIN, REFERENCE_PLUGINS
from crinode import (
    HOST_PORT,
    CRINode,
    cri_node,
    node_runner,
    run_web_pod,
    runner_check,
    shared_leftovers,
    wait_host_port,
)
from rootskips import skip_unless

pytestmark = [pytest.mark.root,
              skip_unless((REFERENCE_BIN / "portmap").exists(), REFERENCE_PLUGINS)]

XTABLES = {"nat", "filter", "mangle", "raw", "security"}  # iptables-nft's own nft tables


def h16(text: str) -> str:
    return hashlib.sha512(text.encode()).hexdigest()[:16]


def ref_chains(network: str, pod_id: str) -> tuple[str, str]:
    """The reference's per-pod iptables chains: masquerade, DNAT (utils.FormatChainName)."""
    digest = hashlib.sha512((network + pod_id).encode()).hexdigest()
    return f"CNI-{digest}"[:28], f"CNI-DN-{digest}"[:28]


def record_chain(network: str, pod_id: str) -> str:
    """pycni portmap's per-attachment record chain (README, swapping)."""
    return f"pycni-att-{h16(network)}-{h16(f'eth0:{pod_id}')}"


def masq_comment(network: str, pod_id: str) -> str:
    """The masquerade rule's comment, as the reference v1.9 nftables backend writes it."""
    text = f"{h16(network)}-{h16(f'eth0:{pod_id}')}, net: {network}, if: eth0, id: {pod_id}"
    return text[:128]


def pod_firewall(n: CRINode, network: str, pod_id: str, ips: list[str]) -> dict[str, list[str]]:
    """Every firewall line of the node about the pod: naming its ID, one of its addresses or
    one of its chains (the reference's hashed ones, pycni's record chain). "nft": rules and
    chains of nftables tables other than iptables-nft's, as `<family> <table> <chain>: <rule>`
    and `<family> <table> chain <name>`; "iptables": iptables-save / ip6tables-save lines,
    as `<tool> <table> <line>`."""
    chains = {*ref_chains(network, pod_id), record_chain(network, pod_id)}
    words = [pod_id, *ips, *chains]
    out: dict[str, list[str]] = {"nft": [], "iptables": []}
    table = chain = ""
    for raw in n.node.run("nft", "list", "ruleset").stdout.splitlines():
        line = raw.strip()
        if m := re.match(r"table (\S+) (\S+) \{$", line):
            table, chain = f"{m[1]} {m[2]}", ""
        elif m := re.match(r"chain (\S+) \{$", line):
            chain = m[1]
            if chain in chains and table.split()[1] not in XTABLES:
                out["nft"].append(f"{table} chain {chain}")
        elif re.match(r'continue comment "=[a-z] ', line):
            continue  # a record's meta (handles, facts: cni.host.nftrecord), not a rule
        elif (chain and line not in ("}", "") and not line.startswith(("type ", "policy "))
              and table.split()[1] not in XTABLES
              and (chain in chains or any(w in line for w in words))):
            out["nft"].append(f"{table} {chain}: {line}")
    for tool in ("iptables-save", "ip6tables-save"):
        current = ""
        for line in n.node.run(tool).stdout.splitlines():
            if line.startswith("*"):
                current = line[1:]
            elif any(w in line for w in words):
                out["iptables"].append(f"{tool} {current} {line}")
    return {k: sorted(v) for k, v in out.items()}


def expected_pycni_rules(network: str, pod_id: str, ips: list[str], subnets: list[str]) -> \
        list[str]:
    """What pycni's ADD wrote for the pod that only pycni finds (see the module docstring)."""
    out = []
    rec = record_chain(network, pod_id)
    for ip in ips:
        fam = "ip6" if ":" in ip else "ip"
        tbl = f"{fam} cni_hostport"
        hostport = f"[{ip}]" if ":" in ip else ip
        lo = "::1" if ":" in ip else "127.0.0.1"
        out += [f'{tbl} hostports: tcp dport {HOST_PORT} dnat to {hostport}:80 '
                f'comment "{pod_id}"',
                f'{tbl} masquerading: {fam} saddr {ip} {fam} daddr {ip} masquerade '
                f'comment "{pod_id}"',
                f'{tbl} chain {rec}',
                f'{tbl} {rec}: {fam} daddr {ip} comment "{pod_id}"']
        if ":" not in ip:
            out.append(f'{tbl} masquerading: {fam} saddr {lo} {fam} daddr {ip} masquerade '
                       f'comment "{pod_id}"')
    for ip, subnet in zip(ips, subnets, strict=True):
        fam = "ip6" if ":" in ip else "ip"
        out.append(f'inet cni_plugins_masquerade masq_checks: {fam} saddr {ip} {fam} daddr != '
                   f'{subnet} masquerade comment "{masq_comment(network, pod_id)}"')
    return sorted(out)


def expected_reference_rules(network: str, pod_id: str, ips: list[str],
                             subnets: list[str]) -> list[str]:
    """What the reference's ADD (v1.1.1, iptables) wrote for the pod that only it finds."""
    masq, dnat = ref_chains(network, pod_id)
    out = []
    for ip, subnet in zip(ips, subnets, strict=True):
        v6 = ":" in ip
        tool = "ip6tables-save" if v6 else "iptables-save"
        pre = f"{tool} nat"
        comment = f'-m comment --comment "name: \\"{network}\\" id: \\"{pod_id}\\""'
        out += [f"{pre} :{masq} - [0:0]",
                f"{pre} :{dnat} - [0:0]",
                f"{pre} -A POSTROUTING -s {ip}/{128 if v6 else 32} {comment} -j {masq}",
                f"{pre} -A {masq} -d {subnet} {comment} -j ACCEPT",
                f"{pre} -A {masq} ! -d {'ff00::/8' if v6 else '224.0.0.0/4'} {comment} "
                "-j MASQUERADE",
                f'{pre} -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: '
                f'\\"{network}\\" id: \\"{pod_id}\\"" -m multiport --dports {HOST_PORT} '
                f"-j {dnat}",
                f"{pre} -A {dnat} -s {subnet} -p tcp -m tcp --dport {HOST_PORT} "
                "-j CNI-HOSTPORT-SETMARK",
                f"{pre} -A {dnat} -p tcp -m tcp --dport {HOST_PORT} -j DNAT "
                f"--to-destination {f'[{ip}]' if v6 else ip}:80"]
        if not v6:
            out.append(f"{pre} -A {dnat} -s 127.0.0.1/32 -p tcp -m tcp --dport {HOST_PORT} "
                       "-j CNI-HOSTPORT-SETMARK")
    return sorted(out)


def delete_iptables(n: CRINode, lines: list[str]) -> None:
    """Remove the given iptables-save lines (rules first, then the emptied chains); what is
    not there is skipped (the caller checks what is left)."""
    for line in lines:
        tool, table, rest = line.split(" ", 2)
        if rest.startswith("-A "):
            cmd = tool.removesuffix("-save")
            n.node.run(cmd, "-t", table, "-D", *shlex.split(rest)[1:], check=False)
    for line in lines:
        tool, table, rest = line.split(" ", 2)
        if rest.startswith(":"):
            n.node.run(tool.removesuffix("-save"), "-t", table, "-X", rest[1:].split()[0],
                       check=False)


def bin_dir_differences(bin_dir: Path, reference: Path = REFERENCE_BIN) -> list[str]:
    """How bin_dir differs from Debian's package, by name and by content."""
    names, ref_names = set(os.listdir(bin_dir)), set(os.listdir(reference))
    out = [f"extra {x}" for x in sorted(names - ref_names)]
    out += [f"missing {x}" for x in sorted(ref_names - names)]
    out += [f"differs {x}" for x in sorted(names & ref_names)
            if (bin_dir / x).is_symlink()
            or not filecmp.cmp(bin_dir / x, reference / x, shallow=False)]
    return out


@pytest.mark.parametrize("conflist", ["10-pycni.conflist", "20-pycni-dualstack.conflist"],
                         ids=["v4", "dualstack"])
@pytest.mark.parametrize("adder", ["pycni", "reference"], ids=["pycni-add", "reference-add"])
def test_swap_bin_dir_under_a_running_cri_pod(adder, conflist, node_netns, oci_image,
                                              pause_image, tmp_path) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc", "iptables",
         "iptables-save", "ip6tables", "ip6tables-save")
    conf = cri_conflist(reference=adder == "reference", name=conflist)
    network = conf["name"]
    subnets = [r[0]["subnet"] for r in conf["plugins"][0]["ipam"]["ranges"]]
    # the node has Debian's package in its bin dir; a pycni node had pycni installed over it
    bin_dir, conf_dir = tmp_path / "cni" / "bin", tmp_path / "cni" / "net.d"
    shutil.copytree(REFERENCE_BIN, bin_dir, symlinks=True)
    conf_dir.mkdir()
    (conf_dir / conflist).write_text(json.dumps(conf))
    upgrade = ("install", "--force", "--bin-dir", str(bin_dir), "--conflist", "")
    if adder == "pycni":
        pycni(*upgrade)

    with cri_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir,
                  images=[pause_image, oci_image], daemon=adder == "pycni") as n, \
            contextlib.ExitStack() as teardown:
        pod, ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        wait_host_port(n, ips)
        ours = expected_pycni_rules(network, pod.id, ips, subnets)
        theirs = expected_reference_rules(network, pod.id, ips, subnets)
        adders = {"nft": ours, "iptables": []} if adder == "pycni" else \
            {"nft": [], "iptables": theirs}
        assert pod_firewall(n, network, pod.id, ips) == adders
        if adder == "reference":  # the test's own teardown for what pycni never removes
            teardown.callback(delete_iptables, n, theirs)

        # ---- the operator swaps the binaries; the pod keeps running
        if adder == "pycni":
            pycni("uninstall", "--bin-dir", str(bin_dir))  # rollback to Debian's package
            assert bin_dir_differences(bin_dir) == []
        else:
            pycni(*upgrade)  # pycni over Debian's package
            assert os.readlink(bin_dir / "portmap") == "pycni-plugin"
        wait_host_port(n, ips)

        # CHECK by the new side, as libcni would run it: each side's masquerade and hostPort
        # rules are not where the other looks (bridge runs before portmap in the chain)
        proc = runner_check(n, network, pod.id, bin_dir=bin_dir, conf_dir=conf_dir)
        masq, dnat = ref_chains(network, pod.id)
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr.strip() == (
            f'plugin type="portmap" failed (check): could not check ipv4 dnat: chain {dnat} '
            "not found in iptables table nat" if adder == "pycni" else
            f'plugin type="bridge" failed (check): masquerade rule for {ips[0]} is missing')

        # ---- kubelet deletes the pod; the other side's DEL runs (twice: Stop, Remove)
        for cid in pod.containers:
            n.cri.stop_remove_container(cid)
        if adder == "pycni":
            # v1.1.1's bridge DEL (its go-iptables predates coreos/go-iptables#108) takes
            # iptables-nft's "Chain ... does not exist" for a failure when the masquerade chain
            # it never made is missing, after releasing the IP and deleting the veth; kubelet
            # retries StopPodSandbox, and the retry's bridge DEL finds no veth and succeeds
            with pytest.raises(grpc.RpcError) as failed:
                n.cri.stop_remove(pod.id)
            details = failed.value.details()
            assert 'plugin type="bridge" failed (delete): running [/usr/sbin/iptables -t nat ' \
                f"-D POSTROUTING -s {ips[0]} -j {masq} " in details, details
            assert f"Chain '{masq}' does not exist" in details, details
            assert [x for x in shared_leftovers(n, network, pod.id)
                    if not x.startswith("netns ")] == [f"cache {network}-{pod.id}-eth0"]
        n.cri.stop_remove(pod.id)
        assert n.cri.pod_ids() == []
        assert shared_leftovers(n, network, pod.id) == []
        # what is left is exactly the adder's firewall rules the other side cannot see
        assert pod_firewall(n, network, pod.id, ips) == adders

        if adder == "pycni":  # pycni's GC, with nothing valid in the network, removes them
            gc_bin, gc_conf = install(tmp_path / "pycni-gc", conf, cni_version="1.1.0")
            proc = node_runner(n, "gc", network, "--valid-attachments", "[]",
                               env={"NETCONFPATH": str(gc_conf), "CNI_PATH": str(gc_bin)})
            assert proc.returncode == 0, proc.stderr
        else:
            teardown.close()
        assert pod_firewall(n, network, pod.id, ips) == {"nft": [], "iptables": []}
        assert shared_leftovers(n, network, pod.id) == []
