"""MAC spoof check (macspoofchk): frames entering the bridge from a pod's host veth must carry
the pod's MAC as source, else they are dropped. nftables, exactly the reference's layout and
names (pkg/link/spoofcheck.go), so the reference's teardown removes ours and ours removes theirs:

    table bridge nat
      chain PREROUTING (filter, prerouting, priority -300, policy accept):
          iifname "<host veth>" jump cni-br-iface-<refID> comment "macspoofchk-<refID>"
      chain cni-br-iface-<refID>:      jump cni-br-iface-<refID>-mac   (same comment)
      chain cni-br-iface-<refID>-mac:  ether saddr <mac> return; drop (same comment)

refID is `<containerID>-<ifname>`. pycni releases before the v1.9 layout used a hash instead
(`<sha256(net)[:16]>-<sha256(ifname:cid)[:16]>`, "legacy"): teardown and GC remove those too.

PREROUTING holds one jump per pod on the node, so ADD, CHECK and DEL do not list it: both sides
add the jump right after the -mac chain, so its handle is that chain's + 1, which the kernel
confirms by the rule's comment (cni.host.nftrecord.comments). When it cannot
confirm, the verb lists the table as before. GC lists it.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from cni.host import masq, nft, nftrecord

FAMILY = "bridge"
TABLE = "nat"
BASE = "PREROUTING"
PREFIX = "cni-br-iface-"
TAG = "macspoofchk-"
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-@]+$")
_LEGACY = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{16}$")


def ref_id(container_id: str, ifname: str) -> str:
    """The reference's uniqueID(containerID, ifname)."""
    return f"{container_id}-{ifname}"


def _chains(ref: str) -> tuple[str, str]:
    return PREFIX + ref, PREFIX + ref + "-mac"


def check_names(container_id: str, ifname: str) -> None:
    """ValueError unless this attachment's chains and comment can be written as nft text
    (1.0.6 takes no quoted chain names; a comment holds at most 128 bytes)."""
    ref = ref_id(container_id, ifname)
    for chain in _chains(ref):
        nft.chain_name(chain)
    nft.quote(TAG + ref)


def setup(host_ifname: str, mac: str, container_id: str, ifname: str) -> None:
    """ValueError if the names can't be written as nft identifiers / comments (nothing done)."""
    mac = mac.lower()
    if not _MAC.match(mac) or not _IFNAME.match(host_ifname):
        raise ValueError(f"unsafe spoof check input: {host_ifname!r} {mac!r}")
    ref = ref_id(container_id, ifname)
    iface_chain, mac_chain = (nft.chain_name(c) for c in _chains(ref))
    tag = nft.quote(TAG + ref)
    known = _targeted([ref])
    script = (
        f"add table {FAMILY} {TABLE}\n"
        f"add chain {FAMILY} {TABLE} {BASE} "
        "{ type filter hook prerouting priority -300; policy accept; }\n"
        + (_targeted_script(known) if known is not None else
           _teardown_script(_listing(), [ref]))
        + f"add chain {FAMILY} {TABLE} {iface_chain}\n"
        f"add chain {FAMILY} {TABLE} {mac_chain}\n"
        f"add rule {FAMILY} {TABLE} {BASE} iifname \"{host_ifname}\" jump {iface_chain} "
        f"comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {iface_chain} jump {mac_chain} comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {mac_chain} ether saddr {mac} return comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {mac_chain} drop comment {tag}\n"
    )
    nft.run(script)


def _listing() -> tuple[set[str], list[dict[str, Any]]]:
    """The chains of `bridge nat` and the rules of its PREROUTING chain (one listing)."""
    objs = nft.list_json(nft.ident_family(FAMILY, TABLE, f"table {FAMILY} {TABLE}"))
    chains = {o["chain"]["name"] for o in objs if "chain" in o}
    rules = [o["rule"] for o in objs if "rule" in o and o["rule"].get("chain") == BASE]
    return chains, rules


def _teardown_script(listing: tuple[set[str], list[dict[str, Any]]], refs: list[str]) -> str:
    """Commands removing the jump rules and chains of these refIDs (empty if none exist)."""
    chains, rules = listing
    tags = {TAG + ref for ref in refs}
    script = nft.delete_rules_script([r for r in rules if r.get("comment") in tags])
    doomed = [c for ref in refs for c in _chains(ref) if c in chains]
    script += "".join(f"flush chain {FAMILY} {TABLE} {nft.chain_name(c)}\n" for c in doomed)
    script += "".join(f"delete chain {FAMILY} {TABLE} {nft.chain_name(c)}\n" for c in doomed)
    return script


def _refs(container_id: str, ifname: str, network: str) -> list[str]:
    """This attachment's refID and the one pycni wrote before the v1.9 layout."""
    return [ref_id(container_id, ifname), masq.legacy_instance(network, ifname, container_id)]


_ABSENT = -1  # neither chain of the refID exists


def _chain_handle(name: str) -> int | None:
    found = nft.list_json(f"chain {FAMILY} {TABLE} {nft.chain_name(name)}")
    return next((o["chain"].get("handle") for o in found if "chain" in o), None)


def _targeted(refs: list[str]) -> dict[str, int] | None:
    """refID -> its PREROUTING jump's handle (_ABSENT when it has no chains), without listing
    PREROUTING; None when that cannot be told for one of them (then list)."""
    out = {}
    for ref in refs:
        iface, mac = _chains(ref)
        base = _chain_handle(mac)
        if base is None:
            if _chain_handle(iface) is not None:
                return None
            out[ref] = _ABSENT
        elif nftrecord.comments(FAMILY, TABLE, [(BASE, base + 1)]) == [TAG + ref]:
            out[ref] = base + 1
        else:
            return None
    return out


def _targeted_script(found: dict[str, int]) -> str:
    live = {ref: h for ref, h in found.items() if h != _ABSENT}
    script = "".join(f"delete rule {FAMILY} {TABLE} {BASE} handle {h}\n" for h in live.values())
    doomed = [c for ref in live for c in _chains(ref)]
    script += "".join(f"flush chain {FAMILY} {TABLE} {nft.chain_name(c)}\n" for c in doomed)
    return script + "".join(f"delete chain {FAMILY} {TABLE} {nft.chain_name(c)}\n"
                            for c in doomed)


def teardown(container_id: str, ifname: str, network: str, expected: bool = True) -> bool:
    """Remove this attachment's spoof check (either layout); whether there was one. Not
    `expected` (the attachment's config has no spoof check: DEL removes one anyway, in case
    the config changed): without a `bridge nat` table there is none, told by one read where
    looking for each chain of both layouts takes four."""
    if not expected and not nft.table_exists(FAMILY, TABLE):
        return False
    refs = [r for r in _refs(container_id, ifname, network) if _safe(r)]
    known = _targeted(refs)
    if known is not None:
        script = _targeted_script(known)
        try:
            if script:
                nft.run(script)
            return bool(script)
        except nft.NftError:
            pass  # changed meanwhile: list
    script = _teardown_script(_listing(), refs)
    if script:
        nft.run(script)
    return bool(script)


def _safe(ref: str) -> bool:
    try:
        nft.chain_name(PREFIX + ref)
    except ValueError:
        return False  # a name we could never have written
    return True


def present(container_id: str, ifname: str, network: str) -> bool:
    """The jump rule and the MAC chain exist (for CHECK)."""
    known = _targeted([r for r in _refs(container_id, ifname, network) if _safe(r)])
    if known is not None:
        return any(h != _ABSENT for h in known.values())
    chains, rules = _listing()
    for ref in _refs(container_id, ifname, network):
        if _chains(ref)[1] in chains and any(r.get("comment") == TAG + ref for r in rules):
            return True
    return False


def _jump_iifname(rule: dict[str, Any]) -> str | None:
    for expr in rule.get("expr", []):
        match = expr.get("match")
        if match and match.get("left", {}).get("meta", {}).get("key") == "iifname":
            right = match.get("right")
            return right if isinstance(right, str) else None
    return None


class Check(NamedTuple):
    """One spoof check: its refID and the host veth its jump rule matches (None if unreadable)."""

    ref: str
    host_ifname: str | None


def checks(listing: tuple[set[str], list[dict[str, Any]]] | None = None) -> list[Check]:
    """Every spoof check in `bridge nat` (by its jump rules): what GC judges and `pycni
    attachments` shows."""
    rules = (listing or _listing())[1]
    return [Check(str(r["comment"])[len(TAG):], _jump_iifname(r)) for r in rules
            if str(r.get("comment") or "").startswith(TAG)]


def gc(network: str, valid: set[tuple[str, str]], host_links: set[str]) -> int:
    """Remove stale spoof checks; how many.

    A refID names no network, so a spoof check in the reference's layout is stale when its
    attachment is not valid AND the host veth its jump rule matches is gone (then it guards
    nothing, whichever network it was for). Legacy ones carry the network's hash: stale when
    of this network and not valid, as before."""
    listing = _listing()
    keep = {ref_id(cid, ifname) for cid, ifname in valid}
    legacy_keep = {masq.legacy_instance(network, ifname, cid) for cid, ifname in valid}
    legacy_net = masq.legacy_hash(network) + "-"
    stale = set()
    for ref, host_ifname in checks(listing):
        if _LEGACY.match(ref) and ref.startswith(legacy_net):
            if ref not in legacy_keep:
                stale.add(ref)
        elif ref not in keep and host_ifname not in host_links and _safe(ref):
            stale.add(ref)
    script = _teardown_script(listing, sorted(stale))
    if script:
        nft.run(script)
    return len(stale)
