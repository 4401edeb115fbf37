"""Where one attachment's nftables rules are, kept beside them, so a verb reads one small chain
instead of listing a table that grows with every pod on the node.

An attachment's batch (re)creates its record chain right before adding the attachment's rules to
the same table; the kernel numbers a table's chains and rules from one counter, in batch order
(a batch is one transaction under nftables' commit lock), so the i-th rule added after the chain
has the chain's handle + i. "Meta" rules in the record chain (never jumped to, `continue` only)
keep those offsets and small facts the verbs need:

    continue comment "=h <chain> <offset>,<offset>"   the rules, by chain (as many as fit)
    continue comment "=<k> <value>,<value>"           a fact: k is one letter (chunked likewise)

A handle is unique in its table for the table's lifetime and the record lives in that table, so
a recorded handle is that rule or no rule at all (nftables never edits a rule in place). A verb
whose record is missing, has no meta, or names a handle that is gone (another implementation's
DEL removed the rules) lists the table as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from cni.host import netns, nft

if TYPE_CHECKING:
    from pyroute2 import NFTSocket

_ROOM = 120  # bytes of one meta comment (nft keeps 128)


class Record(NamedTuple):
    """One record chain, read alone: its rules' handles by chain, and its facts."""

    handles: dict[str, list[int]]
    facts: dict[str, list[str]]

    def fact(self, key: str) -> list[str]:
        return self.facts.get(key, [])


def is_meta(rule: dict[str, Any]) -> bool:
    words = str(rule.get("comment") or "").split(" ")
    return len(words) in (2, 3) and len(words[0]) == 2 and words[0][0] == "="


def read(family: str, table: str, chain: str, owned: tuple[str, ...] | None) -> Record | None:
    """The record chain's meta; None when there is no such chain (or table). Handles are kept
    only for rules in the `owned` chains (None: in any chain)."""
    found = nft.list_json(nft.ident_family(family, table, f"chain {family} {table} "
                                                          f"{nft.chain_name(chain)}"))
    base = next((o["chain"].get("handle") for o in found if "chain" in o), None)
    if not isinstance(base, int):
        return None
    handles: dict[str, list[int]] = {}
    facts: dict[str, list[str]] = {}
    for o in found:
        rule = o.get("rule", {})
        if not is_meta(rule):
            continue
        words = str(rule["comment"]).split(" ")
        if words[0] == "=h" and len(words) == 3 and (owned is None or words[1] in owned):
            handles.setdefault(words[1], []).extend(
                base + int(n) for n in words[2].split(",") if n.isdigit())
        elif len(words) == 2:
            facts.setdefault(words[0][1], []).extend(words[1].split(","))
    return Record(handles, facts)


def fresh_chain_script(family: str, table: str, chain: str) -> str:
    """(Re)create the record chain empty: a new handle, the base of the next rules' offsets."""
    t = f"{family} {nft.ident(table)} {nft.chain_name(chain)}"
    return f"add chain {t}\nflush chain {t}\ndelete chain {t}\nadd chain {t}\n"


def drop_script(family: str, table: str, chain: str) -> str:
    t = f"{family} {nft.ident(table)} {nft.chain_name(chain)}"
    return f"flush chain {t}\ndelete chain {t}\n"


def meta_script(family: str, table: str, chain: str, added: list[str],
                facts: dict[str, list[str]]) -> str:
    """The meta rules of a record whose chain was made right before rules were added, in this
    order, to the chains `added` names."""
    offsets: dict[str, list[str]] = {}
    for i, owned in enumerate(added, start=1):
        offsets.setdefault(owned, []).append(str(i))
    comments = [c for key, values in sorted(facts.items()) for c in _chunks(f"={key}", values)]
    comments += [c for owned, found in sorted(offsets.items())
                 for c in _chunks(f"=h {owned}", found)]
    t = f"{family} {nft.ident(table)} {nft.chain_name(chain)}"
    return "".join(f"add rule {t} continue comment {nft.quote(c)}\n" for c in comments)


def _chunks(head: str, items: list[str]) -> list[str]:
    out: list[str] = []
    for item in items:
        if out and len(out[-1]) + 1 + len(item) <= _ROOM:
            out[-1] += "," + item
        else:
            out.append(f"{head} {item}")
    return out


def handles_script(family: str, table: str, handles: dict[str, list[int]]) -> str:
    """Delete these rules by handle (for one batch with other work)."""
    return nft.delete_rules_script([{"family": family, "table": table, "chain": c, "handle": h}
                                    for c, found in sorted(handles.items()) for h in found])


# nfgen families of nft's family names (NFPROTO_*), for asking the kernel for one rule
NFPROTO = {"inet": 1, "ip": 2, "arp": 3, "netdev": 5, "bridge": 7, "ip6": 10}


def present(family: str, table: str, handles: dict[str, list[int]]) -> bool:
    """Every one of these rules is still in its chain (asked of the kernel one by one, see
    `comments`)."""
    if not handles:
        return False
    found = comments(family, table, [(c, h) for c, hs in handles.items() for h in hs])
    return all(c is not None for c in found)


# A spare's NFTSockets for its own namespace, by family, kept from request to request (as
# netns.keep_home_socket keeps its IPRoute): (namespace, {family: socket}).
_kept: tuple[tuple[int, int], dict[str, NFTSocket]] | None = None
KEPT_FAMILIES = ("inet", "ip", "ip6", "bridge")  # CHECK's: masq's table, portmap's two, spoofchk's


def keep_home_sockets() -> None:
    """Make an NFTSocket per KEPT_FAMILIES family for this process's namespace now, and use it
    there from now on (comments), never closed. Only for a daemon's spare, in its warm-up
    (before it records its fds): an NFTSocket costs ~0.2 ms to make and ~0.05 to close, most of
    a CHECK's query. No multicast groups: each request reads its own answer, by sequence
    number."""
    global _kept
    if _kept is None:
        from pyroute2 import NFTSocket

        _kept = (netns.ns_key(), {f: NFTSocket(nfgen_family=NFPROTO[f]) for f in KEPT_FAMILIES})


def forget_inherited() -> None:
    """In a forked child (netns.forget_inherited): NFTSockets of its own from now on."""
    global _kept
    netns.keep_referenced(_kept)
    _kept = None


def comments(family: str, table: str, rules: list[tuple[str, int]]) -> list[str | None]:
    """The comment of each (chain, handle) rule ("" without one, None when there is no such
    rule), as the kernel answers for one rule by table, chain and handle (NFT_MSG_GETRULE
    without a dump; nft's CLI has no such query), through pyroute2's NFTSocket (pyroute2 is
    the netlink layer of every verb, imported anyway): a kept one in its namespace, else one
    made for the call. Several rules are asked in one send (nlm_request_batch; each get asks
    for an ACK, which ends its answer; ~60 us less for four rules): a rule that is not there
    (ENOENT, or its chain or table) has no answer, as a refused get alone, and is None. One
    rule is asked alone, without the ACK (~10 us less than a batch of one)."""
    from pyroute2 import NetlinkError, NFTSocket
    from pyroute2.netlink import NLM_F_REQUEST
    from pyroute2.netlink.nfnetlink.nftsocket import NFT_MSG_GETRULE

    if not rules:
        return []
    kept = _kept[1].get(family) if _kept is not None and _kept[0] == netns.ns_key() else None
    sock = kept or NFTSocket(nfgen_family=NFPROTO[family])
    try:
        asked = [get_rule_message(family, table, chain, handle) for chain, handle in rules]
        if len(asked) == 1:  # request_get sets its own header: type, flags (no ACK)
            try:
                replies = sock.request_get(asked[0], NFT_MSG_GETRULE, msg_flags=NLM_F_REQUEST)
            except NetlinkError:
                replies = ()  # ENOENT: gone (or the chain or table is)
        else:
            replies = sock.nlm_request_batch(asked, noraise=True)
    finally:
        if sock is not kept:
            sock.close()
    new_rule = _nft_type("NEWRULE")
    found: dict[int, str] = {}
    for m in replies:
        header = m["header"]
        if header["type"] == new_rule:
            found.setdefault(header["sequence_number"],
                             str(m.get_attr("NFTA_RULE_USERDATA") or ""))
    # nlm_request_batch numbered each request's header in place; its answer carries that number
    return [found.get(msg["header"]["sequence_number"]) for msg in asked]


def _nft_type(name: str) -> int:
    """The netlink message type of NFT_MSG_<name> (nfnetlink's subsystem in the high byte)."""
    from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_NFTABLES, nftsocket

    return (NFNL_SUBSYS_NFTABLES << 8) | getattr(nftsocket, f"NFT_MSG_{name}")


def get_rule_message(family: str, table: str, chain: str, handle: int) -> Any:
    """The NFT_MSG_GETRULE of one rule that NFTSocket(nfgen_family=...).request_get(msg,
    NFT_MSG_GETRULE, msg_flags=NLM_F_REQUEST) sends, with NLM_F_ACK too (so that a batch
    reads its answer to the end), for nlm_request_batch."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.nfnetlink.nftsocket import nft_rule_msg

    msg = nft_rule_msg()
    msg["attrs"] = [("NFTA_RULE_TABLE", table), ("NFTA_RULE_CHAIN", chain),
                    ("NFTA_RULE_HANDLE", handle)]
    msg["nfgen_family"] = NFPROTO[family]
    msg["header"]["type"] = _nft_type("GETRULE")
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    return msg
