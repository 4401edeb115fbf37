"""IP masquerade for pod traffic leaving its subnet, with nftables: the reference's layout and
naming (pkg/ip/ipmasq_nftables_linux.go), so either side's DEL, CHECK and GC find the other's rules.

    table inet cni_plugins_masquerade
      chain postrouting  (nat, postrouting, srcnat): multicast return; goto masq_checks
      chain masq_checks: ip saddr <pod ip> ip daddr != <pod subnet> masquerade comment "..."

With bridge's nonMasqueradeCIDRs (pycni's, beyond the reference) the one rule per pod address
leaves those CIDRs of its family alone too, in an anonymous set: `ip daddr != { <pod subnet>,
<cidr>, ... }` (collapsed, so a CIDR holding the subnet leaves one prefix). Its comment is the
same, so either side's DEL and GC find it; without the key the rule is the reference's, byte for
byte.

The comment is `<hash(net)>-<hash(ifname:cid)>, net: N, if: I, id: C` ('"' removed from N, I, C;
cut at 128 bytes), hash = first 16 hex digits of SHA-512. DEL finds the attachment's rules by the
`<hash(net)>-<hash(ifname:cid)>` prefix without knowing its IPs (the reference leaks them when
CNI_NETNS is empty, #810); GC looks at the rules starting with `<hash(net)>`.

pycni releases before the v1.9 layout hashed with SHA-256 (same shape otherwise): DEL, GC and a
re-ADD also remove those ("legacy") rules, so an upgrade under live pods leaks nothing.

So that ADD, CHECK and DEL read one small chain instead of masq_checks (one rule per pod on the
node), each attachment also has a record chain `pycni-masq-<hash(net)>-<hash(ifname:cid)>` in
the table (cni.host.nftrecord: its rules' handles, fact "a" the addresses masqueraded), never
jumped to; the reference never lists the table's chains. Without a usable record (the
reference's rules, pycni's before records, a rule removed by the reference's DEL) the verbs
list masq_checks as before; GC removes the network's records of attachments not valid.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from cni.host import nft, nftrecord
from cni.host.digest import sha256_hex, sha512_hex

FAMILY = "inet"
TABLE = "cni_plugins_masquerade"
CHAIN = "masq_checks"
BASE = "postrouting"
COMMENT_MAX = 128
PREFIX_LEN = 33  # "<16 hex>-<16 hex>"
RECORD_PREFIX = "pycni-masq-"
TABLE_COMMENT = "Masquerading for plugins from github.com/containernetworking/plugins"
CHAIN_COMMENT = "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet"


def hash_for_network(network: str) -> str:
    """The reference's utils.MustFormatHashWithPrefix(16, "", network)."""
    return sha512_hex(network, 16)


def hash_for_instance(network: str, ifname: str, container_id: str) -> str:
    return hash_for_network(network) + "-" + hash_for_network(f"{ifname}:{container_id}")


def legacy_hash(value: str) -> str:
    """What pycni wrote before the v1.9 layout (SHA-256): only ever looked for, never written."""
    return sha256_hex(value, 16)


def legacy_instance(network: str, ifname: str, container_id: str) -> str:
    return legacy_hash(network) + "-" + legacy_hash(f"{ifname}:{container_id}")


def comment(network: str, ifname: str, container_id: str) -> str:
    """Exactly the reference's commentForInstance (bytes cut as Go slices a string)."""
    text = "{}, net: {}, if: {}, id: {}".format(
        hash_for_instance(network, ifname, container_id),
        *(v.replace('"', "") for v in (network, ifname, container_id)))
    return text.encode()[:COMMENT_MAX].decode(errors="ignore")


def _quoted_comment(network: str, ifname: str, container_id: str) -> str:
    """The comment ready for a script. An ifname with characters nft can't carry verbatim (a
    control character) leaves only the hash prefix, which is all DEL and our GC look at."""
    try:
        return nft.comment(comment(network, ifname, container_id))
    except ValueError:
        return nft.comment(hash_for_instance(network, ifname, container_id))


def _rules(*prefixes: str) -> list[dict]:
    return [r for r in nft.rules(FAMILY, TABLE, CHAIN)
            if str(r.get("comment", "")).startswith(prefixes)]


def network_rules(network: str) -> list[dict]:
    """The network's rules, either hash layout: what GC judges and `pycni attachments` shows."""
    return _rules(hash_for_network(network) + "-", legacy_hash(network) + "-")


def instance_of(rule: dict) -> str:
    """The `<hash(net)>-<hash(ifname:cid)>` a rule's comment starts with: its attachment."""
    return str(rule.get("comment", ""))[:PREFIX_LEN]


def instance_prefixes(network: str, ifname: str, container_id: str) -> tuple[str, str]:
    return _instance_prefixes(network, ifname, container_id)


def _instance_prefixes(network: str, ifname: str, container_id: str) -> tuple[str, str]:
    return (hash_for_instance(network, ifname, container_id),
            legacy_instance(network, ifname, container_id))


def record_chain(network: str, ifname: str, container_id: str) -> str:
    return RECORD_PREFIX + hash_for_instance(network, ifname, container_id)


def _record(network: str, ifname: str, container_id: str) -> nftrecord.Record | None:
    return nftrecord.read(FAMILY, TABLE, record_chain(network, ifname, container_id), (CHAIN,))


def destinations(address: str, keep: Iterable[str] = ()) -> list[str]:
    """What the rule for the pod address 'ip/prefix' does not masquerade: its subnet and the
    `keep` CIDRs (bridge's nonMasqueradeCIDRs, validated) of its family, collapsed, in order."""
    iface = ipaddress.ip_interface(address)
    nets = [iface.network, *(n for n in map(ipaddress.ip_network, keep)
                             if n.version == iface.version)]
    out = [str(n) for n in ipaddress.collapse_addresses(nets)]
    if any("%" in n for n in out):  # a scope ID is kept verbatim: never into a rule
        raise ValueError(f"not a plain network: {out}")
    return out


def setup(ips: list[str], network: str, ifname: str, container_id: str,
          keep: Iterable[str] = ()) -> None:
    """Masquerade each 'ip/prefix' to anything outside its subnet and the `keep` CIDRs,
    replacing any rules this attachment had (one atomic batch)."""
    keep = list(keep)
    tag = _quoted_comment(network, ifname, container_id)
    record = record_chain(network, ifname, container_id)
    head = (
        f"add table {FAMILY} {TABLE} {{ comment {nft.comment(TABLE_COMMENT)} ; }}\n"
        f"add chain {FAMILY} {TABLE} {CHAIN} {{ comment {nft.comment(CHAIN_COMMENT)} ; }}\n"
        f"add chain {FAMILY} {TABLE} {BASE} "
        "{ type nat hook postrouting priority srcnat; }\n"
        f"flush chain {FAMILY} {TABLE} {BASE}\n"
        f"add rule {FAMILY} {TABLE} {BASE} ip daddr 224.0.0.0/4 return\n"
        f"add rule {FAMILY} {TABLE} {BASE} ip6 daddr ff00::/8 return\n"
        f"add rule {FAMILY} {TABLE} {BASE} goto {CHAIN}\n"
    )
    fresh = nftrecord.fresh_chain_script(FAMILY, TABLE, record)
    sources: list[str] = []
    kept: list[str] = []  # fact "d": source@destination where more than its subnet (CHECK)
    rules = ""
    for cidr in ips:
        iface = ipaddress.ip_interface(cidr)
        proto = "ip" if iface.version == 4 else "ip6"
        dsts = destinations(cidr, keep)
        sources.append(str(iface.ip))
        if dsts != [str(iface.network)]:
            kept += [f"{iface.ip}@{d}" for d in dsts]
        daddr = dsts[0] if len(dsts) == 1 else "{ " + ", ".join(dsts) + " }"
        rules += (f"add rule {FAMILY} {TABLE} {CHAIN} {proto} saddr {iface.ip} "
                  f"{proto} daddr != {daddr} masquerade comment {tag}\n")
    rules += nftrecord.meta_script(FAMILY, TABLE, record, [CHAIN] * len(sources),
                                   {"a": sources, "d": kept} if kept else {"a": sources})
    # The usual ADD is of a fresh attachment (no record yet): its batch is sent without reading
    # the record first, and `create`s the record chain, which fails the whole batch (nothing
    # changed) when the chain is there (a re-ADD). Otherwise it is the very batch the record's
    # absence would have sent. Reading a record that is not there costs nft a listing of every
    # chain in the table (~1.3 us a pod on the node).
    try:
        nft.run(head + f"create chain {FAMILY} {TABLE} {nft.chain_name(record)}\n" + fresh
                + rules)
        return
    except nft.NftError:
        pass  # the record is there (or nft refused the batch): read it, as always
    script = head + fresh + rules
    rec = _record(network, ifname, container_id)
    if rec is None or rec.handles:  # a fresh attachment, or one whose record says where
        try:
            nft.run(script + nftrecord.handles_script(FAMILY, TABLE, rec.handles if rec
                                                      else {}))
            return
        except nft.NftError:
            pass  # a recorded rule is gone already: list and replace what is there
    nft.run(script + nft.delete_rules_script(
        _rules(*_instance_prefixes(network, ifname, container_id))))


def teardown(network: str, ifname: str, container_id: str) -> int:
    """Remove this attachment's rules (and its legacy ones) and record; how many rules."""
    record = record_chain(network, ifname, container_id)
    rec = _record(network, ifname, container_id)
    drop = nftrecord.drop_script(FAMILY, TABLE, record) if rec is not None else ""
    if rec is not None and rec.handles:
        try:
            nft.run(nftrecord.handles_script(FAMILY, TABLE, rec.handles) + drop)
            return sum(map(len, rec.handles.values()))
        except nft.NftError:
            pass  # the reference's DEL removed them (a swap): list
    found = _rules(*_instance_prefixes(network, ifname, container_id))
    if found or drop:
        nft.run(nft.delete_rules_script(found) + drop)
    return len(found)


def present(network: str, ifname: str, container_id: str) -> dict[str, set[str] | None]:
    """Source addresses this attachment's rules masquerade, each with the destinations its rule
    leaves alone (for CHECK); None: only the source's own subnet, as the reference's rule (a
    record says so by no fact "d" for it: so did every record before nonMasqueradeCIDRs)."""
    rec = _record(network, ifname, container_id)
    if rec is not None and nftrecord.present(FAMILY, TABLE, rec.handles):
        out: dict[str, set[str] | None] = {a: None for a in rec.fact("a")}
        for item in rec.fact("d"):
            source, _, dst = item.partition("@")
            out[source] = (out.get(source) or set()) | {dst}
        return out
    out = {}
    for rule in _rules(*_instance_prefixes(network, ifname, container_id)):
        source, dsts = None, set()
        for expr in rule.get("expr", []):
            match = expr.get("match") or {}
            field = match.get("left", {}).get("payload", {}).get("field")
            if field == "saddr" and match.get("op") == "==":
                source = str(match.get("right"))
            elif field == "daddr" and match.get("op") == "!=":
                dsts = _networks(match.get("right"))
        if source is not None:
            out.setdefault(source, set()).update(dsts)
    return out


def _networks(right: object) -> set[str]:
    """The prefixes of a rule's `daddr !=` right side in nft's JSON: an address, a prefix or a
    set of those (or ranges, as nft shows a merged interval that is no prefix)."""
    items = right.get("set", []) if isinstance(right, dict) and "set" in right else [right]
    out: set[str] = set()
    for item in items:
        try:
            if isinstance(item, dict) and "prefix" in item:
                out.add(str(ipaddress.ip_network(f"{item['prefix']['addr']}/"
                                                  f"{item['prefix']['len']}")))
            elif isinstance(item, dict) and "range" in item:
                low, high = (ipaddress.ip_address(a) for a in item["range"])
                out.update(map(str, ipaddress.summarize_address_range(low, high)))
            else:
                out.add(str(ipaddress.ip_network(str(item))))
        except (KeyError, TypeError, ValueError):
            out.add(f"?{item}")  # not something we write: CHECK says it differs
    return out


def network_records(network: str) -> set[str]:
    """The instance hashes of the network's record chains (GC drops those not valid)."""
    prefix = RECORD_PREFIX + hash_for_network(network) + "-"
    return {c[len(RECORD_PREFIX):] for c in nft.chains(FAMILY, TABLE) if c.startswith(prefix)}


def gc(network: str, valid: set[tuple[str, str]]) -> int:
    """Remove the network's rules whose (containerID, ifname) is not in `valid`.

    The reference keeps a rule only if its whole comment equals a valid attachment's; we keep it
    if its hash prefix does (a superset: it also keeps a valid attachment's rule whose readable
    tail differs). Legacy (SHA-256) rules of the network are judged the same way."""
    keep = {h for cid, ifname in valid for h in _instance_prefixes(network, ifname, cid)}
    stale = [r for r in network_rules(network) if instance_of(r) not in keep]
    dropped = sorted(network_records(network) - keep)
    script = nft.delete_rules_script(stale) + "".join(
        nftrecord.drop_script(FAMILY, TABLE, RECORD_PREFIX + h) for h in dropped)
    if script:
        nft.run(script)
    return len(stale)
