"""bridge: pods on a Linux bridge through veth pairs, as the reference plugin.

add / delete / check read like the reference's cmdAdd / cmdDel / cmdCheck, step by step; the
kernel work is in cni.host.*. Masquerade and spoof-check rules carry the reference's v1.9 names
(cni.host.masq, cni.host.spoofchk), so either side's DEL and GC clean the other's attachments.
Differences from the reference, all deliberate:
- a failed ADD undoes what it did (IPAM reservation, veth, spoof check and masquerade rules);
  an ADD whose result the config's cniVersion cannot carry (no ipam before 0.3.0) is refused
  before anything is made, where the reference makes the veth and then fails to print;
- DEL removes this attachment's masquerade / spoof-check rules by their comment even when
  CNI_NETNS is empty or gone (reference #810), and tolerates configs ADD would refuse;
- the bridge MAC is pinned on every ADD (after the port joins), not only with isGateway (#805),
  to the MAC it has then (read just before: ADDs at once on a new bridge pin the same one);
- ADD returns once the port forwards, not only when it is oper-up (reference #463);
- ipMasq uses nftables; `ipMasqBackend: "iptables"` is refused (error 2);
- `nonMasqueradeCIDRs` (not a reference key; ip-masq-agent's name): destinations ipMasq leaves
  alone beside the pod's subnet, e.g. the cluster's pod CIDR on a routed cluster (cni.host.masq);
- GC without cni.dev/valid-attachments removes nothing; GC drops a spoof check only once its
  host veth is gone (the reference's names carry no network).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Any

from cni.host import addrs, bridge, links, masq, netns, peer, routes, spoofchk, veth
from cni.host.errors import HostError, NamespaceMissing
from cni.ipam import delegate as ipam
from cni.plugins.undo import Undo
from cni.skel import Request, require_printable, valid_attachments
from cni.spec import cidr, keys, names
from cni.spec import version as versions
from cni.spec.config import (
    Field,
    Model,
    PluginConf,
    StrictBool,
    StrictInt,
    StrictStr,
    parse,
    parse_lenient,
)
from cni.spec.errors import CNIError, Code, invalid_config, unsupported
from cni.spec.result import Result

_MAC = re.compile(r"^[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}$")
Bool = StrictBool
Int = StrictInt


class VlanTrunk(Model):
    minID: Int | None = None
    maxID: Int | None = None
    id: Int | None = None


class NetConf(PluginConf):
    bridge: StrictStr = "cni0"
    isGateway: Bool = False
    isDefaultGateway: Bool = False
    forceAddress: Bool = False
    ipMasq: Bool = False
    ipMasqBackend: StrictStr | None = None
    mtu: Int = 0
    hairpinMode: Bool = False
    promiscMode: Bool = False
    vlan: Int = 0
    vlanTrunk: list[VlanTrunk] | None = None
    preserveDefaultVlan: Bool = False  # v1.9.1's default
    macspoofchk: Bool = False
    enabledad: Bool = False
    disableContainerInterface: Bool = False
    portIsolation: Bool = False
    nonMasqueradeCIDRs: list[StrictStr] | None = None  # pycni's: normalized by load()
    # Derived by load(), not config keys.
    mac: str = ""
    vlans: list[int] = Field(default_factory=list)

    @property
    def ipam_type(self) -> str:
        value = keys.get(self.ipam or {}, "type", "")
        return value if isinstance(value, str) else ""


# --- config ---------------------------------------------------------------------------------

def load(req: Request, strict: bool = True) -> NetConf:
    """Parse and validate the config (the reference's loadNetConf). With strict=False (DEL, GC,
    STATUS) only types are checked: a config ADD would refuse must still be deletable."""
    derived = ("mac", "vlans")  # fields load() fills in, never read from the config
    conf = parse(NetConf, {k: v for k, v in req.config.items()
                           if not keys.is_one_of(k, derived)})
    if not strict:
        return conf
    validate_ifname_key("bridge", conf.bridge)
    if conf.mtu and not 68 <= conf.mtu <= 65535:
        raise invalid_config("mtu", conf.mtu, "must be between 68 and 65535")
    if not 0 <= conf.vlan <= 4094:
        raise invalid_config("vlan", conf.vlan, "invalid VLAN ID (must be between 0 and 4094)")
    conf.vlans = collect_vlan_trunk(conf.vlanTrunk)  # with vlan too: PVID + tagged trunk
    if conf.ipMasqBackend == "iptables":
        raise unsupported("ipMasqBackend", "iptables", "only the nftables backend is built")
    if conf.ipMasqBackend not in (None, "nftables"):
        raise invalid_config("ipMasqBackend", conf.ipMasqBackend, "unrecognized ipMasqBackend")
    conf.nonMasqueradeCIDRs = [non_masquerade_cidr(i, v)
                               for i, v in enumerate(conf.nonMasqueradeCIDRs or [])]
    conf.mac = container_mac(req, conf)
    return conf


def non_masquerade_cidr(index: int, value: str) -> str:
    """One nonMasqueradeCIDRs entry, normalized (cni.spec.cidr: prefix length written out, no
    host bits, no scope ID)."""
    try:
        return str(cidr.network(value))
    except ValueError as e:
        raise invalid_config(f"nonMasqueradeCIDRs[{index}]", value, str(e)) from None


def check_non_masquerade_families(cidrs: list[str], ips: list[dict]) -> None:
    """Each nonMasqueradeCIDRs entry must be of a family the network's addresses have."""
    have = {ipaddress.ip_interface(ip["address"]).version for ip in ips}
    for i, value in enumerate(cidrs):
        version = ipaddress.ip_network(value).version
        if version not in have:
            raise invalid_config(f"nonMasqueradeCIDRs[{i}]", value,
                                 f"an IPv{version} CIDR, and the network gives the pod no "
                                 f"IPv{version} address")


def load_for_del(req: Request) -> NetConf:
    """DEL's config: what validates of it (a key of the wrong type is taken at its default).
    DEL finds the veth by CNI_IFNAME, the rules by their comment and the reservation by the
    container ID, so a config ADD refuses still deletes what an earlier ADD made (libcni stops
    a DEL chain at the first error: a refusing bridge would leak the whole attachment)."""
    derived = ("mac", "vlans")
    conf, dropped = parse_lenient(NetConf, {k: v for k, v in req.config.items()
                                            if not keys.is_one_of(k, derived)})
    if dropped:
        req.log(f"DEL: config keys {', '.join(dropped)} ignored (values ADD would refuse)")
    return conf


def validate_ifname_key(key: str, name: str) -> None:
    problem = names.ifname_problem(name)
    if problem is not None:
        raise invalid_config(key, name, problem)


def collect_vlan_trunk(trunks: list[VlanTrunk] | None) -> list[int]:
    """The sorted set of trunk VLAN IDs, with the reference's range checks."""
    vids: set[int] = set()
    for i, item in enumerate(trunks or []):
        if item.minID is not None and item.maxID is not None:
            for key, value in (("minID", item.minID), ("maxID", item.maxID)):
                if not 0 < value <= 4094:
                    raise invalid_config(f"vlanTrunk[{i}].{key}", value,
                                         f"incorrect trunk {key} parameter")
            if item.maxID < item.minID:
                raise invalid_config(f"vlanTrunk[{i}]", item.model_dump(exclude_none=True),
                                     "minID is greater than maxID in trunk parameter")
            vids.update(range(item.minID, item.maxID + 1))
        if item.id is not None:
            if not 0 < item.id <= 4094:
                raise invalid_config(f"vlanTrunk[{i}].id", item.id,
                                     "incorrect trunk id parameter")
            vids.add(item.id)
    return sorted(vids)


def container_mac(req: Request, conf: NetConf) -> str:
    """runtimeConfig.mac > args.cni.mac > CNI_ARGS MAC= (the reference's precedence)."""
    mac = cni_args_mac(req)
    cni = keys.get(conf.args or {}, "cni")
    if isinstance(cni, dict) and keys.get(cni, "mac"):
        mac = check_mac("args.cni.mac", keys.get(cni, "mac"))
    if req.runtime_config.get("mac"):
        mac = check_mac("runtimeConfig.mac", req.runtime_config["mac"])
    return mac


def cni_args_mac(req: Request) -> str:
    """CNI_ARGS as the reference's LoadArgs into {IgnoreUnknown, MAC}: other keys are refused
    unless IgnoreUnknown is true."""
    mac = names.known_args(req.args, ("MAC",)).get("MAC")
    if not mac:
        return ""
    if not _MAC.match(mac) or int(mac[:2], 16) & 1:
        raise CNIError(Code.INVALID_ENV, f"invalid CNI_ARGS MAC {mac!r}: not a unicast MAC")
    return mac.lower().replace("-", ":")


def check_mac(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _MAC.match(value) or int(value[:2], 16) & 1:
        raise invalid_config(key, value, "not a unicast MAC address")
    return value.lower().replace("-", ":")


# --- ADD ------------------------------------------------------------------------------------

@netns.one_socket_per_namespace  # one netlink socket per namespace, not one per step
def add(req: Request) -> Result:
    conf = load(req)
    is_layer3 = conf.ipam_type != ""
    if is_layer3 and conf.disableContainerInterface:
        raise invalid_config("disableContainerInterface", True,
                             "cannot use IPAM when DisableContainerInterface flag is set")
    if not is_layer3 and not versions.at_least(req.version, "0.3.0"):
        # A result before 0.3.0 is its IP addresses: skel could not print this one, and only
        # after the veth exists (the reference leaves its veth behind that way).
        raise invalid_config("cniVersion", req.version,
                             "cannot convert: no valid IP addresses (a bridge without ipam has "
                             "none, and a result before 0.3.0 is only IP addresses); use "
                             "cniVersion 0.3.0 or later, or set ipam")
    if conf.isDefaultGateway:
        conf.isGateway = True
    if conf.hairpinMode and conf.promiscMode:
        raise invalid_config("promiscMode", True,
                             "cannot set hairpin mode and promiscuous mode at the same time")
    if is_layer3:
        ipam.validate_type(conf.ipam_type)
    if conf.macspoofchk:
        try:
            spoofchk.check_names(req.container_id, req.ifname)
        except ValueError:
            raise CNIError(Code.INVALID_ENV, f"macspoofchk: CNI_CONTAINERID {req.container_id!r}"
                           f" and CNI_IFNAME {req.ifname!r} must make an nftables chain name "
                           "(letters, digits, '_', '.', '-'; comment at most 128 bytes)") from None

    with Undo(req) as undo:
        result = _add_steps(req, conf, is_layer3, undo)
        require_printable(result, req.version)  # skel prints it after the undo is gone
        return result


def _add_steps(req: Request, conf: NetConf, is_layer3: bool, undo: Undo) -> Result:
    br, created = bridge.ensure(conf.bridge, conf.mtu, conf.promiscMode,
                                vlan_filtering=bool(conf.vlan or conf.vlanTrunk is not None))

    pair = veth.create(req.netns_target, req.ifname, conf.mtu, conf.mac, master=br.index)
    undo.push("veth", lambda: veth.delete_host_end(pair.host.name))
    # The port's flags, then the bridge's MAC pinned once it has a port: pinned before, the
    # kernel leaves it in operstate UNKNOWN with bridge id 0 (the reference's bridge is UP).
    bridge_mac = bridge.attach_pinned(pair.host.name, br, conf.hairpinMode,
                                      conf.portIsolation, pair.host.index)
    bridge.set_vlans(pair.host.name, conf.vlan, conf.vlans, conf.preserveDefaultVlan)

    if conf.macspoofchk:
        undo.push("spoof check", lambda: spoofchk.teardown(req.container_id, req.ifname,
                                                           conf.name))
        spoofchk.setup(pair.host.name, pair.container.mac, req.container_id, req.ifname)

    result: Result = {
        "cniVersion": req.version,
        "interfaces": [
            {"name": br.name, "mac": br.mac},
            {"name": pair.host.name, "mac": pair.host.mac},
            {"name": req.ifname, "mac": pair.container.mac, "sandbox": req.netns},
        ],
        "ips": [], "routes": [], "dns": {},
    }

    port_read = None  # the host end's link, read in an earlier send: see setup_gateways
    if is_layer3:
        ipam_result = ipam.add(req, conf.ipam_type)
        undo.push("IPAM reservation", lambda: ipam.delete(req, conf.ipam_type))
        result["ips"] = ipam_result.get("ips", [])
        result["routes"] = ipam_result.get("routes", [])
        result["dns"] = ipam_result.get("dns", {})
        if not result["ips"]:
            raise CNIError(Code.INTERNAL, "IPAM plugin returned missing IP config")
        check_non_masquerade_families(conf.nonMasqueradeCIDRs or [], result["ips"])

        gateways = calc_gateways(result, conf)

        with netns.entered(req.netns_target):
            addrs.set_dad(req.ifname, conf.enabledad)
            addrs.set_arp_notify(req.ifname)
            addrs.configure_iface(req.ifname, result["ips"], result["routes"],
                                  pair.container.index)

        if conf.isGateway:  # the port read with the bridge's addresses, after the pod's up
            read = setup_gateways(conf, br, gateways, result,
                                  [links.get_request(ifname=pair.host.name)])
            port_read = read[0] if read else None

        if conf.ipMasq:
            undo.push("masquerade rules", lambda: masq.teardown(conf.name, req.ifname,
                                                                req.container_id))
            masq.setup([ip["address"] for ip in result["ips"]], conf.name, req.ifname,
                       req.container_id, conf.nonMasqueradeCIDRs or [])
    elif not conf.disableContainerInterface:
        with netns.iproute(req.netns_target) as cipr:
            links.set_up(cipr, pair.container.index)

    if not conf.disableContainerInterface:
        host = bridge.wait_forwarding(pair.host.name, read=port_read)
    else:
        with netns.iproute() as ipr:
            host = links.get(ipr, pair.host.name)
        if host is None:
            raise HostError(f"failed to lookup {pair.host.name!r}")
    # The host end's MAC can change as the port comes up: report it now. The bridge's is
    # pinned (attach_pinned), but one this ADD created may still be given another address by udev
    # (systemd's MACAddressPolicy=persistent rewrites a new device's MAC once it has handled
    # its uevent, which can be after the pin): read again then, as the reference always does.
    result["interfaces"][1]["mac"] = host.mac
    result["interfaces"][0]["mac"] = bridge.lookup(br.name).mac if created else bridge_mac

    if conf.dns is not None and any(conf.dns.model_dump().values()):
        result["dns"] = conf.dns.model_dump(exclude_defaults=True)
    return result


def calc_gateways(result: Result, conf: NetConf) -> dict[int, list[str]]:
    """Point every IP at the container interface (index 2), default each gateway to the
    subnet's first address (isGateway) and add a default route per family (isDefaultGateway).
    Returns the gateway addresses for the bridge, 'gw/prefix' by IP version."""
    gateways: dict[int, list[str]] = {4: [], 6: []}
    default_found: dict[int, bool] = {4: False, 6: False}
    for ipc in result["ips"]:
        iface = ipaddress.ip_interface(ipc["address"])
        fam = iface.version
        ipc["interface"] = 2
        if not ipc.get("gateway") and conf.isGateway:
            ipc["gateway"] = str(iface.network.network_address + 1)
        if conf.isDefaultGateway and not default_found[fam]:
            zero = "0.0.0.0/0" if fam == 4 else "::/0"
            default_found[fam] = any(
                r.get("gw") and ipaddress.ip_network(r["dst"], strict=False)
                == ipaddress.ip_network(zero) for r in result["routes"])
            if not default_found[fam]:
                route = {"dst": zero}
                if ipc.get("gateway"):
                    route["gw"] = ipc["gateway"]
                result["routes"].append(route)
                default_found[fam] = True
        if conf.isGateway:
            gateways[fam].append(f"{ipc['gateway']}/{iface.network.prefixlen}")
    return gateways


def setup_gateways(conf: NetConf, br: links.Link, gateways: dict[int, list[str]],
                   result: Result, reads: list | None = None) -> list | None:
    """Gateway addresses on the bridge (or its VLAN interface) and forwarding on. `reads`:
    read requests of the host namespace sent with the first gateway's address dump of the
    bridge (addrs.ensure_gateway_reading) -> their replies (None: not sent, VLAN or no
    gateway)."""
    vlan_iface: links.Link | None = None
    replies: list | None = None
    for fam in (4, 6):
        for gw in gateways[fam]:
            if conf.vlan:
                if vlan_iface is None:
                    vlan_iface, _ = bridge.ensure_vlan_interface(br, conf.vlan,
                                                                 conf.preserveDefaultVlan)
                    result["interfaces"].append({"name": vlan_iface.name,
                                                 "mac": vlan_iface.mac})
                target, index = vlan_iface.name, vlan_iface.index
            else:
                target, index = br.name, br.index
            asked = reads if reads and replies is None and not conf.vlan else []
            try:
                read = addrs.ensure_gateway_reading(target, gw, conf.forceAddress, index, asked)
            except HostError as e:
                what = "vlan interface for bridge with addr" if conf.vlan else "bridge addr"
                raise HostError(f"failed to set {what}: {e}") from None
            if asked:
                replies = read
        if gateways[fam]:
            try:
                addrs.enable_forwarding(fam)
            except OSError as e:
                raise CNIError(Code.INTERNAL, f"failed to enable forwarding: {e}") from None
    return replies


# --- DEL ------------------------------------------------------------------------------------

def delete(req: Request) -> None:
    conf = load_for_del(req)
    is_layer3 = conf.ipam_type != ""

    if req.netns or req.netns_fd is not None:
        try:
            veth.delete_container_end(req.netns_target, req.ifname)
        except NamespaceMissing:
            pass  # the namespace is gone, and the veth with it

    if is_layer3:
        ipam.delete_lenient(req, conf.ipam_type)

    # By comment, so nothing leaks whatever CNI_NETNS was; only an error if the feature is on.
    _teardown(conf.macspoofchk, lambda: spoofchk.teardown(req.container_id, req.ifname,
                                                          conf.name, conf.macspoofchk), req)
    _teardown(conf.ipMasq, lambda: masq.teardown(conf.name, req.ifname, req.container_id), req)


def _teardown(enabled: bool, fn: Callable[[], Any], req: Request) -> int:
    """fn's count of what it removed (0 when it says nothing or nftables is not there)."""
    from cni.host.nft import NftError

    try:
        done = fn()
    except NftError as e:
        if enabled:
            raise CNIError(Code.INTERNAL, str(e)) from None
        req.log(f"skipped nftables cleanup: {e}")
        return 0
    return done if isinstance(done, int) and not isinstance(done, bool) else 0


# --- CHECK ----------------------------------------------------------------------------------

@netns.one_socket_per_namespace  # one netlink socket per namespace, not one per step
def check(req: Request) -> None:
    conf = load(req)
    if conf.ipam_type:
        ipam.check(req, conf.ipam_type)
    prev = req.prev_result
    if prev is None:
        raise CNIError(Code.INVALID_CONFIG, "Required prevResult missing")

    br_entry = cont_entry = None
    for intf in prev.get("interfaces", []):
        if intf["name"] == conf.bridge:
            br_entry = intf
        elif intf["name"] == req.ifname and intf.get("sandbox") == req.netns:
            cont_entry = intf
    if br_entry is None:
        raise CNIError(Code.INTERNAL, f"bridge {conf.bridge} not found in prevResult")
    if cont_entry is None:
        raise CNIError(Code.INTERNAL, f"interface {req.ifname} in {req.netns} not found in "
                       "prevResult")

    br, cont, host_end, cont_addresses, looked_up = _check_links(conf, req, br_entry)
    if cont_entry.get("mac") and cont.mac != cont_entry["mac"].lower():
        raise CNIError(Code.INTERNAL, f"Interface {req.ifname} Mac {cont_entry['mac']} doesn't "
                       f"match container Mac: {cont.mac}")
    host_names = {i["name"] for i in prev.get("interfaces", []) if not i.get("sandbox")}
    if host_end is None or host_end.name not in host_names:
        raise CNIError(Code.INTERNAL, f"host veth peer of {req.ifname} not found in prevResult")
    if host_end.master != br.index:
        raise CNIError(Code.INTERNAL,
                       f"Interface {host_end.name} not attached to bridge {conf.bridge}")

    with netns.iproute(req.netns_target) as cipr:
        for ipc in prev.get("ips", []):
            if not addrs.has(cipr, cont.index, ipc["address"], cont_addresses):
                raise CNIError(Code.INTERNAL, f"Failed to match addr {ipc['address']} on "
                               f"interface {req.ifname}")
        dumped: dict[int, list] = {}  # the routes of a family, dumped once for all its routes
        for route, replies in zip(prev.get("routes", []), looked_up, strict=True):
            if not routes.find_looked_up(cipr, route["dst"], route.get("gw"), dumped, replies):
                raise CNIError(Code.INTERNAL, f"Failed to find route '{route['dst']}' in "
                               "container")

    check_non_masquerade_families(conf.nonMasqueradeCIDRs or [], prev.get("ips", []))
    if conf.ipMasq:
        have = masq.present(conf.name, req.ifname, req.container_id)
        for ipc in prev.get("ips", []):
            address = str(ipaddress.ip_interface(ipc["address"]).ip)
            if address not in have:
                raise CNIError(Code.INTERNAL, f"masquerade rule for {address} is missing")
            want = masq.destinations(ipc["address"], conf.nonMasqueradeCIDRs or [])
            got = have[address]
            got = {str(ipaddress.ip_interface(ipc["address"]).network)} if got is None else got
            if got != set(want):
                raise CNIError(Code.INTERNAL, f"masquerade rule for {address} leaves "
                               f"{sorted(got)} alone, the config says {want}")
    if conf.macspoofchk and not spoofchk.present(req.container_id, req.ifname, conf.name):
        raise CNIError(Code.INTERNAL, f"mac spoof check for {req.ifname} is missing")


def _check_links(conf: NetConf, req: Request, br_entry: dict
                 ) -> tuple[links.Link, links.Link, links.Link | None, list | None, list]:
    """The bridge (checked against its prevResult entry), the container veth, its host end
    (None: not there, or not its peer), the replies of the container namespace's address
    dump, for addrs.has (None: ask again then), and of a lookup of each prevResult route, for
    routes.find (None: not asked). The container veth, the route lookups and that dump are
    read in one send (dumps.together), then the bridge and the host end in another: the
    bridge's errors still come first. The dump is of the whole pod namespace (its lo's
    addresses too), since the veth's index is not known before the lookup's answer, of the
    IPs' family when they are all of one; addrs.has takes the veth's own. None of the pod's
    addresses: asked again then, alone, as before; no dump when prevResult has no IPs to
    check. A route the lookup did not name is looked for in a dump, as before."""
    from cni.host import dumps

    wanted = (req.prev_result or {}).get("routes", [])
    looked_up: list = [None] * len(wanted)
    try:
        asked = [links.get_request(ifname=req.ifname)]
        lookups = [(i, routes.lookup_request(r.get("dst"))) if isinstance(r, dict) else (i, None)
                   for i, r in enumerate(wanted)]
        lookups = [(i, msg) for i, msg in lookups if msg is not None]
        asked += [msg for _, msg in lookups]
        ips = (req.prev_result or {}).get("ips", [])
        if ips:
            asked.append(dumps.address_request(0, _family_of(ips)))  # the one dump: last
        with netns.iproute(req.netns_target) as cipr:
            read = dumps.together(cipr, asked)
        for (i, _), replies in zip(lookups, read[1:], strict=False):
            looked_up[i] = replies
        cont, failed = peer.container_veth(req.netns_target, req.ifname, read[0]), None
        addresses = (read[-1] or None) if ips else None
    except Exception as e:  # reported after the bridge's own errors, as before
        cont, failed, addresses = None, e, None
    with netns.iproute() as ipr:
        asked = [links.get_request(ifname=conf.bridge)]
        if cont is not None:
            asked.append(links.get_request(index=cont.peer_index))
        replies = dumps.together(ipr, asked)
        br = check_bridge(conf, br_entry, bridge.by_name(ipr, conf.bridge, replies[0]))
        if cont is None:
            raise failed  # type: ignore[misc]
        host_end = peer.points_back(cont, links.by_index(ipr, cont.peer_index, replies[1]))
    return br, cont, host_end, addresses, looked_up


def _family_of(ips: list[dict]) -> int:
    """AF_INET or AF_INET6 when the prevResult's IPs are all of that family (only those
    addresses to decode), else AF_UNSPEC (all; also for an address that does not parse: check
    says so later, as before)."""
    try:
        versions = {ipaddress.ip_interface(ip["address"]).version for ip in ips}
    except (KeyError, TypeError, ValueError):
        return socket.AF_UNSPEC
    if versions == {4}:
        return socket.AF_INET
    return socket.AF_INET6 if versions == {6} else socket.AF_UNSPEC


def check_bridge(conf: NetConf, entry: dict, br: links.Link | None = None) -> links.Link:
    br = br or bridge.lookup(conf.bridge)
    if entry.get("mac") and br.mac != entry["mac"].lower():
        raise CNIError(Code.INTERNAL, f"Bridge interface {conf.bridge} Mac doesn't match: "
                       f"{entry['mac']}")
    if conf.promiscMode and not br.promisc:
        raise CNIError(Code.INTERNAL, f"Bridge interface {conf.bridge} not in promiscuous mode")
    return br


# --- GC / STATUS ----------------------------------------------------------------------------

def gc(req: Request) -> int:
    """-> how many objects it removed (rules, spoof checks, reservations)."""
    conf = load(req, strict=False)
    valid = valid_attachments(req.config)
    removed = 0
    if valid is None:  # libcni's GC without args: stale and live look alike, remove nothing
        req.log("GC without cni.dev/valid-attachments: no nftables rule removed")
    else:
        removed += _teardown(conf.ipMasq, lambda: masq.gc(conf.name, valid), req)
        removed += _teardown(conf.macspoofchk,
                             lambda: spoofchk.gc(conf.name, valid, links.names()), req)
    if conf.ipam_type:
        removed += ipam.gc(req, conf.ipam_type)
    return removed


def status(req: Request) -> None:
    conf = load(req, strict=False)
    if conf.ipMasq or conf.macspoofchk:
        from cni.host import nft
        ok, why = nft.available()
        if not ok:
            raise CNIError(Code.NOT_AVAILABLE, f"nftables is not usable: {why}")
    if conf.ipam_type:
        ipam.status(req, conf.ipam_type)

