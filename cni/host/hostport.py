"""hostPort forwarding on nftables: the reference portmap layout, its rule text, and reading back.

Layout per family (`ip cni_hostport`, `ip6 cni_hostport`), as the reference after its fix for
CVE-2025-67499 (transit traffic was DNAT'ed):

    prerouting, output (nat, dstnat):  <conditions> fib daddr type local jump hostports_all
    hostports_all:                     jump hostip_hostports; jump hostports
    hostports:                         [ip daddr H] tcp dport 8080 dnat to 10.0.0.2:80  # owner
    masquerading (nat, srcnat):        ip saddr C ip daddr C masquerade                 # owner

`hostip_hostports` is kept (empty) so tables made by older reference versions still work; every
new rule goes to `hostports`. Each container rule carries its owner in the comment, so DEL and GC
remove exactly their own rules. Tables and chains are never deleted (others may share them).
Nothing here knows CNI: callers hand in validated mappings, addresses and condition tokens.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from cni.host import masq, nft, nftrecord
from cni.host.digest import sha256_hex, sha512_hex

TABLE = "cni_hostport"
HOSTPORTS = "hostports"
HOSTIP_HOSTPORTS = "hostip_hostports"
HOSTPORTS_ALL = "hostports_all"
MASQUERADING = "masquerading"
OWNED_CHAINS = (HOSTPORTS, HOSTIP_HOSTPORTS, MASQUERADING)  # where container rules live
NFT_FAMILY = {4: "ip", 6: "ip6"}
PROTOCOLS = ("tcp", "udp", "sctp")
TABLE_COMMENT = "CNI portmap plugin"


class Mapping(NamedTuple):
    """One validated port mapping; host_ip is "" for any local address."""

    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""


class Rule(NamedTuple):
    """A container rule: `==` matches (left, right) then one action, in one chain of a family."""

    family: int
    chain: str
    matches: tuple[tuple[str, str], ...]
    action: tuple[str, ...]  # ("dnat", addr, port) or ("masquerade",)

    def text(self) -> str:
        parts = [f"{left} {right}" for left, right in self.matches]
        if self.action[0] == "dnat":
            addr, port = self.action[1], self.action[2]
            target = f"[{addr}]:{port}" if self.family == 6 else f"{addr}:{port}"
            parts.append(f"dnat to {target}")
        else:
            parts.append("masquerade")
        return " ".join(parts)

    def signature(self) -> tuple:
        return (self.chain, self.matches, self.action)


# --- owner comments and attachment records -----------------------------------------------------
#
# Every container rule's comment is the bare container ID, as the reference writes it: its DEL and
# CHECK select the rules whose comment *equals* CNI_CONTAINERID, so each side removes and checks the
# other's rules. The ID names no network, so pycni also writes, per attachment and family, a record
# chain in the same table (never jumped to):
#
#     chain pycni-att-<hash(net)>-<hash(ifname:cid)> { ip daddr <container IP> comment "<cid>" }
#
# (hashes as the masquerade comments', cni.host.masq). GC finds a network's attachments by the
# chain-name prefix and each one's rules by comment and container IP (the DNAT target, or the
# masquerade rule's daddr); DEL of one attachment leaves the rules another attachment of the same
# container records (another network with portmap). Records and rules change in one batch, so they
# never disagree; rules with no record (the reference's own) are found by DEL and CHECK by their
# comment, and are not GC'ed by network (the reference has no portmap GC at all). The reference's
# DEL of one of our attachments removes its rules and leaves the record (a chain nothing jumps
# to): our next GC of any network removes such orphan records.
#
# pycni releases before the v1.9 layout commented rules "<cid> <network> <ifname>" ("legacy"):
# DEL, re-ADD and GC still find those by that comment.

RECORD_PREFIX = "pycni-att-"


def rule_comment(container_id: str) -> str:
    """The container ID itself; one over nft's 128 bytes (the reference can't write it at all)
    becomes a digest that no valid ID equals ('=' can't start one)."""
    if len(container_id) <= 128 and _PLAIN.match(container_id):
        return container_id
    return "=" + sha512_hex(container_id, 32)


def record_chain(container_id: str, network: str, ifname: str) -> str:
    return RECORD_PREFIX + masq.hash_for_instance(network, ifname, container_id)


def network_record_prefix(network: str) -> str:
    return RECORD_PREFIX + masq.hash_for_network(network) + "-"


class Listing(NamedTuple):
    """One family's table at one moment: chain names and rules (one `nft list table`)."""

    family: int
    chains: set[str]
    rules: list[dict[str, Any]]
    exists: bool = True  # False: there was no table

    def records(self) -> dict[str, tuple[str | None, str | None]]:
        """Record chain -> (owner comment, container IP); (None, None) for an empty one."""
        out: dict[str, tuple[str | None, str | None]] = {
            c: (None, None) for c in self.chains if c.startswith(RECORD_PREFIX)}
        for r in self.rules:
            if str(r.get("chain", "")).startswith(RECORD_PREFIX) and not nftrecord.is_meta(r):
                sig = signature(r, allow_no_action=True)
                ip = next((v for left, v in sig[1] if left.endswith("daddr")), None) \
                    if sig else None
                out[r["chain"]] = (r.get("comment"), ip)
        return out

    def owned(self, comment: str) -> list[dict[str, Any]]:
        return [r for r in self.rules if r.get("chain") in OWNED_CHAINS
                and r.get("comment") == comment]


def attachment_rules(listing: Listing, comment: str, chain: str) -> list[dict[str, Any]]:
    """The rules of the attachment whose record chain is `chain` and rule comment `comment`:
    those with that comment whose container IP is its record's, or no other record's."""
    records = listing.records()
    own = {ip for c, (_, ip) in records.items() if c == chain and ip}
    others = {ip for c, (cmt, ip) in records.items() if c != chain and cmt == comment and ip}
    return [r for r in listing.owned(comment)
            if container_ip(r) in own or container_ip(r) not in others]


def stale_records(listing: Listing, network: str,
                  keep: set[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """GC: the network's record chains not in `keep` and the rules they record (none that a
    kept record of the same comment and IP also claims), plus any network's orphan records:
    ones whose rules are all gone (the reference's DEL removes the rules, not our records;
    rules and record are only ever written together, so an orphan is never half an ADD)."""
    records = listing.records()
    prefix = network_record_prefix(network)
    claimed = {(r.get("comment"), container_ip(r)) for r in listing.rules
               if r.get("chain") in OWNED_CHAINS}
    stale = [c for c, (cmt, ip) in records.items()
             if (c.startswith(prefix) and c not in keep) or (cmt, ip) not in claimed]
    live = {(cmt, ip) for c, (cmt, ip) in records.items() if c not in stale}
    rules = [r for c in stale if records[c][0] and records[c][1]
             for r in listing.owned(records[c][0])
             if container_ip(r) == records[c][1] and (records[c][0], records[c][1]) not in live]
    return stale, rules


def container_ip(rule: dict[str, Any]) -> str | None:
    """The pod address a container rule is about: its DNAT target, or masquerade's daddr."""
    sig = signature(rule)
    if sig is None:
        return None
    if sig[2][0] == "dnat":
        return sig[2][1]
    return next((v for left, v in sig[1] if left.endswith("daddr")), None)


def record_rule(family: int, chain: str, ip: str, comment: str) -> str:
    """The rule of one attachment's record naming its container IP (the chain's last rule)."""
    t = f"{NFT_FAMILY[family]} {TABLE}"
    return (f"add rule {t} {nft.chain_name(chain)} {NFT_FAMILY[family]} daddr "
            f"{ipaddress.ip_address(ip)} comment {nft.quote(comment)}\n")


def drop_chains_script(family: int, chains: Iterable[str]) -> str:
    t = f"{NFT_FAMILY[family]} {TABLE}"
    names = [nft.chain_name(c) for c in chains]
    return "".join(f"flush chain {t} {c}\ndelete chain {t} {c}\n" for c in names)


# --- where an attachment's rules are, without listing anyone else's ---------------------------
#
# The record also says where its attachment's rules are (cni.host.nftrecord: the record chain
# made afresh right before them in the ADD's batch, the rules' handle offsets in meta rules), so
# DEL, CHECK and a fresh ADD read one small chain instead of the whole table, whose size grows
# with every pod on the node. Facts kept: "u" the UDP hostPorts (DEL's conntrack flush), "s" a
# digest of the rules as written (CHECK). The record's IP rule stays its chain's last rule.
#
# A table may also still hold rules in pycni's pre-v1.9 comment layout (written before an
# upgrade), which no record points to: only a listing finds them. A batch that knows there are
# none adds the empty chain NO_LEGACY to the table (old releases never made one, and they are
# the only writers of that layout); from then on a fresh ADD and a DEL by record list nothing.

NO_LEGACY = "pycni-no-legacy"


class Record(NamedTuple):
    """One family's record, read alone."""

    handles: dict[str, list[int]]
    udp: set[int]
    digest: str | None

    @property
    def usable(self) -> bool:
        return bool(self.handles) and self.digest is not None


def read_record(family: int, chain: str) -> Record | None:
    """The record chain's meta, or None when there is no such chain (or table)."""
    rec = nftrecord.read(NFT_FAMILY[family], TABLE, chain, OWNED_CHAINS)
    if rec is None:
        return None
    return Record(rec.handles, {int(p) for p in rec.fact("u") if p.isdigit()},
                  next(iter(rec.fact("s")), None))


def handles_script(family: int, handles: dict[str, list[int]]) -> str:
    return nftrecord.handles_script(NFT_FAMILY[family], TABLE, handles)


def without_legacy(family: int) -> bool:
    """No rule of the pre-v1.9 layout can be in this family's table: it says so (NO_LEGACY), or
    there is no table yet (its entry chain is missing)."""
    fam = NFT_FAMILY[family]
    return bool(nft.list_json(f"chain {fam} {TABLE} {NO_LEGACY}")) or \
        not nft.list_json(f"chain {fam} {TABLE} prerouting")


def has_legacy(listing: Listing, dropped: list[dict[str, Any]]) -> bool:
    """Whether a listed table keeps rules of the pre-v1.9 layout after `dropped` go."""
    gone = {(r.get("chain"), r.get("handle")) for r in dropped}
    return any(r.get("chain") in OWNED_CHAINS and " " in str(r.get("comment") or "")
               and (r.get("chain"), r.get("handle")) not in gone for r in listing.rules)


# --- "every container rule here has its record": a DEL that has no record reads no table -----
#
# An attachment with no record chain (the common pod: its ADD had no portMappings and wrote
# nothing) may still have rules by its container ID that no record names: the reference's ADD
# writes those (an operator may swap binaries with live pods), and only a listing of the table,
# which grows with every pod on the node, finds them. So an ADD's batch that knows every container
# rule of a family's table (after the batch) is named by a record (comment and container IP), and
# no rule of the pre-v1.9 layout is there, vouches for it: it makes the empty chain ALL_RECORDED
# afresh right before its prerouting entry rule, whose handle is then the chain's + 1 (see
# cni.host.nftrecord). Every ADD, the reference's (knftables: flush prerouting, add its rule) and
# every pycni release's, flushes prerouting and adds its entry rule anew, and a handle is never
# used twice in a table: while that rule is still in prerouting, no ADD has run since but one that
# vouched again. DEL and GC (the reference's and ours) only remove rules, with or before their
# records. The batch vouches only with a witness that what it judged is still so when it commits:
# it deletes the entry rule it saw by handle, or creates the table it saw missing (either fails
# the batch if another ADD came between; it is then rebuilt from a listing).

ALL_RECORDED = "pycni-all-recorded"


def vouched_entry(family: int) -> int | None:
    """The handle of the prerouting entry rule an ADD vouched with, while it is still there
    (then every container rule of the table has its record); else None."""
    fam = NFT_FAMILY[family]
    mark = nft.list_json(f"chain {fam} {TABLE} {ALL_RECORDED}")
    base = next((o["chain"].get("handle") for o in mark if "chain" in o), None)
    if not isinstance(base, int):
        return None
    entry = {r.get("handle") for r in nft.rules(fam, TABLE, "prerouting")}
    return base + 1 if base + 1 in entry else None


def all_recorded(listing: Listing, dropped: list[dict[str, Any]], dropped_chains: Iterable[str],
                 added: tuple[str, str] | None = None) -> bool:
    """Whether every container rule of a listed table is named by a record (its comment and
    container IP) once `dropped` rules and `dropped_chains` go and a record of `added`
    (comment, IP) is made. A rule of the pre-v1.9 layout never is (no record has its comment)."""
    gone = {(r.get("chain"), r.get("handle")) for r in dropped}
    drop = set(dropped_chains)
    named = {v for c, v in listing.records().items() if c not in drop and v[0] and v[1]}
    if added:
        named.add(added)
    return all((r.get("comment"), container_ip(r)) in named for r in listing.rules
               if r.get("chain") in OWNED_CHAINS and (r.get("chain"), r.get("handle")) not in gone)


def entry_witness(listing: Listing) -> int | None:
    """A prerouting rule of a listed table (a batch deletes it by handle as its witness)."""
    return next((r["handle"] for r in listing.rules if r.get("chain") == "prerouting"
                 and isinstance(r.get("handle"), int)), None)


def rules_digest(rules: Iterable[Rule]) -> str:
    return sha256_hex("\n".join(sorted(f"{r.chain} {r.text()}" for r in rules)), 16)


def _facts(rules: list[Rule]) -> dict[str, list[str]]:
    udp = sorted({int(v) for r in rules if r.chain == HOSTPORTS
                  for left, v in r.matches if left == "udp dport"})
    return {"s": [rules_digest(rules)], "u": [str(p) for p in udp]}


_PLAIN = re.compile(r"^[A-Za-z0-9_.@=+,\-]+$")


def _part(value: str, limit: int) -> str:
    """A legacy comment word: the value itself when short and safe, else '=' + 16 hex."""
    if value and len(value) <= limit and _PLAIN.match(value) and not value.startswith("="):
        return value
    return "=" + sha256_hex(value, 16)


def legacy_owner(container_id: str, network: str, ifname: str) -> str:
    """The comment pycni wrote before the v1.9 layout: '<containerID> <network> <ifname>'."""
    return f"{_part(container_id, 64)} {_part(network or '-', 40)} {_part(ifname, 17)}"


def legacy_owner_in_network(comment: str, network: str) -> tuple[str, str] | None:
    """(container part, ifname part) when the comment is a legacy one of `network`."""
    words = comment.split(" ")
    if len(words) == 3 and words[1] == _part(network or "-", 40):
        return words[0], words[2]
    return None


def legacy_attachment_key(container_id: str, ifname: str) -> tuple[str, str]:
    return _part(container_id, 64), _part(ifname, 17)


# --- rules ------------------------------------------------------------------------------------

def container_rules(ips: dict[int, str], mappings: Iterable[Mapping], snat: bool,
                    masq_all: bool) -> list[Rule]:
    """Every rule one container needs, for each family it has an address in.

    A hostIP applies only to its own family ("0.0.0.0" / "::" mean any address of it).
    """
    out: list[Rule] = []
    for family, cip in ips.items():
        ipx = NFT_FAMILY[family]
        for m in mappings:
            if m.host_ip and ipaddress.ip_address(m.host_ip).version != family:
                continue
            matches: list[tuple[str, str]] = []
            if m.host_ip and not ipaddress.ip_address(m.host_ip).is_unspecified:
                matches.append((f"{ipx} daddr", m.host_ip))
            matches.append((f"{m.protocol} dport", str(m.host_port)))
            out.append(Rule(family, HOSTPORTS, tuple(matches),
                            ("dnat", cip, str(m.container_port))))
            if snat and masq_all:
                # Every client of the hostPort is masqueraded (the reference's masqAll).
                out.append(Rule(family, MASQUERADING,
                                (("ct status", "dnat"), (f"{ipx} daddr", cip),
                                 (f"{m.protocol} dport", str(m.container_port))),
                                ("masquerade",)))
        if snat:
            # Hairpin: the pod reaching itself through its hostPort must see the host as source.
            out.append(Rule(family, MASQUERADING,
                            ((f"{ipx} saddr", cip), (f"{ipx} daddr", cip)), ("masquerade",)))
            if family == 4:  # 127.0.0.1:hostPort (::1 cannot leave lo, so v4 only)
                out.append(Rule(family, MASQUERADING,
                                ((f"{ipx} saddr", "127.0.0.1"), (f"{ipx} daddr", cip)),
                                ("masquerade",)))
    return out


def _skeleton(family: int, conditions: str, snat: bool, vouch: int | None = None) -> str:
    """Idempotent table and chain creation; base chains rewritten with the current conditions.
    With `vouch` (see ALL_RECORDED), the batch's witness: 0 creates the table (it was missing),
    else the entry rule of that handle is deleted (it was there); and ALL_RECORDED is made
    right before the new entry rule."""
    t = f"{NFT_FAMILY[family]} {TABLE}"
    fam = NFT_FAMILY[family]
    verb = "create" if vouch == 0 else "add"
    lines = [f"{verb} table {t} {{ comment {nft.quote(TABLE_COMMENT)} ; }}"]
    lines += [f"add chain {t} {c}" for c in (HOSTPORTS, HOSTIP_HOSTPORTS, HOSTPORTS_ALL)]
    lines += [f"flush chain {t} {HOSTPORTS_ALL}",
              f"add rule {t} {HOSTPORTS_ALL} jump {HOSTIP_HOSTPORTS}",
              f"add rule {t} {HOSTPORTS_ALL} jump {HOSTPORTS}"]
    entry = " ".join(p for p in (conditions, "fib daddr type local", "jump", HOSTPORTS_ALL) if p)
    for chain, hook in (("prerouting", "prerouting"), ("output", "output")):
        # Numeric priorities: nft accepts the name "dstnat" for prerouting only.
        lines += [f"add chain {t} {chain} {{ type nat hook {hook} priority -100 ; "
                  f"policy accept ; }}"]
        if chain == "prerouting" and vouch:
            lines.append(f"delete rule {t} {chain} handle {int(vouch)}")
        lines.append(f"flush chain {t} {chain}")
        if chain == "prerouting" and vouch is not None:
            lines.append(nftrecord.fresh_chain_script(fam, TABLE, ALL_RECORDED).rstrip("\n"))
        lines.append(f"add rule {t} {chain} {entry}")
    if snat:
        lines.append(f"add chain {t} {MASQUERADING} {{ type nat hook postrouting "
                     f"priority 100 ; policy accept ; }}")
    return "\n".join(lines) + "\n"


def add_script(rules: list[Rule], comment: str, conditions: dict[int, str], snat: bool,
               replace: list[dict[str, Any]], records: dict[int, tuple[str, str]],
               drop_records: dict[int, list[str]], clean: set[int],
               vouch: dict[int, int] | None = None) -> str:
    """One batch: the skeleton of each family in use (vouching in the `vouch` ones, with their
    witness: see _skeleton), drop `replace` (our older rules) and the `drop_records` chains;
    then per family the record chain made afresh, the rules right after it, the record's IP
    and meta (see above); NO_LEGACY in the `clean` families."""
    families = sorted({r.family for r in rules})
    vouch = vouch or {}
    script = "".join(_skeleton(f, conditions.get(f, ""), snat, vouch.get(f)) for f in families)
    script += nft.delete_rules_script(replace)
    script += "".join(drop_chains_script(f, chains) for f, chains in drop_records.items())
    quoted = nft.quote(comment)
    for f in families:
        t = f"{NFT_FAMILY[f]} {TABLE}"
        chain, ip = records[f]
        mine = [r for r in rules if r.family == f]
        script += nftrecord.fresh_chain_script(NFT_FAMILY[f], TABLE, chain)
        script += "".join(f"add rule {t} {r.chain} {r.text()} comment {quoted}\n" for r in mine)
        script += nftrecord.meta_script(NFT_FAMILY[f], TABLE, chain, [r.chain for r in mine],
                                        _facts(mine))
        script += record_rule(f, chain, ip, comment)
        if f in clean:
            script += f"add chain {t} {NO_LEGACY}\n"
    return script


# --- reading back -----------------------------------------------------------------------------

def listed(family: int) -> Listing:
    """Our table in one family (empty when the table does not exist), in one listing."""
    fam = NFT_FAMILY[family]
    objs = nft.list_json(nft.ident_family(fam, TABLE, f"table {fam} {TABLE}"))
    return Listing(family, {o["chain"]["name"] for o in objs if "chain" in o},
                   [o["rule"] for o in objs if "rule" in o], bool(objs))


def _value(right: Any) -> str | None:
    if isinstance(right, (str, int)) and not isinstance(right, bool):
        text = str(right)
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            return text
    if isinstance(right, list) and len(right) == 1:  # ct status lists its flags
        return _value(right[0])
    return None


def signature(rule: dict[str, Any], allow_no_action: bool = False) -> tuple | None:
    """A listed rule in the shape of `Rule.signature()`, or None if it is not of our forms
    (with allow_no_action, a match-only rule such as a record gives action None)."""
    matches: list[tuple[str, str]] = []
    action: tuple[str, ...] | None = None
    for expr in rule.get("expr", []):
        if "match" in expr:
            m = expr["match"]
            left, right = m.get("left", {}), _value(m.get("right"))
            if m.get("op") not in ("==", "in") or right is None:
                return None
            if "payload" in left:
                matches.append((f"{left['payload']['protocol']} {left['payload']['field']}",
                                right))
            elif "ct" in left:
                matches.append((f"ct {left['ct']['key']}", right))
            else:
                return None
        elif "dnat" in expr:
            d = expr["dnat"]
            action = ("dnat", _value(d.get("addr")) or "", str(d.get("port", "")))
        elif "masquerade" in expr:
            action = ("masquerade",)
        else:
            return None
    return (rule.get("chain"), tuple(matches), action) if action or allow_no_action else None


def udp_host_ports(found: Iterable[dict[str, Any]]) -> set[int]:
    """The UDP hostPorts of listed DNAT rules (for the conntrack flush after DEL and GC)."""
    ports: set[int] = set()
    for rule in found:
        sig = signature(rule)
        if sig and sig[2][0] == "dnat":
            ports.update(int(v) for left, v in sig[1] if left == "udp dport" and v.isdigit())
    return ports


def entry_rules_present(found: list[dict[str, Any]]) -> bool:
    """Whether prerouting and output both jump to hostports_all."""
    def jumps(chain: str) -> bool:
        return any(e.get("jump", {}).get("target") == HOSTPORTS_ALL
                   for r in found if r.get("chain") == chain for e in r.get("expr", []))
    return jumps("prerouting") and jumps("output")


# --- host side: localhost through the hostPort -----------------------------------------------

def route_localnet_toward(ip: str) -> str | None:
    """Set route_localnet=1 on the interface that routes to `ip` (current netns); its name."""
    import socket

    from cni.host import netns, routes, sysctl

    with netns.iproute() as ipr:  # no route to the pod: nothing to enable (the reference skips)
        oif = routes.oif_toward(ipr, str(ipaddress.ip_address(ip)))
    if oif is None:
        return None
    ifname = socket.if_indextoname(oif)  # one ioctl in this netns, not an RTM_GETLINK
    sysctl.write(sysctl.conf(4, ifname, "route_localnet"), 1)
    return ifname


# --- conditions (conditionsV4 / conditionsV6) -------------------------------------------------
#
# The reference pastes the condition strings in front of its jump rules. We accept any *match*
# nftables itself accepts there (`meta pkttype host`, `fib saddr type local`, sets...), in two
# steps: `conditions_text` refuses, by the text alone, everything that is not a match (statement
# separators, comments, variables, named sets and maps, nested sets, and every statement, verdict
# or command keyword); `conditions_check` then has libnftables parse and evaluate the rule in both
# hooks it will live in, without applying anything. A condition can only narrow what jumps.

# Statement, verdict, set-definition and command words: a match never needs them.
_NOT_MATCH_WORDS = frozenset(re.findall(r"\S+", """
accept drop reject jump goto return continue queue dnat snat masquerade redirect counter log
limit notrack flow offload tproxy synproxy quota dup fwd to set map vmap add update delete comment
define include table chain rule flush insert replace create list reset destroy export import
monitor describe element elements policy hook priority meter last xt count over timeout expires
typeof flags size
"""))
_ALLOWED_CHARS = re.compile(r'^[A-Za-z0-9 .:/\-_!=<>&|^{},"*]*$')
_TOKEN = re.compile(r'"[^"]*"|[{},]|[^\s{},"]+')
_QUOTED = re.compile(r'^"[A-Za-z0-9_.\-:/* ]*"$')


def conditions_text(tokens: list[str]) -> str:
    """The conditions as one nft fragment, or ValueError saying what is not a match."""
    text = " ".join(tokens)
    bad = sorted({c for c in text if not _ALLOWED_CHARS.fullmatch(c)})
    if bad:
        raise ValueError(f"character(s) {''.join(bad)!r} not allowed in a match condition")
    found = _TOKEN.findall(text)
    if "".join(found) != re.sub(r"\s+", "", text):
        raise ValueError("unterminated quote")
    depth = 0
    for tok in found:
        if tok == "{":
            if depth:
                raise ValueError("nested sets are not allowed")
            depth = 1
        elif tok == "}":
            if not depth:
                raise ValueError("unbalanced '}'")
            depth = 0
        elif tok.startswith('"') and not _QUOTED.match(tok):
            raise ValueError(f"{tok} is not allowed in a match condition")
        elif tok.lower() in _NOT_MATCH_WORDS:
            raise ValueError(f"{tok!r} is a statement, not a match condition")
    if depth:
        raise ValueError("unbalanced '{'")
    return " ".join(found).replace(" ,", ",")


def conditions_check(family: int, text: str) -> None:
    """ValueError with nft's message unless nft accepts `text` as the conditions of a rule in
    a nat prerouting and a nat output chain of this family (dry run: nothing is created)."""
    ipx = NFT_FAMILY[family]
    t = f"{ipx} pycni_condition_check"
    error = nft.check(
        f"add table {t}\n"
        f"add chain {t} pre {{ type nat hook prerouting priority -100 ; }}\n"
        f"add chain {t} out {{ type nat hook output priority -100 ; }}\n"
        f"add rule {t} pre {text} return\n"
        f"add rule {t} out {text} return\n")
    if error:
        raise ValueError(f"nftables refuses it: {error.splitlines()[0]}")
