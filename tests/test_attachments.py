"""`pycni attachments` against real state: pods added by pycni and by the reference (v1.9.1,
nftables backends), half-deleted pods, the state a reboot leaves; and that it changes nothing.
Each row is checked against the kernel and the stores themselves, and GC or DEL must clear
what it calls an orphan."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cnitest import BIN, ROOT, Netns, destroy_netns
from rootskips import skip_unless

pytestmark = pytest.mark.root
REF19 = ROOT.parent / "shared" / "reference" / "bin"
CAPS = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 10_000_000, "ingressBurst": 100_000,
                      "egressRate": 10_000_000, "egressBurst": 100_000}}


class Node:
    """A throwaway node: a host netns, a conflist dir, libcni's cache and a host-local store."""

    def __init__(self, host: Netns, tmp: Path, bin_dir: Path = BIN) -> None:
        self.host, self.tmp, self.bin_dir = host, tmp, bin_dir
        self.netconf, self.store = tmp / "net.d", tmp / "ipam"
        self.cache = tmp / "cache"
        self.netconf.mkdir(exist_ok=True)
        (self.netconf / "10-demo.conflist").write_text(json.dumps({
            "cniVersion": "1.1.0", "name": "demo", "plugins": [
                {"type": "bridge", "bridge": "demo0", "isGateway": True, "ipMasq": True,
                 "ipMasqBackend": "nftables", "macspoofchk": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.7.0/24"}]],
                          "dataDir": str(self.store)}},
                {"type": "portmap", "backend": "nftables",
                 "capabilities": {"portMappings": True}},
                {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}))

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "NETCONFPATH": str(self.netconf),
                "CNI_PATH": str(self.bin_dir), "PYCNI_CACHE_DIR": str(self.cache),
                "PYCNI_SOCKET": "/nonexistent/pycni.sock", **extra}

    def pycni(self, *args: str, **extra: str) -> str:
        out = subprocess.run(["ip", "netns", "exec", self.host.name,
                              str(ROOT / ".venv/bin/pycni"), *args], env=self.env(**extra),
                             capture_output=True, text=True)
        assert out.returncode == 0, out
        return out.stdout

    def add(self, pod: Netns, cid: str, caps: dict | None = None) -> None:
        self.pycni("add", "demo", pod.path, CNI_CONTAINERID=cid,
                   **({"CAP_ARGS": json.dumps(caps)} if caps else {}))

    def rows(self) -> dict[str, dict]:
        """`pycni attachments --json`, by container ID."""
        rows = json.loads(self.pycni("attachments", "--json"))
        assert len({r["containerID"] for r in rows}) == len(rows), rows
        return {r["containerID"]: r for r in rows}

    def snapshot(self) -> tuple:
        """Everything attachments reads: it must be the same after it ran."""
        files = sorted((str(p), p.read_bytes()) for p in self.tmp.rglob("*") if p.is_file())
        return (self.host.run("nft", "list", "ruleset").stdout,
                sorted(link["ifname"] for link in self.host.ip("link", "show")), files)

    def masq_sources(self) -> list[str]:
        return [m["match"]["right"] for r in self.rules("inet", "cni_plugins_masquerade")
                for m in r["expr"] if "match" in m
                and m["match"]["left"].get("payload", {}).get("field") == "saddr"]

    def rules(self, family: str, table: str) -> list[dict]:
        out = self.host.run("nft", "-j", "list", "table", family, table, check=False).stdout
        return [o["rule"] for o in json.loads(out or '{"nftables": []}')["nftables"]
                if "rule" in o]

    def hostport_rules(self, cid: str) -> int:
        return sum(r.get("comment") == cid for r in self.rules("ip", "cni_hostport")
                   if r["chain"] in ("hostports", "masquerading"))


def reserved(node: Node, cid: str) -> list[str]:
    return sorted(p.name for p in (node.store / "demo").iterdir()
                  if p.read_bytes().startswith(cid.encode() + b"\r\n"))


def test_pycni_pods_live_stale_half_deleted_and_gc_clears_the_orphans(
        host: Netns, netns_factory, tmp_path: Path) -> None:
    node = Node(host, tmp_path)
    web, db, job = (netns_factory("pycni-attpod") for _ in range(3))
    node.add(web, "web-7f9c2", CAPS)
    node.add(db, "db-31a0e")
    node.add(job, "job-11aa", CAPS)
    before = node.snapshot()
    rows = node.rows()
    assert node.snapshot() == before  # read-only
    links = host.links()
    for cid in ("web-7f9c2", "db-31a0e", "job-11aa"):
        row = rows[cid]
        assert (row["state"], row["missing"], row["cached"]) == ("ok", [], True), row
        assert row["reservations"] == reserved(node, cid)
        assert [ip.split("/")[0] for ip in row["ips"]] == row["reservations"]
        veth = row["hostVeth"]
        assert veth["present"] and links[veth["name"]]["master"] == "demo0", row
        assert row["masquerade"] == row["reservations"] and row["masqRecord"]
        assert row["spoofCheck"] == f"cni-br-iface-{cid}-eth0"
    assert sorted(node.masq_sources()) == sorted(r["masquerade"][0] for r in rows.values())
    web_row = rows["web-7f9c2"]
    assert web_row["hostPort"] == {"rules": node.hostport_rules("web-7f9c2"), "records": 1}
    assert web_row["hostPort"]["rules"] >= 1
    assert web_row["ifb"]["name"] in links and web_row["ifb"]["qdisc"] == "tbf"
    assert "tbf" in web_row["hostVeth"]["qdiscs"] and "ingress" in web_row["hostVeth"]["qdiscs"]
    assert rows["db-31a0e"]["hostPort"] is None and rows["db-31a0e"]["ifb"] is None

    # A live pod missing a piece: its reservation file removed behind its back.
    (node.store / "demo" / rows["db-31a0e"]["reservations"][0]).unlink()
    # Half-deleted: web's netns gone (the kernel takes its veth), its rules, ifb, reservation
    # and cache left. job's netns gone and its cache entry too: what is left has no owner.
    destroy_netns(web, host)
    destroy_netns(job, host)
    next((node.cache / "results").glob("demo-job-11aa-eth0")).unlink()
    # A reservation whose pod never reached the cache (nor the kernel).
    (node.store / "demo" / "10.88.7.50").write_bytes(b"gone-8b1d\r\neth0")
    rows = node.rows()
    assert rows["db-31a0e"]["state"] == "incomplete"
    assert rows["db-31a0e"]["missing"] == ["reservation"]
    web_row = rows["web-7f9c2"]
    assert web_row["state"] == "stale" and not web_row["hostVeth"]["present"]
    assert web_row["masquerade"] and web_row["hostPort"]["rules"] and web_row["ifb"]
    job_row = rows["job-11aa"]
    assert (job_row["state"], job_row["cached"]) == ("orphan", False)
    assert job_row["masquerade"] and job_row["hostPort"]["rules"] and job_row["ifb"] \
        and job_row["spoofCheck"] and job_row["reservations"], job_row
    assert rows["gone-8b1d"]["state"] == "orphan"
    assert rows["gone-8b1d"]["reservations"] == ["10.88.7.50"]
    table = node.pycni("attachments")
    assert table.splitlines()[0].split() == ["NETWORK", "CONTAINER", "IF", "STATE", "IPS",
                                             "OWNS", "MISSING"]
    assert sum(" stale " in line for line in table.splitlines()) == 1

    # GC with the live pod as the only valid attachment clears every orphan and stale row.
    node.pycni("gc", "demo", "--valid-attachments",
               json.dumps([{"containerID": "db-31a0e", "ifname": "eth0"}]))
    rows = node.rows()
    assert set(rows) == {"db-31a0e"}, rows
    assert node.hostport_rules("web-7f9c2") == node.hostport_rules("job-11aa") == 0
    assert sorted(node.masq_sources()) == rows["db-31a0e"]["masquerade"]


@skip_unless((REF19 / "bridge").exists(),
             f"the v1.9.1 reference plugins in {REF19} (../shared provides them)")
def test_reference_pods_and_a_half_deleted_one(host: Netns, netns_factory,
                                               tmp_path: Path) -> None:
    node = Node(host, tmp_path, bin_dir=REF19)
    web, db = netns_factory("pycni-attpod"), netns_factory("pycni-attpod")
    node.add(web, "refweb-1", CAPS)
    node.add(db, "refdb-2")
    rows = node.rows()
    links = host.links()
    for cid in ("refweb-1", "refdb-2"):
        row = rows[cid]
        assert (row["state"], row["missing"]) == ("ok", []), row
        assert row["reservations"] == reserved(node, cid) != []
        assert links[row["hostVeth"]["name"]]["master"] == "demo0"
        assert row["masquerade"] == row["reservations"] and not row["masqRecord"]
        assert row["spoofCheck"] == f"cni-br-iface-{cid}-eth0"
    # The reference writes no record chain: its rules are found by their comment.
    assert rows["refweb-1"]["hostPort"] == {"rules": node.hostport_rules("refweb-1"),
                                            "records": 0}
    assert rows["refweb-1"]["ifb"]["name"] in links  # no alias: found by the reference's name
    # Half-deleted the other way: the reservation removed, the veth left.
    for ip in reserved(node, "refdb-2"):
        (node.store / "demo" / ip).unlink()
    assert node.rows()["refdb-2"]["missing"] == ["reservation"]
    # pycni's DEL of the reference's pod clears everything it owns.
    node.pycni("del", "demo", web.path, CNI_CONTAINERID="refweb-1", CNI_PATH=str(BIN))
    assert "refweb-1" not in node.rows()
    assert node.hostport_rules("refweb-1") == 0


def test_the_state_a_reboot_leaves(host: Netns, netns_factory, tmp_path: Path) -> None:
    """Cache and reservations on disk, no kernel object: a fresh host netns, pods' netns gone."""
    node = Node(host, tmp_path)
    pods = [netns_factory("pycni-attpod") for _ in range(2)]
    for i, pod in enumerate(pods):
        node.add(pod, f"boot-{i}", CAPS)
    for pod in pods:
        subprocess.run(["ip", "netns", "del", pod.name], check=True)
    rebooted = Node(netns_factory("pycni-host"), tmp_path)  # same disk, empty kernel
    rows = rebooted.rows()
    assert set(rows) == {"boot-0", "boot-1"}
    for cid, row in rows.items():
        assert row["state"] == "stale", row
        assert row["owns"] == ["cache", *(f"ip:{ip}" for ip in reserved(node, cid))]
        assert not row["hostVeth"]["present"] and not row["masquerade"] and not row["ifb"]
    # GC with no valid pod (the runtime restarted none of them) clears the disk too.
    rebooted.pycni("gc", "demo", "--valid-attachments", "[]")
    assert rebooted.rows() == {}
    assert sorted(p.name for p in (node.store / "demo").iterdir()) == [
        "last_reserved_ip.0", "lock"]


def test_a_masquerade_record_left_alone_is_shown_and_gc_drops_it(host: Netns, netns_factory,
                                                                 tmp_path: Path) -> None:
    """pycni's record chain of a masquerade (pycni-masq-*) whose rules are gone, as the
    reference's DEL leaves it after a swap, and one no attachment names: both shown, the
    second as an orphan row named by its chain; GC drops the orphan, keeps the valid one."""
    from cni.host import masq

    node = Node(host, tmp_path)
    pod = netns_factory("pycni-attpod")
    node.add(pod, "rec-5e1f")
    record = masq.record_chain("demo", "eth0", "rec-5e1f")
    for rule in node.rules("inet", "cni_plugins_masquerade"):
        if rule["chain"] == "masq_checks" and "rec-5e1f" in str(rule.get("comment")):
            host.run("nft", "delete", "rule", "inet", "cni_plugins_masquerade", "masq_checks",
                     "handle", str(rule["handle"]))
    orphan = masq.RECORD_PREFIX + masq.hash_for_network("demo") + "-" + "0" * 16
    host.run("nft", "add", "chain", "inet", "cni_plugins_masquerade", orphan)
    rows = node.rows()
    row = rows["rec-5e1f"]
    assert not row["masquerade"] and row["masqRecord"] and "masq-record" in row["owns"], row
    assert (row["state"], row["missing"]) == ("incomplete", ["masquerade"]), row
    assert rows[orphan]["state"] == "orphan" and rows[orphan]["owns"] == ["masq-record"]
    node.pycni("gc", "demo", "--valid-attachments",
               json.dumps([{"containerID": "rec-5e1f", "ifname": "eth0"}]))
    chains = host.run("nft", "list", "table", "inet", "cni_plugins_masquerade").stdout
    assert record in chains and orphan not in chains
    assert set(node.rows()) == {"rec-5e1f"}


def test_bandwidth_tbf_records_are_shown_with_their_attachment_and_alone(
        host: Netns, netns_factory, tmp_path: Path) -> None:
    """bandwidth's record of the ingress tbf its ADD made (/run/pycni/bandwidth) is a piece
    of its attachment: shown as `tbf:<veth>` while the tbf is there, as `tbf-record` once the
    tbf or the veth went (the row is incomplete, or an orphan without its cache entry), and
    GC clears the orphan."""
    from cni.plugins import shaped

    node = Node(host, tmp_path)
    live, gone = netns_factory("pycni-attpod"), netns_factory("pycni-attpod")
    node.add(live, "shp-live", CAPS)
    node.add(gone, "shp-gone", CAPS)
    rows = node.rows()
    for cid in ("shp-live", "shp-gone"):
        row = rows[cid]
        veth = row["hostVeth"]["name"]
        assert row["tbf"] == {"veth": veth, "qdisc": "tbf"}, row
        assert f"tbf:{veth}" in row["owns"] and row["state"] == "ok", row
    veth = rows["shp-live"]["hostVeth"]["name"]
    host.run("tc", "qdisc", "del", "dev", veth, "root")  # the tbf removed behind its back
    destroy_netns(gone, host)
    next((node.cache / "results").glob("demo-shp-gone-eth0")).unlink()
    rows = node.rows()
    row = rows["shp-live"]
    assert (row["state"], row["missing"]) == ("incomplete", ["tbf"]), row
    assert row["tbf"] == {"veth": veth, "qdisc": "noqueue"} and "tbf-record" in row["owns"]
    row = rows["shp-gone"]
    assert row["state"] == "orphan" and row["tbf"]["qdisc"] is None, row
    assert "tbf-record" in row["owns"], row
    node.pycni("gc", "demo", "--valid-attachments",
               json.dumps([{"containerID": "shp-live", "ifname": "eth0"}]))
    assert set(node.rows()) == {"shp-live"}
    assert [r.container_id for r in shaped.listed()] == ["shp-live"]


def test_firewall_rules_and_records_are_shown_per_attachment(host: Netns, netns_factory,
                                                             tmp_path: Path) -> None:
    """firewall's pod accepts (by owner comment) and its record chain are pieces of their
    attachment: `firewall:<rules>` while they are there; a live pod whose accepts went is
    incomplete (`firewall-record` left); a pod gone with its cache entry leaves an orphan, and
    GC clears it."""
    node = Node(host, tmp_path)
    (node.netconf / "20-fwdemo.conflist").write_text(json.dumps({
        "cniVersion": "1.1.0", "name": "fwdemo", "plugins": [
            {"type": "bridge", "bridge": "fw0", "isGateway": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.8.0/24"}]],
                      "dataDir": str(node.store)}},
            {"type": "firewall"}]}))
    live, gone = netns_factory("pycni-attpod"), netns_factory("pycni-attpod")
    for pod, cid in ((live, "fw-live"), (gone, "fw-gone")):
        node.pycni("add", "fwdemo", pod.path, CNI_CONTAINERID=cid)
    rows = node.rows()
    for cid in ("fw-live", "fw-gone"):
        row = rows[cid]
        ip = row["ips"][0].split("/")[0]
        assert row["firewall"] == {"rules": 2, "addresses": [ip], "record": True}, row
        assert "firewall:2" in row["owns"] and row["state"] == "ok", row
    accepts = [r for r in node.rules("inet", "cni_firewall")
               if r["chain"] == "pods" and r.get("comment") == "fw-live eth0 fwdemo"]
    assert len(accepts) == 2
    for rule in accepts:  # the live pod's accepts removed behind its back
        host.run("nft", "delete", "rule", "inet", "cni_firewall", "pods", "handle",
                 str(rule["handle"]))
    destroy_netns(gone, host)
    next((node.cache / "results").glob("fwdemo-fw-gone-eth0")).unlink()
    rows = node.rows()
    row = rows["fw-live"]
    assert (row["state"], row["missing"]) == ("incomplete", ["firewall"]), row
    assert "firewall-record" in row["owns"], row
    row = rows["fw-gone"]
    assert row["state"] == "orphan" and row["firewall"]["rules"] == 2, row
    node.pycni("gc", "fwdemo", "--valid-attachments",
               json.dumps([{"containerID": "fw-live", "ifname": "eth0"}]))
    assert set(node.rows()) == {"fw-live"}  # no record of fw-gone's left either
    assert not any("fw-gone" in str(r.get("comment")) for r in node.rules("inet", "cni_firewall"))
