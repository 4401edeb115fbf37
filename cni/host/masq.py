"""IP masquerade for pod traffic leaving its subnet, with nftables (the reference's layout).

    table inet cni_plugins_masquerade
      chain postrouting  (nat, postrouting, srcnat): multicast return; goto masq_checks
      chain masq_checks: ip saddr <pod ip> ip daddr != <pod subnet> masquerade comment "..."

Each rule's comment starts with hash(network) + "-" + hash(ifname:containerID) (the reference's
format), so DEL removes exactly this attachment's rules without knowing its IPs (the reference
leaks them when CNI_NETNS is empty, #810) and GC finds a network's stale ones.
"""

from __future__ import annotations

import hashlib
import ipaddress

from cni.host import nft

FAMILY = "inet"
TABLE = "cni_plugins_masquerade"
CHAIN = "masq_checks"
BASE = "postrouting"
COMMENT_MAX = 128


def hash_for_network(network: str) -> str:
    return hashlib.sha256(network.encode()).hexdigest()[:16]


def hash_for_instance(network: str, ifname: str, container_id: str) -> str:
    return hash_for_network(network) + "-" + hash_for_network(f"{ifname}:{container_id}")


def comment(network: str, ifname: str, container_id: str) -> str:
    """The hash prefix, then readable parts while they fit and are safe for nft."""
    text = hash_for_instance(network, ifname, container_id)
    for label, value in (("net", network), ("if", ifname), ("id", container_id)):
        part = f", {label}: {value}"
        candidate = (text + part)[:COMMENT_MAX]
        try:
            nft.quote(candidate)
        except ValueError:
            break  # a name nft can't safely carry: the hash alone identifies the rule
        text = candidate
    return text


def _rules(prefix: str) -> list[dict]:
    return [r for r in nft.rules(FAMILY, TABLE, CHAIN)
            if str(r.get("comment", "")).startswith(prefix)]


def setup(ips: list[str], network: str, ifname: str, container_id: str) -> None:
    """Masquerade each 'ip/prefix' to anything outside its subnet, replacing any rules this
    attachment had (one atomic batch)."""
    tag = comment(network, ifname, container_id)
    stale = _rules(hash_for_instance(network, ifname, container_id))
    script = (
        f"add table {FAMILY} {TABLE}\n"
        f"add chain {FAMILY} {TABLE} {CHAIN}\n"
        f"add chain {FAMILY} {TABLE} {BASE} "
        "{ type nat hook postrouting priority srcnat; }\n"
        f"flush chain {FAMILY} {TABLE} {BASE}\n"
        f"add rule {FAMILY} {TABLE} {BASE} ip daddr 224.0.0.0/4 return\n"
        f"add rule {FAMILY} {TABLE} {BASE} ip6 daddr ff00::/8 return\n"
        f"add rule {FAMILY} {TABLE} {BASE} goto {CHAIN}\n"
        + nft.delete_rules_script(stale)
    )
    for cidr in ips:
        iface = ipaddress.ip_interface(cidr)
        proto = "ip" if iface.version == 4 else "ip6"
        script += (f"add rule {FAMILY} {TABLE} {CHAIN} {proto} saddr {iface.ip} "
                   f"{proto} daddr != {iface.network} masquerade comment {nft.quote(tag)}\n")
    nft.run(script)


def teardown(network: str, ifname: str, container_id: str) -> int:
    """Remove this attachment's rules; how many there were (none is fine)."""
    found = _rules(hash_for_instance(network, ifname, container_id))
    if found:
        nft.run(nft.delete_rules_script(found))
    return len(found)


def present(network: str, ifname: str, container_id: str) -> list[str]:
    """Source addresses this attachment's rules masquerade (for CHECK)."""
    out = []
    for rule in _rules(hash_for_instance(network, ifname, container_id)):
        for expr in rule.get("expr", []):
            match = expr.get("match")
            if match and match.get("op") == "==" and \
                    match.get("left", {}).get("payload", {}).get("field") == "saddr":
                out.append(str(match.get("right")))
    return out


def gc(network: str, valid: set[tuple[str, str]]) -> int:
    """Remove the network's rules whose (containerID, ifname) is not in `valid`."""
    keep = {hash_for_instance(network, ifname, cid) for cid, ifname in valid}
    prefix = hash_for_network(network) + "-"
    stale = [r for r in _rules(prefix) if str(r["comment"])[:33] not in keep]
    if stale:
        nft.run(nft.delete_rules_script(stale))
    return len(stale)
