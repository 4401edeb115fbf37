"""IP masquerade for pod traffic leaving its subnet, with nftables: the reference's layout and
naming (pkg/ip/ipmasq_nftables_linux.go), so either side's DEL, CHECK and GC find the other's rules.

    table inet cni_plugins_masquerade
      chain postrouting  (nat, postrouting, srcnat): multicast return; goto masq_checks
      chain masq_checks: ip saddr <pod ip> ip daddr != <pod subnet> masquerade comment "..."

The comment is `<hash(net)>-<hash(ifname:cid)>, net: N, if: I, id: C` ('"' removed from N, I, C;
cut at 128 bytes), hash = first 16 hex digits of SHA-512. DEL finds the attachment's rules by the
`<hash(net)>-<hash(ifname:cid)>` prefix without knowing its IPs (the reference leaks them when
CNI_NETNS is empty, #810); GC looks at the rules starting with `<hash(net)>`.

pycni releases before the v1.9 layout hashed with SHA-256 (same shape otherwise): DEL, GC and a
re-ADD also remove those ("legacy") rules, so an upgrade under live pods leaks nothing.
"""

from __future__ import annotations

import ipaddress

from cni.host import nft
from cni.host.digest import sha256_hex, sha512_hex

FAMILY = "inet"
TABLE = "cni_plugins_masquerade"
CHAIN = "masq_checks"
BASE = "postrouting"
COMMENT_MAX = 128
PREFIX_LEN = 33  # "<16 hex>-<16 hex>"
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


def setup(ips: list[str], network: str, ifname: str, container_id: str) -> None:
    """Masquerade each 'ip/prefix' to anything outside its subnet, replacing any rules this
    attachment had (one atomic batch)."""
    tag = _quoted_comment(network, ifname, container_id)
    stale = _rules(*_instance_prefixes(network, ifname, container_id))
    script = (
        f"add table {FAMILY} {TABLE} {{ comment {nft.comment(TABLE_COMMENT)} ; }}\n"
        f"add chain {FAMILY} {TABLE} {CHAIN} {{ comment {nft.comment(CHAIN_COMMENT)} ; }}\n"
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
                   f"{proto} daddr != {iface.network} masquerade comment {tag}\n")
    nft.run(script)


def teardown(network: str, ifname: str, container_id: str) -> int:
    """Remove this attachment's rules (and its legacy ones); how many there were."""
    found = _rules(*_instance_prefixes(network, ifname, container_id))
    if found:
        nft.run(nft.delete_rules_script(found))
    return len(found)


def present(network: str, ifname: str, container_id: str) -> list[str]:
    """Source addresses this attachment's rules masquerade (for CHECK)."""
    out = []
    for rule in _rules(*_instance_prefixes(network, ifname, container_id)):
        for expr in rule.get("expr", []):
            match = expr.get("match")
            if match and match.get("op") == "==" and \
                    match.get("left", {}).get("payload", {}).get("field") == "saddr":
                out.append(str(match.get("right")))
    return out


def gc(network: str, valid: set[tuple[str, str]]) -> int:
    """Remove the network's rules whose (containerID, ifname) is not in `valid`.

    The reference keeps a rule only if its whole comment equals a valid attachment's; we keep it
    if its hash prefix does (a superset: it also keeps a valid attachment's rule whose readable
    tail differs). Legacy (SHA-256) rules of the network are judged the same way."""
    keep = {h for cid, ifname in valid for h in _instance_prefixes(network, ifname, cid)}
    stale = [r for r in network_rules(network) if instance_of(r) not in keep]
    if stale:
        nft.run(nft.delete_rules_script(stale))
    return len(stale)
