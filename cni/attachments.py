"""`pycni attachments`: every attachment on this node and what it owns, joined from libcni's
result cache, the host-local stores and the kernel, with orphans flagged both ways. Read-only.

Each kernel and store source is read by the listing its GC judges (`store.reservations`,
`masq.network_rules` / `instance_of` / `network_records`, `spoofchk.checks`, `hostport.listed`
and its records, `ifb.marked`, bandwidth's tbf records `shaped.listed`, firewall's owner
comments and records `forward.listed`), so a piece shown as an
orphan is what a GC without that attachment in its valid list removes, and a piece shown as
owned is what that attachment's DEL removes.

States:
- ok: cached, its netns is there, every piece its cached config asks for is there;
- incomplete: cached and its netns is there, but a piece is missing (`missing` says which);
- stale: cached, but its netns is gone (a reboot, a runtime that lost the pod): every piece
  left is an orphan; the runtime's DEL, or a GC without it in the valid list, clears them;
- orphan: pieces (a reservation, rules, an ifb, a veth) no cached attachment owns.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from cni.host import forward, hostport, ifb, links, masq, netns, nsfd, spoofchk, tc
from cni.ipam.config import DEFAULT_DATA_DIR
from cni.ipam.store import Store, reservations
from cni.runtime import conflist
from cni.runtime.cache import CachedAttachment, ResultCache
from cni.spec import keys

Key = tuple[str, str, str]  # network, container ID, ifname


@dataclass
class Attachment:
    network: str
    containerID: str
    ifname: str
    state: str = "orphan"
    netns: str = ""
    cached: bool = False  # a libcni cache entry exists
    ips: list[str] = field(default_factory=list)  # the cached result's addresses
    reservations: list[str] = field(default_factory=list)  # host-local files held
    hostVeth: dict[str, Any] | None = None  # name, present, bridge, qdiscs
    ifb: dict[str, Any] | None = None  # name, qdisc
    tbf: dict[str, Any] | None = None  # bandwidth's record of its ingress tbf: veth, qdisc
    masquerade: list[str] = field(default_factory=list)  # masqueraded source addresses
    masqRecord: bool = False  # its masquerade's record chain (pycni-masq-*, pycni's own)
    hostPort: dict[str, int] | None = None  # rules (DNAT and masquerade), records
    spoofCheck: str | None = None  # the chain cni-br-iface-<ref>
    firewall: dict[str, Any] | None = None  # accepts (addresses, rules), record (pycni-att-*)
    missing: list[str] = field(default_factory=list)  # pieces a live pod lacks
    # entry-point plugins in its chain (main or IPAM): what they made is theirs, not judged here
    plugins: list[str] = field(default_factory=list)
    expects: set[str] = field(default_factory=set)

    def owns(self) -> list[str]:
        out = ["cache"] if self.cached else []
        out += [f"ip:{ip}" for ip in self.reservations]
        if self.hostVeth and self.hostVeth.get("present"):
            out.append(f"veth:{self.hostVeth['name']}")
        if self.ifb:
            out.append(f"ifb:{self.ifb['name']}")
        if self.tbf:  # the record alone: its veth or its tbf went
            out.append(f"tbf:{self.tbf['veth']}" if self.tbf["qdisc"] == "tbf" else "tbf-record")
        if self.masquerade:
            out.append(f"masq:{len(self.masquerade)}")
        elif self.masqRecord:
            out.append("masq-record")  # the record alone: its rules went (the reference's DEL)
        if self.hostPort:
            out.append(f"hostport:{self.hostPort['rules']}")
        if self.spoofCheck:
            out.append("spoofchk")
        if self.firewall:  # the record alone: its rules went
            out.append(f"firewall:{self.firewall['rules']}" if self.firewall["rules"]
                       else "firewall-record")
        out += [f"plugin:{name}" for name in self.plugins]
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["expects"]
        data["owns"] = self.owns()
        return data


class Node:
    """The join: one Attachment per (network, container ID, ifname) any source names."""

    def __init__(self, conf_dir: str, cache_dir: str) -> None:
        self.rows: dict[Key, Attachment] = {}
        self.networks: dict[str, list[dict[str, Any]]] = _conflists(conf_dir)
        self.cache = ResultCache(cache_dir)

    def row(self, network: str, cid: str, ifname: str) -> Attachment:
        key = (network, cid, ifname)
        if key not in self.rows:
            self.rows[key] = Attachment(network, cid, ifname)
        return self.rows[key]

    def find(self, network: str | None, cid: str, ifname: str | None = None) -> Attachment:
        """The row of this container (on this network / ifname when given); else a new one."""
        for (net, c, ifn), att in self.rows.items():
            if c == cid and network in (None, net) and ifname in (None, ifn):
                return att
        return self.row(network or "?", cid, ifname or "?")

    # sources ----------------------------------------------------------------------------------
    def read_cache(self) -> None:
        for cached in self.cache.attachments():
            att = self.row(cached.network, cached.container_id, cached.ifname)
            att.cached, att.netns = True, cached.netns
            result = cached.result or {}
            att.ips = [str(ip.get("address", "")) for ip in result.get("ips") or []
                       if isinstance(ip, dict)]
            plugins = _plugins_of(cached)
            self.networks.setdefault(cached.network, plugins)
            att.expects = _expected(plugins, cached)
            att.plugins = _entry_point_plugins(plugins)
            veth = _host_veth(result, plugins)
            if veth:
                att.hostVeth = {"name": veth, "present": False}

    def read_stores(self) -> None:
        dirs: dict[str, set[str]] = {}
        for net, plugins in self.networks.items():
            data_dir = _data_dir(plugins)
            if data_dir:
                dirs.setdefault(data_dir, set()).add(net)
        try:  # reservations of networks with no conflist left (the reference's, say)
            dirs.setdefault(DEFAULT_DATA_DIR, set()).update(
                e.name for e in os.scandir(DEFAULT_DATA_DIR) if e.is_dir(follow_symlinks=False))
        except OSError:
            pass
        for data_dir, nets in dirs.items():
            for net in sorted(nets):
                store = Store.existing(data_dir, net)
                if store is None:
                    continue
                try:
                    for ip, cid, ifname in reservations(store.entries()):
                        self.find(net, cid, ifname or None).reservations.append(ip)
                finally:
                    store.close()

    def read_links(self) -> None:
        with netns.iproute() as ipr:
            claimed = set()
            for att in list(self.rows.values()):
                if att.hostVeth:
                    claimed.add(att.hostVeth["name"])
                    att.hostVeth.update(_link_info(ipr, att.hostVeth["name"]))
            for dev in ifb.marked(ipr):  # ours: the alias names network and container
                claimed.add(dev.name)
                self.find(dev.network, dev.container_id).ifb = {
                    "name": dev.name, "qdisc": tc.root_kind(ipr, dev.index)}
            self._read_shaped(ipr)
            for att in self.rows.values():  # the reference's: by name only
                if att.ifb is None and "ifb" in att.expects:
                    from cni.plugins.bandwidth import ifb_name

                    name = ifb_name(att.network, att.containerID)
                    link = links.get(ipr, name)
                    if link is not None:
                        claimed.add(name)
                        att.ifb = {"name": name, "qdisc": tc.root_kind(ipr, link.index)}
            bridges = {_bridge_of(plugins) for plugins in self.networks.values()} - {None}
            for name in sorted(links.names() - claimed):  # veths on our bridges nobody owns
                info = _link_info(ipr, name)
                if info.get("kind") == "veth" and info.get("bridge") in bridges:
                    net = next(n for n, p in self.networks.items()
                               if _bridge_of(p) == info["bridge"])
                    self.row(net, "?", name).hostVeth = info | {"name": name}

    def _read_shaped(self, ipr) -> None:
        """bandwidth's records of the tbfs its ADDs made, as its DEL and GC read them: the
        qdisc of the recorded veth if that link is still there (index and name), else None.
        Records made in another network namespace are not this node's."""
        from cni.plugins import bandwidth, shaped

        for record in shaped.listed():
            if not record.here():
                continue
            index = bandwidth.recorded_veth(ipr, record)
            self.row(record.network, record.container_id, record.ifname).tbf = {
                "veth": record.veth,
                "qdisc": tc.root_kind(ipr, index) if index is not None else None}

    def read_rules(self) -> None:
        for net in list(self.networks):
            by_instance: dict[str, list[dict]] = {}
            for rule in masq.network_rules(net):
                by_instance.setdefault(masq.instance_of(rule), []).append(rule)
            for att in [a for a in self.rows.values() if a.network == net]:
                for prefix in masq.instance_prefixes(net, att.ifname, att.containerID):
                    att.masquerade += [_saddr(r) for r in by_instance.pop(prefix, [])]
            for rules in by_instance.values():
                _, ifname, cid = _named(rules[0])
                self.find(net, cid or "?", ifname or None).masquerade += map(_saddr, rules)
            records = masq.network_records(net)
            for att in [a for a in self.rows.values() if a.network == net]:
                instance = masq.hash_for_instance(net, att.ifname, att.containerID)
                if instance in records:
                    att.masqRecord = True
                    records.discard(instance)
            for instance in sorted(records):  # a record no row matches: named by its chain
                self.row(net, masq.RECORD_PREFIX + instance, "?").masqRecord = True
        self._read_hostports()
        self._read_firewall()
        hosts = {a.hostVeth["name"]: a for a in self.rows.values() if a.hostVeth}
        for ref, host_ifname in spoofchk.checks():
            att = next((a for a in self.rows.values()
                        if spoofchk.ref_id(a.containerID, a.ifname) == ref), None)
            if att is None:
                att = hosts.get(host_ifname or "") or self.find(None, ref, "?")
            att.spoofCheck = spoofchk.PREFIX + ref

    def _read_hostports(self) -> None:
        for family in hostport.NFT_FAMILY:
            listing = hostport.listed(family)
            records = listing.records()
            seen: set[int] = set()
            for att in list(self.rows.values()):
                comment = hostport.rule_comment(att.containerID)
                chain = hostport.record_chain(att.containerID, att.network, att.ifname)
                rules = hostport.attachment_rules(listing, comment, chain) \
                    if chain in records or att.cached else []
                if chain in records or rules:
                    hp = att.hostPort = att.hostPort or {"rules": 0, "records": 0}
                    hp["rules"] += len(rules)
                    hp["records"] += chain in records
                    seen.update(r.get("handle", 0) for r in rules)
                    records.pop(chain, None)
            for comment, _ip in records.values():  # a record no row matches
                att = self.find(None, str(comment or "?"))
                att.hostPort = att.hostPort or {"rules": 0, "records": 0}
                att.hostPort["records"] += 1
            for rule in listing.rules:  # rules nobody's record or cache claims
                if rule.get("chain") in hostport.OWNED_CHAINS and rule.get("comment") and \
                        rule.get("handle", 0) not in seen:
                    att = self.find(None, str(rule["comment"]))
                    att.hostPort = att.hostPort or {"rules": 0, "records": 0}
                    att.hostPort["rules"] += 1
                    seen.add(rule.get("handle", 0))

    def _read_firewall(self) -> None:
        """firewall's pod accepts by owner comment, and its records by chain name, as its GC
        finds them."""
        listing = forward.listed()
        owners: dict[str, list[str]] = {}
        for rule in listing.rules:
            if rule.get("chain") == forward.PODS and rule.get("comment"):
                owners.setdefault(str(rule["comment"]), []).append(
                    forward.pod_address(rule) or "?")
        records = {c for c in listing.chains if c.startswith(forward.RECORD_PREFIX)}
        for att in list(self.rows.values()):
            found = owners.pop(forward.owner_comment(att.containerID, att.ifname, att.network),
                               None)
            chain = forward.record_chain(att.containerID, att.ifname, att.network)
            if found or chain in records:
                att.firewall = {"rules": len(found or []), "addresses": sorted(set(found or [])),
                                "record": chain in records}
                records.discard(chain)
        for comment, found in owners.items():  # rules no row claims: named by their comment
            words = comment.split(" ")
            att = self.row(words[2], words[0], words[1]) if len(words) == 3 \
                else self.find(None, comment)
            att.firewall = {"rules": len(found), "addresses": sorted(set(found)),
                            "record": False}
        nets = {forward.network_record_prefix(n): n for n in self.networks}
        for chain in sorted(records):  # a record no row matches: named by its chain
            net = next((n for p, n in nets.items() if chain.startswith(p)), "?")
            self.row(net, chain, "?").firewall = {"rules": 0, "addresses": [], "record": True}

    # verdicts ---------------------------------------------------------------------------------
    def judge(self) -> None:
        for att in self.rows.values():
            if not att.cached:
                att.state = "orphan"
                continue
            if not _netns_alive(att.netns):
                att.state = "stale"
                continue
            have = {"veth": bool(att.hostVeth and att.hostVeth.get("present")),
                    "reservation": len(att.reservations) >= len(
                        [ip for ip in att.ips if ip]) and bool(att.reservations),
                    "masquerade": bool(att.masquerade), "hostport": bool(att.hostPort),
                    "spoofcheck": bool(att.spoofCheck), "ifb": bool(att.ifb),
                    "tbf": _shaped(att), "firewall": _accepted(att)}
            att.missing = sorted(p for p in att.expects if not have.get(p, True))
            att.state = "incomplete" if att.missing else "ok"


def discover(conf_dir: str, cache_dir: str, network: str | None = None) -> list[Attachment]:
    node = Node(conf_dir, cache_dir)
    node.read_cache()
    node.read_stores()
    node.read_links()
    node.read_rules()
    node.judge()
    rows = [a for a in node.rows.values() if network is None or a.network == network]
    return sorted(rows, key=lambda a: (a.network, a.containerID, a.ifname))


def table(rows: list[Attachment]) -> str:
    head = ("NETWORK", "CONTAINER", "IF", "STATE", "IPS", "OWNS", "MISSING")
    lines = [head] + [(a.network, _short(a.containerID), a.ifname, a.state,
                       ",".join(ip.split("/")[0] for ip in a.ips) or "-",
                       " ".join(a.owns()) or "-", ",".join(a.missing) or "-") for a in rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
                     for r in lines)


def to_json(rows: list[Attachment]) -> str:
    return json.dumps([a.to_json() for a in rows], indent=2)


# --- helpers ----------------------------------------------------------------------------------

def _short(cid: str) -> str:
    return cid if len(cid) <= 16 else cid[:12] + "..."


def _conflists(conf_dir: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in conflist.conf_files(conf_dir, (".conflist",)):
        try:
            conf = conflist.from_file(path)
        except Exception:  # noqa: BLE001 - a broken file is doctor's finding, not ours
            continue
        out.setdefault(conf.name, conf.plugins)
    return out


def _plugins_of(cached: CachedAttachment) -> list[dict[str, Any]]:
    try:
        data = json.loads(cached.config)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    plugins = data.get("plugins") if "plugins" in data else [data]
    return [p for p in plugins or [] if isinstance(p, dict)]


def _entry_point_plugins(plugins: list[dict[str, Any]]) -> list[str]:
    """The chain's types (and IPAM types) that entry-point plugins serve (cni.registry)."""
    from cni import registry

    served = registry.discover()
    types = [p.get("type") for p in plugins]
    types += [keys.get(ipam, "type") for p in plugins
              if isinstance(ipam := keys.get(p, "ipam"), dict)]
    return [t for t in dict.fromkeys(types) if isinstance(t, str) and t in served]


def _plugin(plugins: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((p for p in plugins if p.get("type") == kind), None)


def _ipam(plugins: list[dict[str, Any]]) -> dict[str, Any] | None:
    for p in plugins:
        ipam = p if p.get("type") == "host-local" else keys.get(p, "ipam")
        if isinstance(ipam, dict) and keys.get(ipam, "type") == "host-local":
            return ipam
    return None


def _data_dir(plugins: list[dict[str, Any]]) -> str | None:
    ipam = _ipam(plugins)
    if ipam is None:
        return None
    value = keys.get(ipam, "dataDir")
    return value if isinstance(value, str) and value else DEFAULT_DATA_DIR


def _bridge_of(plugins: list[dict[str, Any]]) -> str | None:
    br = _plugin(plugins, "bridge")
    if br is None:
        return None
    name = keys.get(br, "bridge")
    return name if isinstance(name, str) and name else "cni0"


def _expected(plugins: list[dict[str, Any]], cached: CachedAttachment) -> set[str]:
    """The pieces the cached chain makes for this attachment."""
    want = set()
    br = _plugin(plugins, "bridge")
    if br is not None:
        want.add("veth")
        if keys.get(br, "ipMasq") is True:
            want.add("masquerade")
        if keys.get(br, "macspoofchk") is True:
            want.add("spoofcheck")
    if _ipam(plugins) is not None and cached.result and cached.result.get("ips"):
        want.add("reservation")
    caps = cached.capability_args or {}
    if _plugin(plugins, "portmap") is not None and caps.get("portMappings"):
        want.add("hostport")
    if _plugin(plugins, "firewall") is not None and cached.result and cached.result.get("ips"):
        want.add("firewall")
    bw = _plugin(plugins, "bandwidth")
    if bw is not None:
        limits = caps.get("bandwidth") if isinstance(caps.get("bandwidth"), dict) else bw
        if keys.get(limits, "egressRate"):
            want.add("ifb")
        if keys.get(limits, "ingressRate"):
            want.add("tbf")
    return want


def _host_veth(result: dict[str, Any], plugins: list[dict[str, Any]]) -> str | None:
    """The host end in a bridge result: the interface without a sandbox that is not the
    bridge."""
    bridge = _bridge_of(plugins)
    if bridge is None:  # another main plugin's interfaces are not veths on a bridge
        return None
    for iface in result.get("interfaces") or []:
        if isinstance(iface, dict) and not iface.get("sandbox") and iface.get("name") != bridge:
            return str(iface.get("name") or "") or None
    return None


def _link_info(ipr, name: str) -> dict[str, Any]:
    link = links.get(ipr, name)
    if link is None:
        return {"present": False}
    master = links.by_index(ipr, link.master) if link.master else None
    qdiscs = [q for q in (tc.root_kind(ipr, link.index),) if q and q != "noqueue"]
    if tc.has_ingress(ipr, link.index):
        qdiscs.append("ingress")
    return {"present": True, "kind": link.kind, "bridge": master.name if master else None,
            "qdiscs": qdiscs}


def _shaped(att: Attachment) -> bool:
    """The ingress tbf is there: by pycni's record, else (the reference keeps none) on the
    host veth."""
    if att.tbf is not None:
        return att.tbf["qdisc"] == "tbf"
    return bool(att.hostVeth and "tbf" in att.hostVeth.get("qdiscs", []))


def _accepted(att: Attachment) -> bool:
    """firewall's accepts are there for every address of the cached result."""
    have = set(att.firewall["addresses"]) if att.firewall else set()
    return all(ip.split("/")[0] in have for ip in att.ips if ip)


def _saddr(rule: dict[str, Any]) -> str:
    for expr in rule.get("expr", []):
        match = expr.get("match")
        if match and match.get("left", {}).get("payload", {}).get("field") == "saddr":
            return str(match.get("right"))
    return "?"


def _named(rule: dict[str, Any]) -> tuple[str, str, str]:
    """(network, ifname, container ID) from a masquerade comment's readable tail, "" if cut."""
    parts = dict(p.split(": ", 1) for p in str(rule.get("comment", "")).split(", ")[1:]
                 if ": " in p)
    return parts.get("net", ""), parts.get("if", ""), parts.get("id", "")


def _netns_alive(path: str) -> bool:
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return nsfd.is_netns(fd)
    finally:
        os.close(fd)

