"""MAC spoof check (macspoofchk): frames entering the bridge from a pod's host veth must carry
the pod's MAC as source, else they are dropped. nftables, in the reference's table:

    table bridge nat
      chain PREROUTING (filter, prerouting, priority -300):
          iifname "<host veth>" jump cni-br-iface-<id> comment "macspoofchk-<id>, ..."
      chain cni-br-iface-<id>:      jump cni-br-iface-<id>-mac
      chain cni-br-iface-<id>-mac:  ether saddr <mac> return; drop

<id> is the masquerade rules' instance hash (network, ifname, container ID): it fits nft's
identifier rules whatever the names are, and GC finds a network's chains by its prefix.
"""

from __future__ import annotations

import re

from cni.host import masq, nft

FAMILY = "bridge"
TABLE = "nat"
BASE = "PREROUTING"
PREFIX = "cni-br-iface-"
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-@]+$")


def _chains(instance: str) -> tuple[str, str]:
    return PREFIX + instance, PREFIX + instance + "-mac"


def setup(host_ifname: str, mac: str, network: str, ifname: str, container_id: str) -> None:
    mac = mac.lower()
    if not _MAC.match(mac) or not _IFNAME.match(host_ifname):
        raise ValueError(f"unsafe spoof check input: {host_ifname!r} {mac!r}")
    instance = masq.hash_for_instance(network, ifname, container_id)
    iface_chain, mac_chain = _chains(instance)
    tag = nft.quote(f"macspoofchk-{instance}")
    script = (
        f"add table {FAMILY} {TABLE}\n"
        f"add chain {FAMILY} {TABLE} {BASE} "
        "{ type filter hook prerouting priority -300; policy accept; }\n"
        + _teardown_script(instance)
        + f"add chain {FAMILY} {TABLE} {iface_chain}\n"
        f"add chain {FAMILY} {TABLE} {mac_chain}\n"
        f"add rule {FAMILY} {TABLE} {BASE} iifname \"{host_ifname}\" jump {iface_chain} "
        f"comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {iface_chain} jump {mac_chain} comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {mac_chain} ether saddr {mac} return comment {tag}\n"
        f"add rule {FAMILY} {TABLE} {mac_chain} drop comment {tag}\n"
    )
    nft.run(script)


def _teardown_script(instance: str) -> str:
    """Commands removing one attachment's jump rule and chains (empty if none exist)."""
    if not nft.table_exists(FAMILY, TABLE):
        return ""
    iface_chain, mac_chain = _chains(instance)
    tag = f"macspoofchk-{instance}"
    rules = [r for r in nft.rules(FAMILY, TABLE, BASE) if r.get("comment") == tag] \
        if BASE in nft.chains(FAMILY, TABLE) else []
    script = nft.delete_rules_script(rules)
    existing = set(nft.chains(FAMILY, TABLE))
    for chain in (iface_chain, mac_chain):
        if chain in existing:
            script += f"flush chain {FAMILY} {TABLE} {chain}\n"
    for chain in (iface_chain, mac_chain):
        if chain in existing:
            script += f"delete chain {FAMILY} {TABLE} {chain}\n"
    return script


def teardown(network: str, ifname: str, container_id: str) -> bool:
    """Remove this attachment's spoof check; whether there was one."""
    script = _teardown_script(masq.hash_for_instance(network, ifname, container_id))
    if script:
        nft.run(script)
    return bool(script)


def present(network: str, ifname: str, container_id: str) -> bool:
    instance = masq.hash_for_instance(network, ifname, container_id)
    return nft.table_exists(FAMILY, TABLE) and _chains(instance)[1] in nft.chains(FAMILY, TABLE)


def gc(network: str, valid: set[tuple[str, str]]) -> int:
    """Remove the network's spoof checks whose (containerID, ifname) is not in `valid`."""
    if not nft.table_exists(FAMILY, TABLE):
        return 0
    keep = {masq.hash_for_instance(network, ifname, cid) for cid, ifname in valid}
    start = PREFIX + masq.hash_for_network(network) + "-"
    stale = [c[len(PREFIX):] for c in nft.chains(FAMILY, TABLE)
             if c.startswith(start) and not c.endswith("-mac") and c[len(PREFIX):] not in keep]
    script = "".join(_teardown_script(instance) for instance in stale)
    if script:
        nft.run(script)
    return len(stale)
