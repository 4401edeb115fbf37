"""A full node (issue 26): 250 attachments through the whole chain, every one checked in the
kernel and the store, a sample end to end, then DEL of all of them leaves nothing.

The chain is the bench's full-node one (bench/fullnode.py): bridge (ipMasq on nftables, host-local
/16) + portmap (nftables, one hostPort per pod) + bandwidth, run by our runtime (libcni's cache
and requests) through the daemon, four pods at a time, in a throwaway host namespace. Not a
timing: what must hold when the node is full is that nothing of one pod is lost or mixed up with
another's (a verb that reads only its own records and handles must still find exactly its own).

Every plugin call goes through the daemon: the shim's in-process fallback is off, and the
daemon's own figures (status.query) count exactly the calls the runtime made.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bandwidth_util import kinds, tbf_of
from cnitest import BIN, Netns
from portmap_util import HOST_OUT, OUTSIDE, Servers, _addr, _wire, answered_by
from test_daemon import start_daemon  # noqa: F401 (a fixture)

from cni.fast import protocol as proto
from cni.host import hostport, masq, tc
from cni.runtime import invoke
from cni.runtime.chain import Runtime, RuntimeConf
from cni.runtime.conflist import from_bytes
from cni.spec.errors import CNIError

pytestmark = [pytest.mark.root, pytest.mark.slow]

PODS = int(os.environ.get("PYCNI_FULL_NODE_PODS", "250"))
WORKERS = 4
NETWORK, BRIDGE, SUBNET, GATEWAY = "fullnode", "cnifull0", "10.77.0.0/16", "10.77.0.1"
RATE, BURST = 10_000_000, 80_000  # bits/s and bits, each way
CLONE_NEWNET = 0x40000000


def conflist(store: Path) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": NETWORK, "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
         "ipMasqBackend": "nftables", "macspoofchk": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(store)}},
        {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    ]}


def attachment(i: int, pod: Netns) -> RuntimeConf:
    caps = {"portMappings": [{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": RATE, "ingressBurst": BURST,
                          "egressRate": RATE, "egressBurst": BURST}}
    return RuntimeConf(f"fullnode-{i:03d}", pod.path, "eth0", capability_args=caps)


def in_host(host: Netns) -> None:
    """Pool initializer: the worker thread (and what it execs) lives in the host namespace."""
    fd = os.open(host.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the test's host namespace")
    finally:
        os.close(fd)


def rules_by_comment(host: Netns) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in host.nft_ruleset().get("nftables", []):
        if "rule" in o and o["rule"].get("comment"):
            out.setdefault(o["rule"]["comment"], []).append(o["rule"])
    return out


def store_files(store: Path) -> dict[str, str]:
    d = store / NETWORK
    return {f.name: f.read_bytes().decode() for f in d.iterdir()
            if f.name != "lock" and not f.name.startswith("last_reserved_ip")} \
        if d.is_dir() else {}


def count_plugin_calls(monkeypatch) -> Counter:
    """Every plugin exec the runtime makes, by CNI_COMMAND (its requests to the daemon)."""
    calls: Counter = Counter()
    lock = threading.Lock()
    exec_plugin = invoke.exec_plugin

    def counted(path: str, stdin: bytes, env: dict[str, str], **kw: Any) -> bytes:
        with lock:
            calls[env["CNI_COMMAND"]] += 1
        return exec_plugin(path, stdin, env, **kw)
    monkeypatch.setattr(invoke, "exec_plugin", counted)
    return calls


def test_a_full_node_of_250_attachments(host: Netns, netns_factory, start_daemon,  # noqa: F811
                                        tmp_path: Path, monkeypatch) -> None:
    store, cache = tmp_path / "store", tmp_path / "cache"
    daemon = start_daemon(host)
    for key, value in daemon.env.items():  # the daemon's socket, and no in-process fallback
        monkeypatch.setenv(key, value)
    assert os.environ[proto.FALLBACK_ENV] == "0"
    calls = count_plugin_calls(monkeypatch)
    conf = from_bytes(json.dumps(conflist(store)).encode())
    runtime = Runtime([str(BIN)], cache_dir=str(cache))
    pods = [netns_factory("pycni-fn") for _ in range(PODS)]
    atts = [attachment(i, pod) for i, pod in enumerate(pods)]
    with ThreadPoolExecutor(WORKERS, initializer=in_host, initargs=(host,)) as pool:
        results = [r.printable() if r else None
                   for r in pool.map(lambda rt: runtime.add(conf, rt), atts)]

    # every attachment, in the kernel and the store
    links = {ln["ifname"]: ln for ln in host.ip("-d", "link", "show")}
    rules = rules_by_comment(host)
    files = store_files(store)
    ips = []
    for i, (rt, result) in enumerate(zip(atts, results, strict=True)):
        assert result, f"ADD of {rt.container_id} gave no result"
        ip = result["ips"][0]["address"].split("/")[0]
        ips.append(ip)
        names = [itf["name"] for itf in result["interfaces"]]
        veth = next(n for n in names if n in links and links[n].get("master") == BRIDGE)
        ifb = next(n for n in names if n.startswith("bwp"))
        assert links[ifb]["linkinfo"]["info_kind"] == "ifb", rt.container_id
        assert files.get(ip) == f"{rt.container_id}\r\neth0", (ip, files.get(ip))
        dnat = [r for r in rules.get(rt.container_id, []) if r["chain"] == "hostports"]
        assert [hostport.signature(r) for r in dnat] == [
            ("hostports", (("tcp dport", str(20000 + i)),), ("dnat", ip, "80"))], dnat
        assert any(ip in str(r["expr"]) for r in
                   rules.get(masq.comment(NETWORK, "eth0", rt.container_id), [])), ip
        assert runtime.cached_result(conf, rt) is not None, rt.container_id
        tag = f"macspoofchk-{rt.container_id}-eth0"
        assert any(f"'{veth}'" in str(r["expr"]) for r in rules.get(tag, [])
                   if r["chain"] == "PREROUTING"), (tag, veth)
    assert len(set(ips)) == PODS and len(files) == PODS
    with ThreadPoolExecutor(WORKERS) as pool:
        addrs = list(pool.map(lambda pod: pod.addresses("eth0"), pods))
    for pod, ip, have in zip(pods, ips, addrs, strict=True):
        assert f"{ip}/16" in have, (pod.name, have)

    # a sample end to end: CHECK, the hostPort answers from outside, the shaping is in place
    outside = netns_factory("pycni-out")
    _wire(host, outside, "vout", "eth0")
    _addr(host, "vout", f"{HOST_OUT[4]}/24")
    _addr(outside, "eth0", f"{OUTSIDE[4]}/24")
    outside.run("ip", "route", "add", "default", "via", HOST_OUT[4])
    servers = Servers()
    try:
        for i in sorted({0, PODS // 2, PODS - 1}):
            with ThreadPoolExecutor(1, initializer=in_host, initargs=(host,)) as pool:
                pool.submit(runtime.check, conf, atts[i]).result()
            servers.start(pods[i], "tcp", 80, f"pod{i}")
            assert answered_by(outside, "tcp", HOST_OUT[4], 20000 + i) == f"pod{i}"
            names = [itf["name"] for itf in results[i]["interfaces"]]
            veth = next(n for n in names if links.get(n, {}).get("master") == BRIDGE)
            ifb = next(n for n in names if n.startswith("bwp"))
            for dev in (veth, ifb):
                assert tbf_of(host, dev) == tc.tbf_for(RATE, BURST), dev
            assert kinds(host, veth) == ["ingress", "tbf"]
    finally:
        servers.stop()

    # CHECK through the daemon (which asks the kernel for recorded rules by handle) sees a rule
    # gone; DEL then finds the rest by listing
    gone = [next(r for r in rules[atts[0].container_id] if r["chain"] == "hostports"),
            rules[masq.comment(NETWORK, "eth0", atts[1].container_id)][0],
            next(r for r in rules[f"macspoofchk-{atts[2].container_id}-eth0"]
                 if r["chain"] == "PREROUTING")]
    for rule in gone:
        host.run("nft", "delete", "rule", rule["family"], rule["table"], rule["chain"],
                 "handle", str(rule["handle"]))
    for rt, why in ((atts[0], "missing hostport rule"), (atts[1], "masquerade rule"),
                    (atts[2], "mac spoof check")):
        with ThreadPoolExecutor(1, initializer=in_host, initargs=(host,)) as pool, \
                pytest.raises(CNIError, match=why):
            pool.submit(runtime.check, conf, rt).result()

    # DEL of half of them (found by their records' handles) leaves the other half whole
    half = PODS // 2
    with ThreadPoolExecutor(WORKERS, initializer=in_host, initargs=(host,)) as pool:
        list(pool.map(lambda rt: runtime.delete(conf, rt), atts[:half]))
    rules = rules_by_comment(host)
    for i, rt in enumerate(atts):
        owned = [rt.container_id, masq.comment(NETWORK, "eth0", rt.container_id),
                 f"macspoofchk-{rt.container_id}-eth0"]
        # portmap: DNAT, two masquerades and the record's IP rule; masquerade; spoof check: the
        # jump from PREROUTING and three in its chains (pods 0-2, with a rule removed by hand
        # above, are in the first half)
        found = [len(rules.get(c, [])) for c in owned]
        assert found == ([4, 1, 4] if i >= half else [0, 0, 0]), (rt.container_id, found)

    # DEL of every one leaves nothing
    with ThreadPoolExecutor(WORKERS, initializer=in_host, initargs=(host,)) as pool:
        list(pool.map(lambda rt: runtime.delete(conf, rt), atts[half:]))
    links_after = {ln["ifname"]: ln for ln in host.ip("-d", "link", "show")}
    left = {
        "veths": [n for n, ln in links_after.items() if ln.get("master") == BRIDGE],
        "ifbs": [n for n in links_after if n.startswith("bwp")],
        "rules": sorted(c for c in rules_by_comment(host) if "fullnode-" in c),
        "reservations": sorted(store_files(store)),
        "cache": sorted(p.name for p in (cache / "results").iterdir())
        if (cache / "results").is_dir() else [],
        "per-pod chains": sorted(o["chain"]["name"] for o in host.nft_ruleset()["nftables"]
                                 if "chain" in o and o["chain"]["name"].startswith(
                                     ("pycni-att-", "pycni-masq-", "cni-br-iface-"))),
    }
    assert left == {k: [] for k in left}

    # every plugin call, and only those, served by the daemon: ADD and DEL of each pod through
    # the three plugins, the samples' CHECKs, and the failed CHECKs (portmap's after bridge's,
    # bridge's alone)
    samples = len({0, PODS // 2, PODS - 1})
    assert calls == {"ADD": 3 * PODS, "CHECK": 3 * samples + 2 + 1 + 1, "DEL": 3 * PODS}, calls
    daemon.wait_served(sum(calls.values()))
    figures = daemon.status()
    assert (figures["started"], figures["answered"], figures["running"], figures["queued"]) == (
        sum(calls.values()), sum(calls.values()), 0, 0), figures
