"""The firewall plugin's own nftables table: pod traffic accepted in the forward path, and the
bridge isolation of its ingress policies.

Layout (one `inet` table, both families):

    forward (filter hook forward, policy accept):  jump isolation_stage_1; jump admin; jump pods
    isolation_stage_1:  iifname B oifname != B jump isolation_stage_2     # "same-bridge B"
                        [isolated] iifname B oifname B drop                # "isolated B"
    isolation_stage_2:  oifname B drop                                     # "same-bridge B"
    pods:               ip daddr P ct state established,related accept     # owner
                        ip saddr P accept                                  # owner
    admin:              (the node admin's overrides; never written here)

the reference's iptables CNI-FORWARD / CNI-ADMIN / CNI-ISOLATION-STAGE-1/2 chains, in nft
(the admin jump sits in `forward` rather than first in `pods`: same order, and `forward` holds
only the entry jumps, so every ADD rewrites it in its batch, race-free, without reading). A
pod rule carries its owner (container ID and ifname) in its comment; a bridge's isolation rules
are the bridge's, shared by every pod on it, and stay (as the reference's do). An accept in this
table does not override a drop in another table's forward chain: the rules a dropping iptables
FORWARD needs are cni.host.xtforward's. Nothing here knows CNI.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, NamedTuple

from cni.host import masq, nft, nftrecord
from cni.host.digest import sha512_hex

FAMILY = "inet"
TABLE = "cni_firewall"
FORWARD = "forward"
PODS = "pods"
ADMIN = "admin"
STAGE1 = "isolation_stage_1"
STAGE2 = "isolation_stage_2"
CHAINS = (FORWARD, STAGE1, STAGE2, PODS, ADMIN)
TABLE_COMMENT = "CNI firewall plugin"
_T = f"{FAMILY} {TABLE}"
_PLAIN = re.compile(r"^[A-Za-z0-9_.:@=+\-]+$")
# the entry rules, as (chain, jump target): the table's skeleton
ENTRY = ((FORWARD, STAGE1), (FORWARD, ADMIN), (FORWARD, PODS))


def owner_comment(container_id: str, ifname: str, network: str) -> str:
    """The comment naming a pod rule's attachment: "<container ID> <ifname> <network>", or
    "=<digest of ID and ifname> =<digest of network>" when that is not plain text that fits
    ('=' starts no container ID); GC finds a network's rules by the last word."""
    text = f"{container_id} {ifname} {network}"
    if len(text) <= nft.COMMENT_MAX and all(_PLAIN.match(w)
                                            for w in (container_id, ifname, network)):
        return text
    return f"={sha512_hex(f'{container_id} {ifname}', 32)} {network_word(network)}"


def network_word(network: str) -> str:
    """How a network is named in the owner comments of its long-named attachments."""
    return "=" + sha512_hex(network, 16)


def of_network(comment: str, network: str) -> bool:
    """Whether an owner comment is of an attachment of `network`."""
    words = comment.split(" ")
    return len(words) in (2, 3) and words[-1] in (network, network_word(network))


def _addr(ip: str) -> tuple[str, str]:
    addr = ipaddress.ip_address(ip)
    return ("ip" if addr.version == 4 else "ip6"), str(addr)


def pod_rules(ips: list[str], comment: str) -> str:
    """The `add rule` commands accepting one attachment's traffic, for each of its addresses."""
    out = ""
    for ip in ips:
        proto, addr = _addr(ip)
        out += (f"add rule {_T} {PODS} {proto} daddr {addr} ct state established,related "
                f"accept comment {nft.quote(comment)}\n"
                f"add rule {_T} {PODS} {proto} saddr {addr} accept comment {nft.quote(comment)}\n")
    return out


# --- where an attachment's rules are, without listing anyone else's ---------------------------
#
# Each attachment has a record chain in the table (never jumped to; cni.host.nftrecord), named
# as portmap's (pycni-att-<hash(network)>-<hash(ifname:container ID)>): made afresh in the ADD's
# batch right before the attachment's rules, its meta rules give their handles and the
# addresses (fact "a"). And each pod address has an index chain pycni-ip-<address> (':' as '_')
# holding one `continue` rule per attachment that has pod rules for it, commented with the
# attachment's record chain: a DEL removes the iptables accepts of an address only when no
# other attachment's index rule is left there (an address reused while a stale attachment still
# holds it). ADD, CHECK and DEL read their own record and index chains only; GC lists the table
# (per network, and rare).

RECORD_PREFIX = "pycni-att-"
INDEX_PREFIX = "pycni-ip-"
ADDRESSES = "a"  # the record's fact: the attachment's pod addresses


def record_chain(container_id: str, ifname: str, network: str) -> str:
    return RECORD_PREFIX + masq.hash_for_instance(network, ifname, container_id)


def network_record_prefix(network: str) -> str:
    return RECORD_PREFIX + masq.hash_for_network(network) + "-"


def index_chain(ip: str) -> str:
    return INDEX_PREFIX + str(ipaddress.ip_address(ip)).replace(":", "_")


def index_address(chain: str) -> str | None:
    """The address an index chain is of (None: not an index chain)."""
    if not chain.startswith(INDEX_PREFIX):
        return None
    try:
        return str(ipaddress.ip_address(chain[len(INDEX_PREFIX):].replace("_", ":")))
    except ValueError:
        return None


class Record(NamedTuple):
    """One attachment's record, read alone."""

    handles: dict[str, list[int]]  # by chain: its pod rules, its index rules
    addresses: list[str]


def read_record(chain: str) -> Record | None:
    rec = nftrecord.read(FAMILY, TABLE, chain, None)
    if rec is None:
        return None
    return Record(rec.handles, [a for a in rec.fact(ADDRESSES) if a])


def add_script(ips: list[str], comment: str, record: str) -> str:
    """The attachment's index chains, then its record made afresh, its pod rules and index
    rules right after it, and the record's meta (after layout_script and any deletions, in one
    batch: nothing else may add to the table between the record chain and the meta)."""
    script = "".join(f"add chain {_T} {nft.chain_name(index_chain(ip))}\n" for ip in ips)
    script += nftrecord.fresh_chain_script(FAMILY, TABLE, record)
    script += pod_rules(ips, comment)
    script += "".join(f"add rule {_T} {nft.chain_name(index_chain(ip))} continue comment "
                      f"{nft.quote(record)}\n" for ip in ips)
    added = [PODS] * (2 * len(ips)) + [index_chain(ip) for ip in ips]
    return script + nftrecord.meta_script(FAMILY, TABLE, record, added,
                                          {ADDRESSES: [str(ipaddress.ip_address(ip))
                                                       for ip in ips]})


def drop_index_script(ip: str) -> str:
    """Delete an address's index chain: refused (the batch fails) while a rule is in it."""
    return f"delete chain {_T} {nft.chain_name(index_chain(ip))}\n"


def unrecorded(record: Record | None, ips: list[str]) -> str | None:
    """The first address whose two accepts the record does not name, or names but are gone
    (the kernel asked for each by handle); None: every one is there."""
    pods = record.handles.get(PODS, []) if record else []
    kept = set(present_handles({PODS: pods}).get(PODS, [])) if pods else set()
    for ip in ips:
        addr = str(ipaddress.ip_address(ip))
        if record is None or addr not in record.addresses:
            return ip
        i = record.addresses.index(addr)  # the rules are recorded in the addresses' order
        if len(pods) != 2 * len(record.addresses) or not set(pods[2 * i:2 * i + 2]) <= kept:
            return ip
    return None


def drop_record_script(record: str, handles: dict[str, list[int]]) -> str:
    return nftrecord.handles_script(FAMILY, TABLE, handles) + \
        nftrecord.drop_script(FAMILY, TABLE, record)


def present_handles(handles: dict[str, list[int]]) -> dict[str, list[int]]:
    """The recorded rules still there (the kernel asked for each by handle)."""
    flat = [(c, h) for c, hs in handles.items() for h in hs]
    found = nftrecord.comments(FAMILY, TABLE, flat)
    out: dict[str, list[int]] = {}
    for (c, h), got in zip(flat, found, strict=True):
        if got is not None:
            out.setdefault(c, []).append(h)
    return out


def index_owners(ip: str) -> list[dict[str, Any]]:
    """The index rules of an address (one per attachment with pod rules for it)."""
    return nft.rules(FAMILY, TABLE, index_chain(ip))


def chain_rules(*chains: str) -> Listing:
    """Some chains of the table, listed one by one (the entry and isolation chains: their size
    is the node's bridges', not its pods')."""
    return Listing(set(), [r for c in chains for r in nft.rules(FAMILY, TABLE, c)])


class Listing(NamedTuple):
    """The table at one moment: its chains and rules (one `nft list table`)."""

    chains: set[str]
    rules: list[dict[str, Any]]

    def owned(self, comment: str) -> list[dict[str, Any]]:
        return [r for r in self.rules if r.get("chain") == PODS and r.get("comment") == comment]

    def commented(self, chain: str, comment: str) -> bool:
        return any(r.get("chain") == chain and r.get("comment") == comment for r in self.rules)

    def jumps(self, chain: str, target: str) -> bool:
        return any(r.get("chain") == chain and _jump(r) == target for r in self.rules)


def listed() -> Listing:
    objs = nft.list_json(f"table {_T}")
    return Listing({o["chain"]["name"] for o in objs if "chain" in o},
                   [o["rule"] for o in objs if "rule" in o])


def _jump(rule: dict[str, Any]) -> str | None:
    for e in rule.get("expr", []):
        if isinstance(e, dict) and "jump" in e:
            return e["jump"].get("target")
    return None


def pod_address(rule: dict[str, Any]) -> str | None:
    """The address a pod rule matches (`ip saddr P` / `ip daddr P`)."""
    for e in rule.get("expr", []):
        m = e.get("match") if isinstance(e, dict) else None
        left = (m or {}).get("left", {})
        if isinstance(left, dict) and left.get("payload", {}).get("field") in ("saddr", "daddr") \
                and isinstance(m.get("right"), str):
            return m["right"]
    return None


def has_pod_rules(listing: Listing, ip: str, comment: str) -> bool:
    """Both of the address's accepts are there with this owner."""
    _, addr = _addr(ip)
    fields = {next((e["match"]["left"]["payload"]["field"] for e in r.get("expr", [])
                    if isinstance(e, dict) and "match" in e
                    and isinstance(e["match"].get("left"), dict)
                    and "payload" in e["match"]["left"]), None)
              for r in listing.owned(comment) if pod_address(r) == addr
              and any(isinstance(e, dict) and "accept" in e for e in r.get("expr", []))}
    return {"saddr", "daddr"} <= fields


def layout_script() -> str:
    """The table, its chains, and `forward` rewritten with the entry jumps: idempotent, and in
    one batch with the rules, atomic."""
    out = (f"add table {_T} {{ comment {nft.quote(TABLE_COMMENT)} ; }}\n"
           f"add chain {_T} {FORWARD} {{ type filter hook forward priority filter ; "
           f"policy accept ; }}\n")
    out += "".join(f"add chain {_T} {chain}\n" for chain in CHAINS if chain != FORWARD)
    out += f"flush chain {_T} {FORWARD}\n"
    return out + "".join(f"add rule {_T} {chain} jump {target}\n" for chain, target in ENTRY)


def layout_present(listing: Listing) -> str | None:
    """What of the skeleton is missing (None: nothing)."""
    for chain, target in ENTRY:
        if not listing.jumps(chain, target):
            return f"{_T}: chain {chain} does not jump to {target}"
    return None


# --- bridge isolation (ingressPolicy same-bridge / isolated) -----------------------------------

def isolation_comments(bridge: str, isolated: bool) -> list[tuple[str, str]]:
    """(chain, comment) of the isolation rules a bridge needs."""
    out = [(STAGE1, f"same-bridge {bridge}"), (STAGE2, f"same-bridge {bridge}")]
    if isolated:
        out.append((STAGE1, f"isolated {bridge}"))
    return out


def isolation_script(listing: Listing, bridge: str, isolated: bool) -> str:
    """The bridge's isolation rules as far as they are missing. The stage-1 drop of `isolated`
    goes first in its chain, as the reference inserts it."""
    b = nft.quote(bridge)
    text = {
        (STAGE1, f"same-bridge {bridge}"): f"add rule {_T} {STAGE1} iifname {b} oifname != {b} "
                                           f"jump {STAGE2}",
        (STAGE2, f"same-bridge {bridge}"): f"add rule {_T} {STAGE2} oifname {b} drop",
        (STAGE1, f"isolated {bridge}"): f"insert rule {_T} {STAGE1} iifname {b} oifname {b} "
                                        f"drop",
    }
    return "".join(f"{text[(chain, c)]} comment {nft.quote(c)}\n"
                   for chain, c in isolation_comments(bridge, isolated)
                   if not listing.commented(chain, c))


def isolation_missing(listing: Listing, bridge: str, isolated: bool) -> str | None:
    for chain, c in isolation_comments(bridge, isolated):
        if not listing.commented(chain, c):
            return f"{_T}: no rule {c!r} in chain {chain}"
    return None
