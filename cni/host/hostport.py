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

import hashlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cni.host import nft

TABLE = "cni_hostport"
HOSTPORTS = "hostports"
HOSTIP_HOSTPORTS = "hostip_hostports"
HOSTPORTS_ALL = "hostports_all"
MASQUERADING = "masquerading"
OWNED_CHAINS = (HOSTPORTS, HOSTIP_HOSTPORTS, MASQUERADING)  # where container rules live
NFT_FAMILY = {4: "ip", 6: "ip6"}
PROTOCOLS = ("tcp", "udp", "sctp")
TABLE_COMMENT = "CNI portmap plugin"


@dataclass(frozen=True)
class Mapping:
    """One validated port mapping; host_ip is "" for any local address."""

    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""


@dataclass(frozen=True)
class Rule:
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


# --- owner comments ---------------------------------------------------------------------------

_PLAIN = re.compile(r"^[A-Za-z0-9_.@=+,\-]+$")


def _part(value: str, limit: int) -> str:
    """A comment word: the value itself when short and safe, else a digest ('=' + 16 hex).

    Container IDs and network names cannot start with '=' and interface names are at most 15
    bytes, so a digest never collides with a plain value.
    """
    if value and len(value) <= limit and _PLAIN.match(value) and not value.startswith("="):
        return value
    return "=" + hashlib.sha256(value.encode()).hexdigest()[:16]


def owner(container_id: str, network: str, ifname: str) -> str:
    """'<containerID> <network> <ifname>': at most 64+1+40+1+17 bytes, within nft's 128."""
    return f"{_part(container_id, 64)} {_part(network or '-', 40)} {_part(ifname, 17)}"


def owner_in_network(comment: str, network: str) -> tuple[str, str] | None:
    """(container part, ifname part) when the comment is one of ours for `network`."""
    words = comment.split(" ")
    if len(words) == 3 and words[1] == _part(network or "-", 40):
        return words[0], words[2]
    return None


def attachment_key(container_id: str, ifname: str) -> tuple[str, str]:
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


def _skeleton(family: int, conditions: str, snat: bool) -> str:
    """Idempotent table and chain creation; base chains rewritten with the current conditions."""
    t = f"{NFT_FAMILY[family]} {TABLE}"
    lines = [f"add table {t} {{ comment {nft.quote(TABLE_COMMENT)} ; }}"]
    lines += [f"add chain {t} {c}" for c in (HOSTPORTS, HOSTIP_HOSTPORTS, HOSTPORTS_ALL)]
    lines += [f"flush chain {t} {HOSTPORTS_ALL}",
              f"add rule {t} {HOSTPORTS_ALL} jump {HOSTIP_HOSTPORTS}",
              f"add rule {t} {HOSTPORTS_ALL} jump {HOSTPORTS}"]
    entry = " ".join(p for p in (conditions, "fib daddr type local", "jump", HOSTPORTS_ALL) if p)
    for chain, hook in (("prerouting", "prerouting"), ("output", "output")):
        # Numeric priorities: nft accepts the name "dstnat" for prerouting only.
        lines += [f"add chain {t} {chain} {{ type nat hook {hook} priority -100 ; "
                  f"policy accept ; }}",
                  f"flush chain {t} {chain}",
                  f"add rule {t} {chain} {entry}"]
    if snat:
        lines.append(f"add chain {t} {MASQUERADING} {{ type nat hook postrouting "
                     f"priority 100 ; policy accept ; }}")
    return "\n".join(lines) + "\n"


def add_script(rules: list[Rule], comment: str, conditions: dict[int, str], snat: bool,
               replace: list[dict[str, Any]]) -> str:
    """One batch: the skeleton of each family in use, drop `replace` (our older rules), add."""
    families = sorted({r.family for r in rules})
    script = "".join(_skeleton(f, conditions.get(f, ""), snat) for f in families)
    script += nft.delete_rules_script(replace)
    quoted = nft.quote(comment)
    script += "".join(f"add rule {NFT_FAMILY[r.family]} {TABLE} {r.chain} {r.text()} "
                      f"comment {quoted}\n" for r in rules)
    return script


# --- reading back -----------------------------------------------------------------------------

def listed(family: int) -> list[dict[str, Any]]:
    """The rules of our table in one family (empty when the table does not exist)."""
    return nft.rules(NFT_FAMILY[family], TABLE)


def container_rules_found(found: list[dict[str, Any]], pick) -> list[dict[str, Any]]:
    """Rules in the container chains whose comment satisfies `pick(comment)`."""
    return [r for r in found
            if r.get("chain") in OWNED_CHAINS and r.get("comment") and pick(r["comment"])]


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


def signature(rule: dict[str, Any]) -> tuple | None:
    """A listed rule in the shape of `Rule.signature()`, or None if it is not of our forms."""
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
    return (rule.get("chain"), tuple(matches), action) if action else None


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

    from pyroute2.netlink.exceptions import NetlinkError

    from cni.host import netns, sysctl

    with netns.iproute() as ipr:
        try:
            routes = ipr.route("get", dst=ip)
        except NetlinkError:  # no route to the pod: nothing to enable (the reference skips too)
            return None
        oif = routes[0].get_attr("RTA_OIF") if routes else None
    if oif is None:
        return None
    ifname = socket.if_indextoname(oif)  # one ioctl in this netns, not an RTM_GETLINK
    sysctl.write(sysctl.conf(4, ifname, "route_localnet"), 1)
    return ifname


# --- conditions (conditionsV4 / conditionsV6) -------------------------------------------------

# Words a match condition may use. Nothing here is a statement or verdict (no jump, goto,
# accept, drop, dnat, counter, log, set, map...), so a condition can only narrow what matches.
_KEYWORDS = frozenset(re.findall(r"\S+", """
ip ip6 saddr daddr protocol nexthdr version length dscp ecn ttl hoplimit flowlabel
meta iif iifname oif oifname iiftype oiftype iifgroup oifgroup l4proto nfproto mark pkttype
skuid skgid cpu cgroup fib type local unicast broadcast multicast anycast blackhole unreachable
prohibit th tcp udp udplite sctp icmp icmpv6 dport sport ct state status new established
related invalid untracked direction original reply zone ether vlan id
"""))
# Statement, verdict and command words: never accepted, not even as a bare interface name.
_NFT_WORDS = frozenset(re.findall(r"\S+", """
accept drop reject jump goto return continue queue dnat snat masquerade redirect counter log
limit notrack flow tproxy synproxy quota dup fwd to set map vmap add update delete comment
define include table chain rule flush insert replace create list reset export import monitor
describe element policy hook priority
""")) | _KEYWORDS
_STRUCTURE = frozenset("{},")
_OPERATORS = frozenset(("==", "!=", "<", ">", "<=", ">=", "&", "|", "^"))
_ALLOWED_CHARS = re.compile(r'^[A-Za-z0-9 .:/\-_!=<>&|^{},"*]*$')
_TOKEN = re.compile(r'"[^"]*"|[{},]|[^\s{},"]+')
_NUMBER = re.compile(r"^(0x[0-9a-fA-F]+|\d+)(-(0x[0-9a-fA-F]+|\d+))?$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}\*?$")


def _is_address(token: str) -> bool:
    for piece in token.split("-", 1) if token.count("-") == 1 else [token]:
        try:
            ipaddress.ip_network(piece, strict=False)
        except ValueError:
            return False
    return True


def conditions_text(tokens: list[str]) -> str:
    """The conditions as one nft fragment, or ValueError saying what is not allowed.

    Only match expressions pass: allow-listed keywords, operators, numbers, addresses,
    interface names (quoted, or right after iifname/oifname) and flat anonymous sets of those.
    """
    text = " ".join(tokens)
    bad = sorted({c for c in text if not _ALLOWED_CHARS.fullmatch(c)})
    if bad:
        raise ValueError(f"character(s) {''.join(bad)!r} not allowed in a match condition")
    tokens_found = _TOKEN.findall(text)
    if "".join(tokens_found) != re.sub(r"\s+", "", text):
        raise ValueError("unterminated quote")
    depth, prev = 0, ""
    for tok in tokens_found:
        if tok == "{":
            if depth:
                raise ValueError("nested sets are not allowed")
            depth = 1
        elif tok == "}":
            if not depth:
                raise ValueError("unbalanced '}'")
            depth = 0
        elif tok == ",":
            if not depth:
                raise ValueError("',' outside a set")
        elif not _allowed_word(tok, prev):
            raise ValueError(f"{tok!r} is not allowed in a match condition")
        if tok not in _OPERATORS and tok not in _STRUCTURE:
            prev = tok
    if depth:
        raise ValueError("unbalanced '{'")
    return " ".join(tokens_found).replace(" ,", ",")


def _allowed_word(tok: str, prev: str) -> bool:
    if tok in _KEYWORDS or tok in _OPERATORS:
        return True
    if _NUMBER.match(tok) or _is_address(tok):
        return True
    if tok.startswith('"'):
        return bool(_IFNAME.match(tok[1:-1]))
    # A bare word is read as a name only when nft has no keyword of that spelling.
    return (prev in ("iifname", "oifname") and bool(_IFNAME.match(tok))
            and tok not in _NFT_WORDS)
