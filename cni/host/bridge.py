"""Linux bridges and their ports, in the current (host) namespace.

Error messages follow the reference plugin's wording, so logs read the same after a swap.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from cni.host import dumps, links, sysctl, veth
from cni.host.errors import Busy, HostError

VLAN_PVID = 0x2
VLAN_UNTAGGED = 0x4
BR_STATE_FORWARDING = 3
HOST_NS = "/proc/thread-self/ns/net"  # both ends of a VLAN gateway veth stay here


def _err(msg: str) -> HostError:
    return HostError(msg)


def ensure(name: str, mtu: int = 0, promisc: bool = False,
           vlan_filtering: bool = False) -> tuple[links.Link, bool]:
    """Create the bridge unless it exists (an existing one is kept as it is), then
    promisc if asked, accept_ra=0 (we own its routes) and up. A non-bridge of that name is an
    error. The common case, a bridge that is there and up, costs one request (a lookup).
    Returns the bridge and whether this call created it."""
    from cni.host import netns

    with netns.iproute() as ipr:
        br = links.get(ipr, name)
        created = br is None
        if created:
            _create(ipr, name, mtu, vlan_filtering)
        br = by_name(ipr, name) if br is None or br.kind != "bridge" else br
        if promisc and not br.promisc:
            links.set_promisc(ipr, br.index)
        try:
            sysctl.write(sysctl.conf(6, name, "accept_ra"), 0)
        except OSError:
            pass  # no IPv6 on this host
        if not br.up:
            links.set_up(ipr, br.index)
        return br, created  # read before promisc/up: they change neither index, MAC nor MTU


def _create(ipr, name: str, mtu: int, vlan_filtering: bool) -> None:
    """ip link add NAME [mtu MTU] type bridge [vlan_filtering 1]; another's bridge made
    meanwhile (EEXIST) is fine."""
    from pyroute2 import NetlinkError

    try:
        dumps.request(ipr, _create_request(name, mtu, vlan_filtering))
    except NetlinkError as e:
        if e.code == errno.EOPNOTSUPP and vlan_filtering:
            raise _err(f"failed to create bridge {name!r}: could not add {name!r}: "
                       "vlan filtering is not supported by this kernel") from None
        if e.code != errno.EEXIST:
            raise _err(f"failed to create bridge {name!r}: could not add {name!r}: "
                       f"{e.args[1] if len(e.args) > 1 else e}") from None


def _create_request(name: str, mtu: int, vlan_filtering: bool):
    """pyroute2's ifinfmsg as link('add', ifname=name, kind='bridge'[, mtu=mtu]
    [, br_vlan_filtering=1]) builds it (its request filters cost ~0.1 ms): NLM_F_CREATE |
    NLM_F_EXCL, so a name that is taken is EEXIST."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    info: list[list] = [["IFLA_INFO_KIND", "bridge"]]
    if vlan_filtering:
        info.append(["IFLA_INFO_DATA", {"attrs": [["IFLA_BR_VLAN_FILTERING", 1]]}])
    attrs = (("IFLA_MTU", mtu),) if mtu else ()
    msg = links.message(RTM_NEWLINK, ifname=name,
                         attrs=(*attrs, ("IFLA_LINKINFO", {"attrs": info})))
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return msg


def by_name(ipr, name: str, replies: list | None = None) -> links.Link:
    """The bridge called `name`; `replies`: those of a links.get_request(ifname=name) sent in
    a dumps.together batch (see links.get)."""
    link = links.get(ipr, name, replies=replies)
    if link is None:
        raise _err(f'could not lookup "{name}": Link not found')
    if link.kind != "bridge":
        raise _err(f'"{name}" already exists but is not a bridge')
    return link


def lookup(name: str) -> links.Link:
    from cni.host import netns

    with netns.iproute() as ipr:
        return by_name(ipr, name)


def attach(port: str, bridge: links.Link, hairpin: bool, isolated: bool,
           index: int = 0, enslaved: bool = False) -> None:
    """Enslave `port` (its `index` if the caller has it: no lookup) to the bridge, unless it
    was made a port as it was created (`enslaved`), and set its hairpin and isolation flags."""
    from cni.host import netns

    with netns.iproute() as ipr:
        if not index:
            link = links.get(ipr, port)
            if link is None:
                raise _err(f'failed to lookup "{port}"')
            index = link.index
        try:
            if not enslaved:
                links.set_master(ipr, index, bridge.index)
        except Exception as e:
            raise _err(f'failed to connect "{port}" to bridge {bridge.name}: {e}') from None
        try:  # both flags in one request (IFLA_BRPORT_MODE is hairpin)
            dumps.request(ipr, port_request(index, hairpin=hairpin, isolated=isolated))
            return
        except Exception:
            pass  # one at a time, so that the error names the flag the kernel refused
        _port_flags_one_by_one(ipr, port, index, hairpin, isolated)


def _port_flags_one_by_one(ipr, port: str, index: int, hairpin: bool, isolated: bool) -> None:
    """attach's flags when the kernel refused them together: each alone, for the error that
    names the flag it refused."""
    try:
        dumps.request(ipr, port_request(index, hairpin=hairpin))
    except Exception as e:
        raise _err(f"failed to setup hairpin mode for {port}: {e}") from None
    try:
        dumps.request(ipr, port_request(index, isolated=isolated))
    except Exception as e:
        raise _err(f"failed to set isolated on {port}: {e}") from None


def attach_pinned(port: str, br: links.Link, hairpin: bool, isolated: bool, index: int) -> str:
    """attach(port, br, hairpin, isolated, index, enslaved=True), then the bridge's MAC pinned
    (_pin): -> the MAC. Under the bridge's pin lock (_pinning), its MAC is read once the port
    joined, then the port's flags and the pin go in one send (dumps.writes_redone), the flags
    first; each refused one is redone as attach and _pin do it, so the errors and their order
    are theirs. Should the flags be refused, the bridge was pinned all the same, to the MAC
    every ADD pins."""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    from cni.host import netns

    with netns.iproute() as ipr, _pinning(br.name):
        current = links.by_index(ipr, br.index)
        if current is None or not _unicast(current.mac):  # gone, or no MAC to set: as alone
            attach(port, br, hairpin, isolated, index, enslaved=True)
            return _pin(ipr, br)
        dumps.writes_redone(ipr, [
            (port_request(index, hairpin=hairpin, isolated=isolated),
             partial(_port_flags_one_by_one, ipr, port, index, hairpin, isolated)),
            (links.message(RTM_NEWLINK, br.index, attrs=(("IFLA_ADDRESS", current.mac),)),
             partial(_set_mac, ipr, br.index, current.mac))])
    return current.mac


def port_request(index: int, hairpin: bool | None = None, isolated: bool | None = None):
    """pyroute2's ifinfmsg as brport('set', index=index[, mode=int(hairpin)]
    [, isolated=int(isolated)]) builds it (a link('set', kind='bridge_slave', ...): its
    request filters cost ~0.1 ms): the port's IFLA_BRPORT_MODE (hairpin) and
    IFLA_BRPORT_ISOLATED, those given."""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    data = []
    if hairpin is not None:
        data.append(["IFLA_BRPORT_MODE", int(hairpin)])
    if isolated is not None:
        data.append(["IFLA_BRPORT_ISOLATED", int(isolated)])
    info = {"attrs": [["IFLA_INFO_KIND", "bridge_slave"],
                      ["IFLA_INFO_SLAVE_DATA", {"attrs": data}]]}
    return links.message(RTM_NEWLINK, index, attrs=(("IFLA_LINKINFO", info),))


def set_vlans(port: str, vlan: int, trunk: list[int], preserve_default: bool) -> None:
    """Access port (`vlan`: PVID, untagged) or trunk port (tagged `trunk` VLANs)."""
    from cni.host import netns

    if not vlan and not trunk:
        return  # nothing to set: skip the link lookup (the common, VLAN-less case)
    with netns.iproute() as ipr:
        link = links.get(ipr, port)
        if link is None:
            raise _err(f'failed to lookup "{port}"')
        if not preserve_default:
            for entry in port_vlans(ipr, link.index):
                try:
                    dumps.request(ipr, vlan_request(False, link.index, entry["vid"]))
                except Exception as e:
                    raise _err(f'failed to remove default vlan on interface "{port}": '
                               f"{e}") from None
        try:
            if vlan:
                dumps.request(ipr, vlan_request(True, link.index, vlan,
                                                VLAN_PVID | VLAN_UNTAGGED))
            for vid in trunk:
                dumps.request(ipr, vlan_request(True, link.index, vid))
        except Exception as e:
            raise _err(f'failed to setup vlan tag on interface "{port}": {e}') from None


def vlan_request(add: bool, index: int, vid: int, flags: int = 0):
    """pyroute2's ifinfmsg as vlan_filter('add' if add else 'del', index=index,
    vlan_info={'vid': vid[, 'flags': flags]}) builds it (its request filters cost ~0.1 ms):
    an AF_BRIDGE RTM_SETLINK / RTM_DELLINK with the port's IFLA_BRIDGE_VLAN_INFO."""
    from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_SETLINK

    msg = links.message(RTM_SETLINK if add else RTM_DELLINK, index, attrs=(
        ("IFLA_AF_SPEC", {"attrs": [["IFLA_BRIDGE_VLAN_INFO", {"flags": flags, "vid": vid}]]}),))
    msg["family"] = socket.AF_BRIDGE
    return msg


def port_vlans(ipr, index: int) -> list[dict]:
    """[{vid, pvid, untagged}] of one bridge port."""
    found = []
    for msg in ipr.get_vlans():  # AF_BRIDGE dump with RTEXT_FILTER_BRVLAN
        if msg["index"] != index:
            continue
        spec = msg.get_attr("IFLA_AF_SPEC")
        for info in spec.get_attrs("IFLA_BRIDGE_VLAN_INFO") if spec is not None else ():
            flags = info["flags"]
            found.append({"vid": info["vid"], "pvid": bool(flags & VLAN_PVID),
                          "untagged": bool(flags & VLAN_UNTAGGED)})
    return found


def _pin(ipr, br: links.Link) -> str:
    """Set the bridge's MAC to itself, once it has a port: otherwise it follows the lowest port
    MAC and changes as ports come and go (reference #805). Pinned while portless, the kernel
    leaves the bridge id at 0 and the bridge in operstate UNKNOWN, so call this after attach.
    Returns the MAC, which stays the bridge's from now on (a set address is never replaced).
    Under _pinning, as attach_pinned's own pin."""
    current = links.by_index(ipr, br.index)
    if current is None:
        raise _err(f'could not lookup "{br.name}": Link not found')
    _set_mac(ipr, br.index, current.mac)
    return current.mac


PIN_LOCK_DIR = "/run/pycni/bridge"  # root's (/run is): one lock file per bridge name
# How long an ADD waits for another's pin (a read and a set: ~1 ms; hundreds of ADDs at once on
# a small node wait their turns well within it): past it, error 11 and the ADD is undone
PIN_WAIT = 30.0


@contextmanager
def _pinning(name: str) -> Iterator[None]:
    """The bridge's pin lock (lockfile.take of PIN_LOCK_DIR/<name in hex>.lock), held while an
    ADD reads the MAC and pins it. ADDs at once on a bridge none has pinned yet (a node's first
    pods) would otherwise pin different addresses (one read before another's port lowered it,
    one after), the last one winning, and a pod's result would name a MAC its bridge no longer
    has (its CHECK fails): under the lock the first pins what it reads, and every later one
    reads that. Without a lock file (no writable /run), the pin goes on unlocked; held by
    another for PIN_WAIT, Busy (error 11) names the bridge and the lock."""
    from cni.host import lockfile

    path = f"{PIN_LOCK_DIR}/{name.encode().hex()}.lock"
    try:
        fd: int | None = lockfile.take(path, PIN_WAIT)
    except OSError:
        fd = None
    except Busy:
        raise Busy(f"bridge {name}: another ADD has held its MAC pin lock {path} for "
                   f"{PIN_WAIT:g}s; try again later") from None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _set_mac(ipr, index: int, mac: str) -> None:
    try:
        links.set_mac(ipr, index, mac)
    except Exception as e:
        raise _err(f"could not set bridge's mac: {e}") from None


def _unicast(mac: str) -> bool:
    """A MAC a link can be given: six bytes, not multicast, not all zero."""
    try:
        octets = bytes.fromhex(mac.replace(":", ""))
    except ValueError:
        return False
    return len(octets) == 6 and not octets[0] & 1 and any(octets)


def wait_forwarding(port: str, delays: tuple[float, ...] = (0, 0.05, 0.5, 1, 1),
                    read: list | None = None) -> links.Link:
    """Wait until the port is oper-up and forwarding, so traffic flows when ADD returns
    (reference #463). `read`: the replies to a links.get_request(ifname=port) sent in another
    send (dumps.together) after the pod's end went up: the port as they show it, when it is up
    and forwarding there (the usual case: no request of its own); else read as without them."""
    from cni.host import netns

    if read:
        link = links.from_message(read[0], port_state=True)
        if link.name == port and _forwarding(link):
            return link
    with netns.iproute() as ipr:
        link = None
        for delay in delays:
            time.sleep(delay)
            link = links.get(ipr, port, port_state=True)
            if link is None:
                raise _err(f"failed to lookup {port!r}")
            if _forwarding(link):
                return link
        raise _err(f"bridge port in error state: {link.operstate if link else 'missing'}")


def _forwarding(link: links.Link) -> bool:
    """Oper-up, and forwarding if it is a port (a port freed meanwhile forwards as any link)."""
    state = link.port_state if link.master else BR_STATE_FORWARDING
    return link.operstate == "UP" and state == BR_STATE_FORWARDING


def ensure_vlan_interface(bridge: links.Link, vlan: int,
                          preserve_default: bool) -> tuple[links.Link, bool]:
    """The gateway interface for a VLAN: a veth `<bridge>.<vlan>` in the host namespace whose
    peer is an access port of that VLAN on the bridge (the reference's layout). Returns it and
    whether it was created now."""
    from cni.host import netns

    name = f"{bridge.name}.{vlan}"
    with netns.iproute() as ipr:
        existing = links.get(ipr, name)
    if existing is not None:
        return existing, False
    pair = veth.create(HOST_NS, name, mtu=bridge.mtu)
    try:
        attach(pair.host.name, bridge, hairpin=False, isolated=False, index=pair.host.index)
        set_vlans(pair.host.name, vlan, [], preserve_default)
        with netns.iproute() as ipr:
            links.set_up(ipr, pair.container.index)
            return links.get(ipr, name) or pair.container, True
    except Exception:
        veth.delete_host_end(pair.host.name)
        raise
