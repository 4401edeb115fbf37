"""firewall: accept a container's traffic in the host's forward path, chained after the plugin
that gave it its IPs (podman's CNI networks chain it after bridge and portmap).

Reads like the reference's cmdAdd / cmdDel / cmdCheck (containernetworking/plugins v1.9
plugins/meta/firewall), on nftables: pycni's own `inet cni_firewall` table holds the reference's
CNI-FORWARD / CNI-ADMIN / CNI-ISOLATION-STAGE-* layout (cni.host.forward), and where the host
has iptables' filter FORWARD chain (iptables-nft; Docker sets its policy to DROP) the
reference's own CNI-FORWARD rules go there too, through iptables-nft (cni.host.xtforward), since
an accept in one table does not override another table's drop.

Unlike the reference: `backend` "" (or "nftables") is this nftables backend, and "iptables" /
"firewalld" are refused (error 2), any other value too (error 7) where the reference silently
picks one; every key is validated before anything changes (the reference's unknown ingressPolicy
fails after its rules are in); pod rules carry their owner (container ID, ifname) in the
comment, so DEL needs no prevResult, a re-ADD replaces instead of adding twice, and GC works
per network.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from cni import skel
from cni.host import forward, nft, xtforward
from cni.skel import Request
from cni.spec.config import PluginConf, StrictStr, parse
from cni.spec.errors import CNIError, Code, invalid_config, unsupported
from cni.spec.result import Result

POLICIES = ("open", "same-bridge", "isolated")
_RETRIES = 3  # a batch deleting by handle fails if a concurrent DEL removed the rule first
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@=+\-]{1,15}$")  # what an nft rule may name, quoted


class FirewallConf(PluginConf):
    backend: StrictStr = ""
    iptablesAdminChainName: StrictStr = ""
    firewalldZone: StrictStr = ""
    ingressPolicy: StrictStr = ""


# --- verbs ------------------------------------------------------------------------------------

def add(req: Request) -> Result:
    conf = parse_config(req)
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG, "missing prevResult from earlier plugin")
    ips = addresses(req.prev_result)
    bridge = isolated_bridge(conf, req.prev_result)
    if not ips and bridge is None:
        return req.prev_result
    comment = owner(req)
    isolated = conf.ingressPolicy == "isolated"
    made: list[tuple[str, str]] = []  # the isolation rules this ADD added (chain, comment)

    def script(_attempt: int) -> str:
        listing = _listed()
        text = forward.layout_script() + nft.delete_rules_script(listing.owned(comment))
        text += forward.pod_rules(ips, comment)
        if bridge is not None:
            text += forward.isolation_script(listing, bridge, isolated)
            made[:] = [(c, m) for c, m in forward.isolation_comments(bridge, isolated)
                       if not listing.commented(c, m)]
        return text

    _apply(script)
    try:
        for family in _families(ips):
            if xtforward.present(family):
                xtforward.add(family, [ip for ip in ips if _family(ip) == family],
                              admin_chain(conf))
    except (nft.NftError, xtforward.XtablesError, OSError) as e:
        def undo(_attempt: int) -> str:
            listing = _listed()
            return nft.delete_rules_script(listing.owned(comment) + [
                r for r in listing.rules if (r.get("chain"), r.get("comment")) in made])

        _apply(undo)
        raise CNIError(Code.INTERNAL, f"unable to add the pod's iptables FORWARD rules: {e}") \
            from None
    return req.prev_result


def delete(req: Request) -> None:
    # No config value is read: the rules are found by their owner (and the prevResult's
    # addresses, for the reference's rules), so any config, even one ADD refuses, is deletable.
    comment = owner(req)
    prev = req.prev_result if isinstance(req.prev_result, dict) else {}
    try:
        prev_ips = set(addresses(prev))
    except (KeyError, TypeError, ValueError):
        prev_ips = set()  # a DEL never fails over its config
    _remove(req, lambda c: c == comment, prev_ips)


def gc(req: Request) -> int:
    """Remove the pod rules of this network's attachments that are not in the valid list (the
    reference's firewall has no GC); a bridge's isolation rules stay, as DEL leaves them."""
    valid = skel.valid_attachments(req.config)
    if valid is None:  # libcni's GC without args: stale and live look alike
        req.log("GC without cni.dev/valid-attachments: no rule removed")
        return 0
    keep = {forward.owner_comment(cid, ifname, req.network) for cid, ifname in valid}
    return _remove(req, lambda c: forward.of_network(c, req.network) and c not in keep, set())


def _remove(req: Request, stale: Callable[[str], bool], also: set[str]) -> int:
    """Delete the pod rules whose owner comment is `stale`, and the iptables accepts of their
    addresses (and of `also`) that no other owner's rule still has; -> how many nft rules."""
    found: dict[str, Any] = {}

    def script(_attempt: int) -> str:
        listing = _listed()
        pods = [r for r in listing.rules if r.get("chain") == forward.PODS]
        found["rules"] = [r for r in pods if stale(str(r.get("comment") or ""))]
        handles = {r.get("handle") for r in found["rules"]}
        found["others"] = {forward.pod_address(r) for r in pods if r.get("handle") not in handles}
        return nft.delete_rules_script(found["rules"])

    _apply(script)
    mine = {forward.pod_address(r) for r in found.get("rules", [])} - {None}
    gone = sorted((mine | also) - found.get("others", set()))
    for family in _families(gone):
        try:
            if xtforward.present(family):
                xtforward.delete(family, [ip for ip in gone if _family(ip) == family])
        except (nft.NftError, xtforward.XtablesError, OSError) as e:
            req.log(f"firewall: iptables FORWARD rules of {gone} not removed: {e}")
    return len(found.get("rules", []))


def check(req: Request) -> None:
    conf = parse_config(req)
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG, "missing prevResult from earlier plugin")
    ips = addresses(req.prev_result)
    bridge = isolated_bridge(conf, req.prev_result)
    if not ips and bridge is None:
        return
    listing = _listed()
    why = forward.layout_present(listing)
    for ip in ips:
        if why is None and not forward.has_pod_rules(listing, ip, owner(req)):
            why = f"{forward.FAMILY} {forward.TABLE}: no accept rules for {ip} ({owner(req)})"
    if why is None and bridge is not None:
        why = forward.isolation_missing(listing, bridge, conf.ingressPolicy == "isolated")
    if why is not None:
        raise CNIError(Code.INTERNAL, why)
    try:
        for family in _families(ips):
            if xtforward.present(family):
                rule = xtforward.missing(family, [ip for ip in ips if _family(ip) == family],
                                         admin_chain(conf))
                if rule is not None:
                    raise CNIError(Code.INTERNAL, f"expected iptables rule not found: {rule}")
    except (nft.NftError, xtforward.XtablesError, OSError) as e:
        raise CNIError(Code.INTERNAL, f"iptables FORWARD: {e}") from None


def status(req: Request) -> None:
    ok, why = nft.available()
    if not ok:
        raise CNIError(Code.NOT_AVAILABLE, f"firewall: nftables is not usable: {why}")


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


def _family(ip: str) -> int:
    return ipaddress.ip_address(ip).version


def _families(ips: list[str]) -> list[int]:
    return sorted({_family(ip) for ip in ips})


def _listed() -> forward.Listing:
    try:
        return forward.listed()
    except nft.NftUnavailable as e:
        raise CNIError(Code.NOT_AVAILABLE, str(e)) from None


def _apply(script: Callable[[int], str]) -> None:
    """Run the batch script(attempt) builds (a retry lists afresh), rebuilt and retried if it
    raced another."""
    for attempt in range(_RETRIES):
        text = script(attempt)
        if not text:
            return
        try:
            nft.run(text)
            return
        except nft.NftUnavailable as e:
            raise CNIError(Code.NOT_AVAILABLE, str(e)) from None
        except nft.NftError as e:
            if attempt == _RETRIES - 1:
                raise CNIError(Code.INTERNAL,
                               f"unable to set up nftables rules for the firewall: {e}") from None
