"""firewall: accept a container's traffic in the host's forward path, chained after the plugin
that gave it its IPs (podman's CNI networks chain it after bridge and portmap).

Reads like the reference's cmdAdd / cmdDel / cmdCheck (containernetworking/plugins v1.9
plugins/meta/firewall), on nftables: pycni's own `inet cni_firewall` table holds the reference's
CNI-FORWARD / CNI-ADMIN / CNI-ISOLATION-STAGE-* layout (cni.host.forward), and where the host
has iptables' filter table (iptables-nft's or x_tables'; Docker sets FORWARD's policy to DROP)
the reference's own CNI-FORWARD rules go there too, through that iptables (cni.host.xtforward),
since an accept in one table does not override another table's drop. Those are the rules the
reference's iptables backend writes: across a swap, each side's CHECK and DEL handle the
other's attachments (an attachment with no record here is the reference's: CHECK looks at its
iptables rules alone, as the reference's does).

Unlike the reference: `backend` "" (or "nftables") is this nftables backend, and "iptables" /
"firewalld" are refused (error 2), any other value too (error 7) where the reference silently
picks one; every key is validated before anything changes (the reference's unknown ingressPolicy
fails after its rules are in); pod rules carry their owner (container ID, ifname) in the
comment, so DEL needs no prevResult, a re-ADD replaces instead of adding twice, and GC works
per network; and, as portmap's, each attachment's record chain says where its rules are, so
ADD, CHECK and DEL never list the table (cni.host.forward: records and address index).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from cni import skel
from cni.host import forward, nft, nftrecord, xtforward
from cni.plugins import nftbatch
from cni.skel import Request
from cni.spec.config import PluginConf, StrictStr, parse
from cni.spec.errors import CNIError, Code, invalid_config, unsupported
from cni.spec.result import Result

POLICIES = ("open", "same-bridge", "isolated")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@=+\-]{1,15}$")  # what an nft rule may name, quoted


class FirewallConf(PluginConf):
    backend: StrictStr = ""
    iptablesAdminChainName: StrictStr = ""
    firewalldZone: StrictStr = ""
    ingressPolicy: StrictStr = ""


def targets(req: Request, conf: FirewallConf) -> tuple[list[str], str | None]:
    """prevResult's addresses the pod's accepts are for, and the bridge `ingressPolicy`
    isolates (None: no isolation)."""
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG, "missing prevResult from earlier plugin")
    return addresses(req.prev_result), isolated_bridge(conf, req.prev_result)


# --- verbs ------------------------------------------------------------------------------------

def add(req: Request) -> Result:
    conf = parse_config(req)
    ips, bridge = targets(req, conf)
    if not ips and bridge is None:
        return req.prev_result
    comment, chain = owner(req), record(req)
    isolated = conf.ingressPolicy == "isolated"
    made: list[tuple[str, str]] = []  # the isolation rules this ADD added (chain, comment)
    old = _read_record(chain)  # a re-ADD replaces the rules its record names

    def script(attempt: int) -> str:
        text = forward.layout_script()
        if bridge is not None:
            listing = _stages()
            text += forward.isolation_script(listing, bridge, isolated)
            made[:] = [(c, m) for c, m in forward.isolation_comments(bridge, isolated)
                       if not listing.commented(c, m)]
        if old is not None:  # a retry deletes only what is still there
            text += nftrecord.handles_script(forward.FAMILY, forward.TABLE, old.handles
                                             if attempt == 0 else _present(old.handles))
        return text + forward.add_script(ips, comment, chain)

    _apply(script)
    done: list[xtforward.Filter] = []
    try:
        for where in xtforward.filters(_families(ips)):
            xtforward.add(where, _of(ips, where), admin_chain(conf))
            done.append(where)
    except (nft.NftError, xtforward.XtablesError, OSError) as e:
        def undo(_attempt: int) -> str:
            rec = _read_record(chain)
            text = forward.drop_record_script(chain, _present(rec.handles)) if rec else ""
            listing = _stages() if made else forward.Listing(set(), [])
            return text + nft.delete_rules_script(
                [r for r in listing.rules if (r.get("chain"), r.get("comment")) in made])

        _apply(undo)
        _release(req, ips, done)
        raise _xtables_error(e, "unable to add the pod's iptables FORWARD rules") from None
    if old is not None:  # a re-ADD with other addresses: the old ones' accepts are not its own
        _release(req, [ip for ip in old.addresses if ip not in ips])
    return req.prev_result


def delete(req: Request) -> None:
    # No config value is read: the rules are found by the attachment's record (and the
    # prevResult's addresses, for the reference's rules), so any config, even one ADD refuses,
    # is deletable.
    chain = record(req)
    prev = req.prev_result if isinstance(req.prev_result, dict) else {}
    try:
        prev_ips = addresses(prev)
    except (KeyError, TypeError, ValueError):
        prev_ips = []  # a DEL never fails over its config
    rec = _read_record(chain)
    if rec is not None:
        _apply(lambda attempt: forward.drop_record_script(
            chain, rec.handles if attempt == 0 else _present(rec.handles)))
    _release(req, list(dict.fromkeys((rec.addresses if rec else []) + prev_ips)))


def gc(req: Request) -> int:
    """Remove the pod rules and records of this network's attachments that are not in the
    valid list (the reference's firewall has no GC); a bridge's isolation rules stay, as DEL
    leaves them. The one verb that lists the table."""
    valid = skel.valid_attachments(req.config)
    if valid is None:  # libcni's GC without args: stale and live look alike
        req.log("GC without cni.dev/valid-attachments: no rule removed")
        return 0
    keep = {forward.owner_comment(cid, ifname, req.network) for cid, ifname in valid}
    records = {forward.record_chain(cid, ifname, req.network) for cid, ifname in valid}
    prefix = forward.network_record_prefix(req.network)
    found: dict[str, Any] = {}

    def script(_attempt: int) -> str:
        listing = _listed()
        stale = sorted(c for c in listing.chains if c.startswith(prefix) and c not in records)
        rules = [r for r in listing.rules if r.get("chain") == forward.PODS
                 and forward.of_network(str(r.get("comment") or ""), req.network)
                 and r.get("comment") not in keep]
        index = [r for r in listing.rules if forward.index_address(str(r.get("chain")))
                 and str(r.get("comment") or "").startswith(prefix)
                 and r.get("comment") not in records]  # a stale record's, or an orphan's
        found["rules"] = rules
        found["ips"] = [forward.pod_address(r) for r in rules] + \
            [forward.index_address(r["chain"]) for r in index]
        return nft.delete_rules_script(rules + index) + "".join(
            nftrecord.drop_script(forward.FAMILY, forward.TABLE, c) for c in stale)

    _apply(script)
    _release(req, list(dict.fromkeys(ip for ip in found.get("ips", []) if ip)))
    return len(found.get("rules", []))


def _release(req: Request, ips: list[str], tables: list[xtforward.Filter] | None = None
             ) -> None:
    """The iptables accepts of these addresses (in `tables`, else wherever the host has
    iptables), and their index chains, where no attachment's index rule is left (another
    attachment may have the address now)."""
    try:
        for where in xtforward.filters(_families(ips)) if tables is None else tables:
            try:
                xtforward.delete(where, _of(ips, where), lambda ip: bool(forward.index_owners(ip)))
            except (nft.NftError, xtforward.XtablesError, OSError) as e:
                req.log(f"firewall: iptables FORWARD rules of {ips} ({where.where}) not "
                        f"removed: {e}")
    except (nft.NftError, OSError) as e:
        req.log(f"firewall: iptables FORWARD rules of {ips} not removed: {e}")
    _drop_empty_indexes(ips)


def _drop_empty_indexes(ips: list[str]) -> None:
    for ip in ips:
        try:  # fails when an attachment's rule is in it (an ADD since): then it stays
            nft.run(forward.drop_index_script(ip))
        except nft.NftError:
            pass


def check(req: Request) -> None:
    conf = parse_config(req)
    ips, bridge = targets(req, conf)
    if not ips and bridge is None:
        return
    try:
        rec = forward.read_record(record(req))
        tables = xtforward.filters(_families(ips))
        # No record but iptables tables: an attachment the reference made (its iptables
        # backend, before a swap); its accepts are in CNI-FORWARD alone, and its own CHECK looks
        # at nothing else (not its isolation chains either).
        why = None if rec is None and ips and tables else \
            forward.layout_present(forward.chain_rules(forward.FORWARD))
        if why is None and (rec is not None or not tables):
            lost = forward.unrecorded(rec, ips) if ips else None
            if lost is not None:
                why = f"{forward.FAMILY} {forward.TABLE}: no accept rules for {lost} " \
                      f"({owner(req)})"
            if why is None and bridge is not None:
                why = forward.isolation_missing(_stages(), bridge,
                                                conf.ingressPolicy == "isolated")
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None
    if why is not None:
        raise CNIError(Code.INTERNAL, why)
    try:
        gone = [(w, rule) for w in tables
                if (rule := xtforward.missing(w, _of(ips, w), admin_chain(conf))) is not None]
    except (nft.NftError, xtforward.XtablesError, OSError) as e:
        raise _xtables_error(e, "iptables FORWARD") from None
    # pycni writes each backend the host has; the reference only the one its `iptables` is (on
    # a host with both, the other's tables lack its rules): one whole backend is its attachment
    whole = {w.backend for w in tables} - {w.backend for w, _ in gone}
    if gone and (rec is not None or not whole):
        where, rule = gone[0]
        raise CNIError(Code.INTERNAL, f"expected iptables rule not found ({where.where}): {rule}")


def _xtables_error(e: Exception, what: str) -> CNIError:
    """A table iptables-nft calls incompatible (nft-written rules it has no syntax for) is the
    host's to fix, not a failure of ours: error 50, saying so."""
    if isinstance(e, xtforward.XtablesIncompatible):
        return CNIError(Code.NOT_AVAILABLE,
                        f"{what}: iptables-nft cannot read the host's iptables filter table "
                        f"(rules written there with nft that iptables has no syntax for), so "
                        f"the pod's CNI-FORWARD accepts cannot go into it; move those rules to "
                        f"a table of their own or rewrite them with iptables ({e})")
    return CNIError(Code.INTERNAL, f"{what}: {e}")


def status(req: Request) -> None:
    nftbatch.require_nftables("firewall")


# --- config -----------------------------------------------------------------------------------

def parse_config(req: Request) -> FirewallConf:
    conf = parse(FirewallConf, req.config)
    if conf.backend in ("iptables", "firewalld"):
        raise unsupported("backend", conf.backend, 'only "" (nftables) is implemented')
    if conf.backend not in ("", "nftables"):
        raise invalid_config("backend", conf.backend,
                             'must be "", "nftables", "iptables" or "firewalld"')
    if conf.ingressPolicy not in ("", *POLICIES):
        raise invalid_config("ingressPolicy", conf.ingressPolicy,
                             f"must be one of {', '.join(POLICIES)}")
    name = conf.iptablesAdminChainName
    if name and (not xtforward.CHAIN_NAME.fullmatch(name) or name in xtforward.RESERVED):
        raise invalid_config("iptablesAdminChainName", name,
                             "not an iptables chain name (1-28 of letters, digits, '_', '-', "
                             "'.', not starting with '-'; not a built-in chain or verdict, "
                             f"not {xtforward.PRIV})")
    return conf


def admin_chain(conf: FirewallConf) -> str:
    return conf.iptablesAdminChainName or xtforward.DEFAULT_ADMIN


def addresses(prev: dict[str, Any]) -> list[str]:
    """Every address of the result, as the reference takes them (not only the sandbox's)."""
    out: list[str] = []
    for ip in prev.get("ips") or []:
        addr = str(ipaddress.ip_interface(ip["address"]).ip)
        if addr not in out:
            out.append(addr)
    return out


def isolated_bridge(conf: FirewallConf, prev: dict[str, Any]) -> str | None:
    """The bridge an ingress policy isolates: the result's first interface, as the reference
    takes it; None for the open policy."""
    if conf.ingressPolicy in ("", "open"):
        return None
    interfaces = prev.get("interfaces") or []
    name = interfaces[0].get("name") if interfaces and isinstance(interfaces[0], dict) else None
    if not name:
        raise invalid_config("ingressPolicy", conf.ingressPolicy,
                             "needs the bridge as prevResult's first interface: chain firewall "
                             "after bridge")
    if not isinstance(name, str) or not _IFNAME.match(name):
        raise invalid_config("prevResult.interfaces[0].name", name, "not a bridge name")
    return name


# --- helpers ----------------------------------------------------------------------------------

def owner(req: Request) -> str:
    return forward.owner_comment(req.container_id, req.ifname, req.network)


def record(req: Request) -> str:
    return forward.record_chain(req.container_id, req.ifname, req.network)


def _family(ip: str) -> int:
    return ipaddress.ip_address(ip).version


def _families(ips: list[str]) -> list[int]:
    return sorted({_family(ip) for ip in ips})


def _of(ips: list[str], where: xtforward.Filter) -> list[str]:
    return [ip for ip in ips if _family(ip) == where.family]


def _listed() -> forward.Listing:
    try:
        return forward.listed()
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _stages() -> forward.Listing:
    """The isolation chains alone (one rule or two per isolated bridge)."""
    try:
        return forward.chain_rules(forward.STAGE1, forward.STAGE2)
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _read_record(chain: str) -> forward.Record | None:
    try:
        return forward.read_record(chain)
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _present(handles: dict[str, list[int]]) -> dict[str, list[int]]:
    return forward.present_handles(handles) if handles else {}


def _apply(script: Callable[[int], str]) -> None:
    nftbatch.apply(script, "the firewall")
