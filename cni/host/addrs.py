"""Addresses: configure an interface from a CNI result (the reference's ConfigureIface), the
gateway address on a bridge (ensureAddr), IPv6 DAD settling.

Functions here act on the *current* namespace: wrap them in netns.entered() for a container.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import time
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from cni.host import dumps, links, netns, routes, sysctl
from cni.host.errors import HostError

if TYPE_CHECKING:
    from collections.abc import Callable

IFA_F_NODAD = 0x02
IFA_F_DADFAILED = 0x08
IFA_F_TENTATIVE = 0x40
SETTLE_SECONDS = 10


def _err(msg: str) -> HostError:
    return HostError(msg)


def set_dad(ifname: str, enabled: bool) -> None:
    """accept_dad=0 by default (addresses usable at once); with enabledad, enhanced DAD on."""
    try:
        if enabled:
            sysctl.write(sysctl.conf(6, ifname, "enhanced_dad"), 1)
            sysctl.write(sysctl.conf(6, ifname, "accept_dad"), 1)
        else:
            sysctl.write(sysctl.conf(6, ifname, "accept_dad"), 0)
    except OSError:
        pass  # IPv6 disabled in this namespace: the reference ignores these errors too


def set_arp_notify(ifname: str) -> None:
    try:
        sysctl.write(sysctl.conf(4, ifname, "arp_notify"), 1)
    except OSError:
        pass


def broadcast(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface
              ) -> ipaddress.IPv4Address | None:
    """The `brd` an IPv4 address gets (the subnet's broadcast, as the reference's netlink
    AddrAdd computes it; none for /31 and /32); IPv6 has none."""
    if iface.version == 4 and iface.network.prefixlen < 31:
        return iface.network.broadcast_address
    return None


def _message(msg_type: int, nl_flags: int, index: int, ip: ipaddress.IPv4Address |
             ipaddress.IPv6Address, prefixlen: int, brd: ipaddress.IPv4Address | None = None,
             flags: int = 0) -> object:
    """pyroute2's ifaddrmsg as addr('add' | 'del', index=, address=, prefixlen=, broadcast=,
    flags=) builds it: IFA_LOCAL is the address too for IPv4, `flags` go in IFA_FLAGS. Built
    here, not by addr(...): its request filters cost ~60 us a request."""
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    msg["prefixlen"] = prefixlen
    msg["index"] = index
    attrs = [["IFA_ADDRESS", str(ip)]]
    if brd is not None:
        attrs.append(["IFA_BROADCAST", str(brd)])
    if flags:
        attrs.append(["IFA_FLAGS", flags])
    if ip.version == 4:
        attrs.append(["IFA_LOCAL", str(ip)])
    msg["attrs"] = attrs
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = nl_flags
    return msg


def add(ipr, index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
        flags: int = 0) -> None:
    """ip addr add, with the IPv4 `brd` of broadcast() (none given: pyroute2 would add none):
    addr('add', ...)'s RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL (EEXIST if it is there)."""
    dumps.request(ipr, add_request(index, iface, flags))


def add_request(index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
                flags: int = 0) -> object:
    """The RTM_NEWADDR add() sends (for a dumps.writes batch)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWADDR

    return _message(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, index,
                    iface.ip, iface.network.prefixlen, broadcast(iface), flags)


def delete(ipr, index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> None:
    """ip addr del: addr('del', ...)'s RTM_DELADDR."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_DELADDR

    dumps.request(ipr, _message(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, index, iface.ip,
                                iface.network.prefixlen))


def _enable_ipv6(ifname: str) -> None:
    """disable_ipv6=0 on lo and the interface before adding a v6 address to it, and
    keep_addr_on_down=1 on the interface (the reference's: a v6 address survives a link down)."""
    for name in ("lo", ifname):
        key = sysctl.conf(6, name, "disable_ipv6")
        try:
            if sysctl.read(key) == "0":
                continue
        except OSError:
            continue
        try:
            sysctl.write(key, 0)
        except OSError as e:
            raise _err(f'failed to enable IPv6 for interface "{name}": {e}') from None
    try:
        sysctl.write(sysctl.conf(6, ifname, "keep_addr_on_down"), 1)
    except OSError:
        pass  # informative, as in the reference


def configure_iface(ifname: str, ips: list[dict], route_list: list[dict],
                    index: int = 0) -> None:
    """Add the addresses, set the link up, wait for DAD, add the routes (current namespace).

    `ips` are the result's entries for this interface; a route without gw goes through the
    first gateway of its family. `index`: the interface's, when the caller has it (no lookup).

    The requests go in one send (dumps.writes_redone; two with an IPv6 gateway: DAD settles
    between the addresses and the routes), in the order they were sent one by one, so a route
    sees the address and the up before it. The first the kernel refused is sent again alone and
    gives the error it gave alone; the ones after it were done anyway, but they only touch this
    interface, which a failed ADD's undo deletes (bridge: the veth).
    """
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    with netns.iproute() as ipr:
        link = _link(ipr, ifname, index, f'failed to lookup "{ifname}": Link not found')
        batch: list[tuple[object, Callable[[], object]]] = []
        try:
            gws = _address_requests(ipr, ifname, link.index, ips, batch)
            batch.append((links.message(RTM_NEWLINK, link.index, flags=links.IFF_UP,
                                        change=links.IFF_UP),
                          partial(links.set_up, ipr, link.index)))
            if 6 in gws:
                _sent(ipr, batch)
                settle(ipr, link.index, ifname)
            for r in route_list:
                fam = ipaddress.ip_network(r["dst"], strict=False).version
                args = (r["dst"], link.index, r.get("gw") or gws.get(fam))
                keys = {"mtu": r.get("mtu", 0), "advmss": r.get("advmss", 0),
                        "priority": r.get("priority", 0), "table": r.get("table"),
                        "scope": r.get("scope"), "ifname": ifname}
                batch.append((routes.add_request(*args, **keys),
                              partial(routes.add, ipr, *args, **keys)))
        except Exception:
            _sent(ipr, batch)  # the requests before it: their errors came first, sent alone
            raise
        _sent(ipr, batch)


def _address_requests(ipr, ifname: str, index: int, ips: list[dict],
                      batch: list[tuple[object, Callable[[], object]]]) -> dict[int, str]:
    """configure_iface's address adds, appended to `batch`; -> the first gateway of each
    family. IPv6 is enabled on the interface before its first IPv6 address is asked for (an
    error there is raised after the batch's, as when the addresses were sent one by one)."""
    gws: dict[int, str] = {}
    v6 = False
    for ipc in ips:
        iface = ipaddress.ip_interface(ipc["address"])
        if iface.version == 6 and not v6:
            _enable_ipv6(ifname)
            v6 = True
        batch.append((add_request(index, iface),
                      partial(_add_named, ipr, index, iface, ipc["address"], ifname)))
        if ipc.get("gateway"):
            gws.setdefault(iface.version, ipc["gateway"])
    return gws


def _add_named(ipr, index: int, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
               address: str, ifname: str) -> None:
    """add(), its error in configure_iface's words."""
    from pyroute2 import NetlinkError

    try:
        add(ipr, index, iface)
    except NetlinkError as e:
        raise _err(f'failed to add IP addr {address} to "{ifname}": '
                   f"{e.args[1] if len(e.args) > 1 else e}") from None


def _sent(ipr, batch: list[tuple[object, Callable[[], object]]]) -> None:
    """The batch in one send, each refused request redone alone (its error raised); emptied."""
    if batch:
        requests = batch[:]
        batch.clear()
        dumps.writes_redone(ipr, requests)


def settle(ipr, index: int, ifname: str, timeout: float = SETTLE_SECONDS) -> None:
    """Wait until no IPv6 address of the link is tentative (DAD done)."""
    deadline = time.monotonic() + timeout
    while True:
        tentative = False
        for address, _, flags in dumps.address_entries(ipr, index, socket.AF_INET6):
            if flags & IFA_F_DADFAILED:
                raise _err(f"link {ifname} has address {address} in DADFAILED state")
            tentative = tentative or bool(flags & IFA_F_TENTATIVE)
        if not tentative:
            return
        if time.monotonic() > deadline:
            raise _err(f"link {ifname} still has tentative addresses after {timeout} seconds")
        time.sleep(0.05)


def ensure_gateway(ifname: str, cidr: str, force: bool, index: int = 0) -> None:
    """The gateway address (e.g. 10.1.0.1/24) on the bridge, as the reference's ensureAddr.

    IPv4: another address on the bridge is an error unless forceAddress, which replaces it.
    IPv6: several addresses are fine unless their subnets overlap (then the same rule).
    `index`: the interface's, when the caller has it (no lookup).
    """
    ensure_gateway_reading(ifname, cidr, force, index, [])


def ensure_gateway_reading(ifname: str, cidr: str, force: bool, index: int,
                           reads: list[object]) -> list[list]:
    """ensure_gateway(), with `reads` (read requests of this namespace, e.g.
    links.get_request) sent in the same send as its address dump, before it (dumps.together:
    no dump among them) -> their replies, each as together() gives it (none: ask alone again).
    Without an `index`, or `reads`, ensure_gateway's own requests only (and no replies)."""
    from pyroute2 import NetlinkError

    want = ipaddress.ip_interface(cidr)
    family = socket.AF_INET if want.version == 4 else socket.AF_INET6
    with netns.iproute() as ipr:
        link = _link(ipr, ifname, index, f'could not lookup "{ifname}": Link not found')
        read: list[list] = [[] for _ in reads]
        dumped = None
        if reads and index:
            *read, dumped = dumps.together(ipr, [*reads, dumps.address_request(index, family)])
        # an empty dump (no address of the family, or a refusal) is asked again alone
        for address, prefixlen, _ in dumps.address_entries(ipr, link.index, family,
                                                          dumped or None):
            have = ipaddress.ip_interface(f"{address}/{prefixlen}")
            if have == want:
                return read
            if have.is_link_local and want.version == 6:
                continue
            if (want.version == 4 or want.ip in have.network or have.ip in want.network):
                if not force:
                    raise _err(f'"{ifname}" already has an IP address different from {cidr}')
                delete(ipr, link.index, have)
        # No DAD for a v6 gateway: pods can use it as soon as ADD returns, not ~2 s later.
        flags = IFA_F_NODAD if want.version == 6 else 0
        try:
            add(ipr, link.index, want, flags)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise _err(f'could not add IP address to "{ifname}": {e}') from None
        return read


class _Known(NamedTuple):
    index: int


def _link(ipr, ifname: str, index: int, missing: str) -> _Known | links.Link:
    """The link to work on: by the index the caller has, or looked up by name."""
    if index:
        return _Known(index)
    link = links.get(ipr, ifname)
    if link is None:
        raise _err(missing)
    return link


def has(ipr, index: int, cidr: str, replies: list | None = None) -> bool:
    """Whether the link has the address; `replies`: those of a dumps.address_request (see
    dumps.addresses), else asked now."""
    want = ipaddress.ip_interface(cidr)
    return any(ipaddress.ip_interface(a) == want
               for a in dumps.addresses(ipr, index, replies=replies))


def enable_forwarding(version: int) -> None:
    """ip_forward / IPv6 forwarding on (host namespace), only written when it is off."""
    key = "net/ipv4/ip_forward" if version == 4 else "net/ipv6/conf/all/forwarding"
    if sysctl.read(key) != "1":
        sysctl.write(key, 1)
