"""portmap: hostPort forwarding for a container, chained after the plugin that gave it its IPs.

Reads like the reference's cmdAdd / cmdDel / cmdCheck, on the nftables backend only, with the
reference's v1.9 layout and rule comments (the bare container ID), so either side's DEL and CHECK
work on the other's rules. Rule text, the layout and the per-attachment records that give GC its
network live in cni.host.hostport; the UDP conntrack flush in cni.host.conntrack.
Unlike the reference, DEL does not need portMappings again (rules are found by their owner), a
re-ADD replaces the container's rules instead of duplicating them, and GC is implemented.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from cni import skel
from cni.host import conntrack, hostport, nft, nftrecord
from cni.host.hostport import Mapping
from cni.plugins import nftbatch
from cni.skel import Request
from cni.spec import keys
from cni.spec.config import Field, PluginConf, StrictBool, StrictInt, StrictStr, parse
from cni.spec.errors import CNIError, Code, invalid_config, unsupported
from cni.spec.result import Result

DEFAULT_MARK_BIT = 13  # accepted and validated as in the reference; nftables needs no mark
_IPTABLES_CHAIN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,27}")  # XT_EXTENSION_MAXNAMELEN - 1


class PortMapConf(PluginConf):
    backend: StrictStr = "nftables"
    snat: StrictBool = True
    masqAll: StrictBool = False
    markMasqBit: Annotated[StrictInt, Field(ge=0, le=31)] = DEFAULT_MARK_BIT
    externalSetMarkChain: StrictStr | None = None
    conditionsV4: list[StrictStr] | None = None
    conditionsV6: list[StrictStr] | None = None


# --- verbs ------------------------------------------------------------------------------------

def add(req: Request) -> Result:
    conf = parse_config(req)
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG,
                       "portmap must be called as a chained plugin: prevResult missing")
    mappings = parse_mappings(req.runtime_config.get("portMappings"))
    if not mappings:
        return req.prev_result
    ips = container_ips(req.prev_result, req.ifname)
    skip_host_ip_families(req, mappings, ips)
    conditions = parse_conditions(conf)
    rules = hostport.container_rules(ips, mappings, conf.snat, conf.masqAll)
    if rules:
        comment, chain = owner(req), record(req)
        families = {r.family for r in rules}
        records = {f: hostport.read_record(f, chain) for f in hostport.NFT_FAMILY}
        # A fresh attachment (no record) or one whose record says where its rules are needs no
        # listing of the table, once no rule of the pre-v1.9 layout can be there; anything
        # else lists it.
        fast = all(rec is None or rec.usable for rec in records.values()) and \
            all(hostport.without_legacy(f) for f in families)

        def script(attempt: int) -> str:
            may_vouch = attempt < nftbatch.RETRIES - 1  # the last try has no witness to fail
            if fast and attempt == 0:
                return hostport.add_script(
                    rules, comment, conditions, conf.snat,
                    replace=[],
                    records={f: (chain, ip) for f, ip in ips.items() if f in families},
                    drop_records={f: [chain] for f, rec in records.items()
                                  if f not in families and rec is not None},
                    clean=families,
                    vouch=_vouched(families) if may_vouch else None,
                ) + "".join(hostport.handles_script(f, rec.handles)
                            for f, rec in records.items() if rec is not None)
            listings = {f: _listed(f) for f in hostport.NFT_FAMILY}
            replace = {f: _ours(req, lst) for f, lst in listings.items()}
            vouch = {}
            for f in families if may_vouch else ():
                lst = listings[f]
                witness = hostport.entry_witness(lst) if lst.exists else 0
                if witness is not None and \
                        hostport.all_recorded(lst, replace[f], [chain], (comment, ips[f])):
                    vouch[f] = witness
            return hostport.add_script(
                rules, comment, conditions, conf.snat,
                replace=[r for found in replace.values() for r in found],
                records={f: (chain, ip) for f, ip in ips.items() if f in families},
                drop_records={f: [chain] for f, lst in listings.items()
                              if f not in families and chain in lst.chains},
                clean={f for f in families if not hostport.has_legacy(listings[f], replace[f])},
                vouch=vouch)

        _apply(script)
        if conf.snat and 4 in ips:
            hostport.route_localnet_toward(ips[4])
        # After the rules are in, so the next packet of a stale UDP flow meets them.
        udp = {m.host_port for m in mappings if m.protocol == "udp"}
        _flush_udp(req, {family: udp for family in ips})
    return req.prev_result


def delete(req: Request) -> None:
    # No config value is read: the rules are found by their owner, so any config, even one ADD
    # refuses, is deletable (libcni stops a DEL chain at the first error).
    # The attachment's rules are found by its record, else (no record: the common pod, whose
    # ADD had no mappings) a table that vouches that every rule in it is another's, or that is
    # not there, has none of them; only the other families' tables are listed.
    chain = record(req)
    present = _present()
    records = _read_records(chain, present)
    udp = _delete_by_record(chain, records)
    if udp is None:
        unsure = present if any(records.values()) else \
            {f for f in present if f not in _vouched({f}, absent_too=False)}
        found = _delete_found(lambda lst: (_ours(req, lst),
                                           [chain] if chain in lst.chains else []),
                              families=unsure)
        udp = {family: hostport.udp_host_ports(rules) for family, rules in found.items()}
    _flush_udp(req, udp)


def check(req: Request) -> None:
    conf = parse_config(req)
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG, "required prevResult missing")
    mappings = parse_mappings(req.runtime_config.get("portMappings"))
    if not mappings:
        return
    ips = container_ips(req.prev_result, req.ifname)
    expected = hostport.container_rules(ips, mappings, conf.snat, conf.masqAll)
    for family in ips:
        mine = [r for r in expected if r.family == family]
        if _checked_by_record(family, record(req), mine):
            continue
        listing = _listed(family)
        if not hostport.entry_rules_present(listing.rules):
            raise CNIError(Code.INTERNAL, f"{hostport.NFT_FAMILY[family]} {hostport.TABLE}: "
                           f"prerouting/output do not jump to {hostport.HOSTPORTS_ALL}")
        have = {hostport.signature(r) for r in _ours(req, listing)}
        for rule in (r for r in expected if r.family == family):
            if rule.signature() not in have:
                raise CNIError(Code.INTERNAL, f"missing hostport rule in chain {rule.chain}: "
                               f"{rule.text()}")


def gc(req: Request) -> int:
    """Remove the rules of this network's attachments that are not in the valid list (found by
    their records, see cni.host.hostport), and legacy rules of the network likewise."""
    valid = skel.valid_attachments(req.config)
    if valid is None:  # libcni's GC without args: stale and live look alike
        req.log("GC without cni.dev/valid-attachments: no rule removed")
        return 0
    keep = {hostport.record_chain(cid, req.network, ifname) for cid, ifname in valid}
    legacy_keep = {hostport.legacy_attachment_key(cid, ifname) for cid, ifname in valid}

    def stale(listing: hostport.Listing) -> tuple[list[dict[str, Any]], list[str]]:
        chains, rules = hostport.stale_records(listing, req.network, keep)
        for r in listing.rules:
            key = hostport.legacy_owner_in_network(str(r.get("comment") or ""), req.network)
            if r.get("chain") in hostport.OWNED_CHAINS and key and key not in legacy_keep:
                rules.append(r)
        return rules, chains

    found = _delete_found(stale)
    _flush_udp(req, {family: hostport.udp_host_ports(rules) for family, rules in found.items()})
    return sum(len(rules) for rules in found.values())


def status(req: Request) -> None:
    nftbatch.require_nftables("portmap")


# --- config -----------------------------------------------------------------------------------

def parse_config(req: Request) -> PortMapConf:
    conf = parse(PortMapConf, req.config)
    if conf.backend == "iptables":
        raise unsupported("backend", conf.backend, 'only "nftables" is implemented')
    if conf.backend not in ("nftables", "iptables"):
        raise invalid_config("backend", conf.backend, 'must be "nftables" or "iptables"')
    if conf.externalSetMarkChain is not None:
        check_mark_chain(req, conf)
    return conf


def check_mark_chain(req: Request, conf: PortMapConf) -> None:
    """externalSetMarkChain (kube-proxy's KUBE-MARK-MASQ in the Kubernetes docs' example) names
    the iptables chain that marks a connection for kube-proxy's masquerade. Without a backend
    the reference picks iptables for it; here the nftables rules masquerade hairpin and
    127.0.0.1 clients themselves (snat), so the chain is validated and never used: it
    reaches no rule."""
    chain = conf.externalSetMarkChain
    if not isinstance(chain, str) or not _IPTABLES_CHAIN.fullmatch(chain):
        raise invalid_config(keys.written_path(req.config, ["externalSetMarkChain"])[0], chain,
                             "not an iptables chain name (1-28 of letters, digits, '_', '-', "
                             "'.', not starting with '-')")
    if "markMasqBit" in conf.model_fields_set:
        raise invalid_config("markMasqBit", conf.markMasqBit,
                             "cannot specify externalSetMarkChain and markMasqBit")


def parse_conditions(conf: PortMapConf) -> dict[int, str]:
    out: dict[int, str] = {}
    for family, key, tokens in ((4, "conditionsV4", conf.conditionsV4),
                                (6, "conditionsV6", conf.conditionsV6)):
        if tokens:
            try:
                out[family] = hostport.conditions_text(tokens)
                hostport.conditions_check(family, out[family])
            except nft.NftUnavailable as e:
                raise CNIError(Code.NOT_AVAILABLE, str(e)) from None
            except ValueError as e:
                raise invalid_config(key, tokens, str(e)) from None
    return out


def parse_mappings(raw: Any) -> list[Mapping]:
    """runtimeConfig.portMappings, validated; errors name the entry by index and value."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_config("runtimeConfig.portMappings", raw, "must be a list")
    return [_mapping(i, entry) for i, entry in enumerate(raw)]


MAPPING_KEYS = ("hostPort", "containerPort", "protocol", "hostIP")


def _mapping(i: int, raw: Any) -> Mapping:
    key = f"runtimeConfig.portMappings[{i}]"
    if not isinstance(raw, dict):
        raise invalid_config(key, raw, "must be an object")
    # containerd's CRI sends HostPort, ContainerPort, Protocol, HostIP: Go structs without tags.
    entry = keys.match(raw, MAPPING_KEYS)
    for port_key in ("hostPort", "containerPort"):
        port = entry.get(port_key)
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise invalid_config(f"{key}.{entry.written(port_key)}", port,
                                 "must be a port number 1-65535")
    proto = entry.get("protocol")
    if not isinstance(proto, str) or proto.lower() not in hostport.PROTOCOLS:
        raise invalid_config(f"{key}.{entry.written('protocol')}", proto,
                             f"must be one of {', '.join(hostport.PROTOCOLS)}")
    return Mapping(entry["hostPort"], entry["containerPort"], proto.lower(),
                   _host_ip(f"{key}.{entry.written('hostIP')}", entry.get("hostIP")))


def _host_ip(key: str, value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise invalid_config(key, value, "must be an IP address string")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise invalid_config(key, value, "not an IP address") from None
    if isinstance(ip, ipaddress.IPv6Address) and (ip.ipv4_mapped or ip.scope_id):
        raise invalid_config(key, value, "IPv4-mapped or scoped IPv6 addresses are not allowed")
    if ip.is_multicast:
        raise invalid_config(key, value, "must be a unicast host address")
    return str(ip)


def skip_host_ip_families(req: Request, mappings: list[Mapping], ips: dict[int, str]) -> None:
    """A hostIP of a family the container has no address of maps nothing (the reference skips
    it per family too); say so, since the runtime asked for it."""
    for i, m in enumerate(mappings):
        if m.host_ip and ipaddress.ip_address(m.host_ip).version not in ips:
            req.log(f"portMappings[{i}]: hostIP {m.host_ip} skipped: the container has no "
                    f"IPv{ipaddress.ip_address(m.host_ip).version} address")


def container_ips(prev: Result, ifname: str) -> dict[int, str]:
    """First IP per family on the sandbox interface named ifname (or with no interface index)."""
    interfaces = prev.get("interfaces") or []
    out: dict[int, str] = {}
    for ip in prev.get("ips") or []:
        addr = ipaddress.ip_interface(ip["address"]).ip
        if addr.version in out:
            continue
        idx = ip.get("interface")
        if isinstance(idx, int) and 0 <= idx < len(interfaces):
            iface = interfaces[idx]
            if iface.get("name") != ifname or not iface.get("sandbox"):
                continue
        out[addr.version] = str(addr)
    return out


# --- helpers ----------------------------------------------------------------------------------

def owner(req: Request) -> str:
    return hostport.rule_comment(req.container_id)


def record(req: Request) -> str:
    return hostport.record_chain(req.container_id, req.network, req.ifname)


def _listed(family: int) -> hostport.Listing:
    try:
        return hostport.listed(family)
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _ours(req: Request, listing: hostport.Listing) -> list[dict[str, Any]]:
    """This attachment's rules in one family: bare container-ID comments (ours and the
    reference's) not recorded for another attachment, and our legacy comments."""
    legacy = hostport.legacy_owner(req.container_id, req.network, req.ifname)
    return (hostport.attachment_rules(listing, owner(req), record(req))
            + listing.owned(legacy))


def _present() -> set[int]:
    """The families whose table exists."""
    try:
        return {f for f, fam in hostport.NFT_FAMILY.items()
                if nft.table_exists(fam, hostport.TABLE)}
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _read_records(chain: str, families: set[int]) -> dict[int, hostport.Record | None]:
    """The attachment's record in each of `families` (None where it has none)."""
    try:
        return {f: hostport.read_record(f, chain) for f in sorted(families)}
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _vouched(families: set[int], absent_too: bool = True) -> dict[int, int]:
    """Per family of `families` whose every rule has its record now (see
    hostport.ALL_RECORDED), the witness for ADD's batch: the vouched entry rule's handle, or
    (`absent_too`) 0 where there is no table."""
    out: dict[int, int] = {}
    try:
        for f in families:
            entry = hostport.vouched_entry(f)
            if entry is not None:
                out[f] = entry
            elif absent_too and not nft.table_exists(hostport.NFT_FAMILY[f], hostport.TABLE):
                out[f] = 0
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None
    return out


def _delete_by_record(chain: str,
                      found: dict[int, hostport.Record | None]) -> dict[int, set[int]] | None:
    """DEL by the record alone (`found`: the attachment's, by family): its rules by handle and
    the record chain, one batch; the UDP hostPorts per family. None when that is not possible:
    no record, one that does not say where its rules are (then the caller lists)."""
    records = {f: rec for f, rec in found.items() if rec is not None}
    if not records or not all(rec.usable for rec in records.values()) or \
            not all(hostport.without_legacy(f) for f in records):
        return None
    script = "".join(hostport.handles_script(f, rec.handles)
                     + hostport.drop_chains_script(f, [chain]) for f, rec in records.items())
    try:
        nft.run(script)
    except nft.NftError:
        return None  # a rule is gone already (the reference's DEL, a race): list and retry
    return {f: rec.udp for f, rec in records.items()}


def _checked_by_record(family: int, chain: str, expected: list[hostport.Rule]) -> bool:
    """Whether the record proves the expected rules are in place: written for exactly these
    rules, every recorded handle still in its chain (nft's dry run asks the kernel), and the
    entry chains jumping to hostports_all. False means "list and look" (which names what is
    missing), never "missing"."""
    try:
        rec = hostport.read_record(family, chain)
        if rec is None or not rec.usable or rec.digest != hostport.rules_digest(expected):
            return False
        fam = hostport.NFT_FAMILY[family]
        entry = [r for c in ("prerouting", "output") for r in nft.rules(fam, hostport.TABLE, c)]
        return hostport.entry_rules_present(entry) and \
            nftrecord.present(hostport.NFT_FAMILY[family], hostport.TABLE, rec.handles)
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _delete_found(find: Callable[[hostport.Listing],
                                 tuple[list[dict[str, Any]], list[str]]],
                  families: Iterable[int] = hostport.NFT_FAMILY
                  ) -> dict[int, list[dict[str, Any]]]:
    """Delete in one batch the rules and record chains `find` picks from the listing of each
    of `families` (listed afresh on each try), and return the rules (for the UDP conntrack
    flush)."""
    found: dict[int, list[dict[str, Any]]] = {}

    def script(_attempt: int) -> str:
        text = ""
        for family in sorted(families):
            rules, chains = find(_listed(family))
            found[family] = rules
            text += nft.delete_rules_script(rules)
            text += hostport.drop_chains_script(family, chains)
        return text

    _apply(script)
    return found


def _apply(script: Callable[[int], str]) -> None:
    nftbatch.apply(script, "port mappings")


def _flush_udp(req: Request, ports: dict[int, set[int]]) -> None:
    """Informative only on failure, as in the reference: the rules are already right."""
    try:
        conntrack.delete_udp_dport(ports)
    except Exception as e:  # a conntrack hiccup must not fail ADD/DEL
        each = sorted(set().union(*ports.values()))
        req.log(f"failed to delete stale UDP conntrack entries (ports {each}): {e}")
