"""The requests host/ builds as pyroute2 message objects (links, addrs, routes, veth: cheaper
than IPRoute's methods, whose request filters cost 25-100 us a request) are the bytes pyroute2's
own methods send for the same call. Compared with pyroute2's IPBatch, which encodes a method
call without sending it: a pyroute2 release that changes what its methods send shows here.
No root: nothing is sent."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cni.host import addrs, bridge, dumps, links, routes, veth

MAC = "02:00:00:00:00:07"


class Recorder:
    """An IPRoute stand-in for dumps.request: keeps the messages it is handed, answers none."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def nlm_request_batch(self, msgs: Any, noraise: bool = False) -> list[Any]:
        self.sent.extend(msgs)
        return []


def _unnumbered(data: bytes) -> bytes:
    """One message's bytes without its header's sequence number and port id."""
    return bytes(data[:8]) + bytes(8) + bytes(data[16:])


@pytest.fixture(scope="module")
def batch() -> Iterator[Any]:
    from pyroute2 import IPBatch

    ipb = IPBatch()
    # As netns.new_socket's sockets: pyroute2 then leaves a route's table to RTA_TABLE alone.
    ipb.status["strict_check"] = True
    yield ipb
    ipb.close()


def ours(call: Callable[[Recorder], object]) -> list[bytes]:
    rec = Recorder()
    call(rec)
    found = []
    for msg in rec.sent:
        msg.encode()
        found.append(_unnumbered(msg.data))
    return found


def pyroute2s(batch: Any, method: str, *args: Any, **kwargs: Any) -> list[bytes]:
    batch.reset()
    getattr(batch, method)(*args, **kwargs)
    return [_unnumbered(batch.batch)]


LINK_CASES = [
    (lambda r: links.set_up(r, 7), ("link", "set"), {"index": 7, "state": "up"}),
    (lambda r: links.set_promisc(r, 7), ("link", "set"), {"index": 7, "flags": 0x100,
                                                          "change": 0x100}),
    (lambda r: links.set_flag(r, 7, links.IFF_ALLMULTI, True), ("link", "set"),
     {"index": 7, "flags": 0x200, "change": 0x200}),
    (lambda r: links.set_flag(r, 7, links.IFF_ALLMULTI, False), ("link", "set"),
     {"index": 7, "flags": 0, "change": 0x200}),
    (lambda r: links.set_mac(r, 7, MAC), ("link", "set"), {"index": 7, "address": MAC}),
    (lambda r: links.set_mtu(r, 7, 1400), ("link", "set"), {"index": 7, "mtu": 1400}),
    (lambda r: links.set_txqlen(r, 7, 0), ("link", "set"), {"index": 7, "txqlen": 0}),
    (lambda r: links.set_master(r, 7, 3), ("link", "set"), {"index": 7, "master": 3}),
    (lambda r: links.set_master(r, 7, 0), ("link", "set"), {"index": 7, "master": 0}),
    (lambda r: links.remove(r, 7), ("link", "del"), {"index": 7}),
    (lambda r: links._set(r, ifname="lo", flags=links.IFF_UP, change=links.IFF_UP),
     ("link", "set"), {"ifname": "lo", "state": "up"}),
    (lambda r: links._set(r, ifname="lo", flags=0, change=links.IFF_UP),
     ("link", "set"), {"ifname": "lo", "state": "down"}),
    (lambda r: links._reply(r, ifname="eth0"), ("link", "get"), {"ifname": "eth0"}),
    (lambda r: links._reply(r, index=7), ("link", "get"), {"index": 7}),
]


@pytest.mark.parametrize(("call", "method", "kwargs"), LINK_CASES)
def test_link_requests_are_pyroute2s(batch: Any, call: Any, method: tuple[str, str],
                                     kwargs: dict) -> None:
    assert ours(call) == pyroute2s(batch, method[0], method[1], **kwargs)


@pytest.mark.parametrize("cidr", ["10.1.0.1/24", "10.2.0.1/31", "10.3.0.1/32",
                                  "2001:db8::1/64", "fe80::1/64"])
@pytest.mark.parametrize("flags", [0, addrs.IFA_F_NODAD])
def test_address_requests_are_pyroute2s(batch: Any, cidr: str, flags: int) -> None:
    iface = ipaddress.ip_interface(cidr)
    extra: dict = {}  # in the order addrs.add's callers used to pass them
    brd = addrs.broadcast(iface)
    if brd is not None:
        extra["broadcast"] = str(brd)
    if flags:
        extra["flags"] = flags
    spec = {"index": 7, "address": str(iface.ip), "prefixlen": iface.network.prefixlen}
    assert ours(lambda r: addrs.add(r, 7, iface, flags)) == pyroute2s(batch, "addr", "add",
                                                                       **spec, **extra)
    assert ours(lambda r: addrs.delete(r, 7, iface)) == pyroute2s(batch, "addr", "del", **spec)


@pytest.mark.parametrize(("dst", "gw"), [("10.9.0.0/16", "10.1.0.2"), ("0.0.0.0/0", "10.1.0.2"),
                                         ("10.8.0.0/24", None), ("::/0", "2001:db8::2"),
                                         ("2001:db8:9::/48", None)])
@pytest.mark.parametrize("extra", [{}, {"mtu": 1400, "advmss": 1360, "priority": 5},
                                   {"mtu": 1400, "table": 1000, "scope": 253},
                                   {"advmss": 1360, "table": 100}])
def test_route_requests_are_pyroute2s(batch: Any, dst: str, gw: str | None, extra: dict) -> None:
    net = ipaddress.ip_network(dst)
    spec: dict = {"family": 2 if net.version == 4 else 10, "dst_len": net.prefixlen, "oif": 7,
                  "proto": routes.RTPROT_BOOT, "table": extra.get("table", 254)}
    if net.prefixlen:
        spec["dst"] = str(net.network_address)
    if gw:
        spec["gateway"] = gw
    metrics = {k: extra[k] for k in ("mtu", "advmss") if k in extra}
    if metrics:
        spec["metrics"] = metrics
    for key in ("priority", "scope"):
        if key in extra:
            spec[key] = extra[key]
    assert ours(lambda r: routes.add(r, dst, 7, gw, **extra)) == pyroute2s(
        batch, "route", "append", **spec)


@pytest.mark.parametrize("address", ["10.1.0.5", "2001:db8::5", "0.0.0.0", "::"])
def test_route_reads_are_pyroute2s(batch: Any, address: str) -> None:
    assert ours(lambda r: routes.oif_toward(r, address)) == pyroute2s(batch, "route", "get",
                                                                       dst=address)
    family = 2 if ipaddress.ip_address(address).version == 4 else 10
    assert ours(lambda r: routes.find(r, address)) == pyroute2s(batch, "route", "dump",
                                                                family=family)


@pytest.mark.parametrize(("dst", "address"), [
    ("10.30.0.0/16", "10.30.0.0"), ("0.0.0.0/0", "0.0.0.1"), ("fd30::/64", "fd30::"),
    ("::/0", "::")])
def test_a_route_lookup_is_pyroute2s_fibmatch_get(batch: Any, dst: str, address: str) -> None:
    msg = routes.lookup_request(dst)
    assert msg is not None
    msg.encode()
    assert [_unnumbered(msg.data)] == pyroute2s(batch, "route", "get", dst=address,
                                                flags=routes.RTM_F_FIB_MATCH)
    assert routes.lookup_request("not a network") is None


@pytest.mark.parametrize("mtu", [0, 1400])
@pytest.mark.parametrize("mac", ["", MAC])
@pytest.mark.parametrize("master", [0, 3])
def test_the_veth_request_is_pyroute2s(batch: Any, mtu: int, mac: str, master: int) -> None:
    peer: dict = {"ifname": "eth0", "net_ns_fd": 5}
    if mac:
        peer["address"] = mac
    extra: dict = {"mtu": mtu} if mtu else {}
    if master:
        extra["master"] = master
    if mtu:
        peer["mtu"] = mtu
    assert ours(lambda r: veth._add(r, "veth0123abcd", "eth0", 5, mtu, mac, master)) == \
        pyroute2s(batch, "link", "add", ifname="veth0123abcd", txqlen=0, kind="veth",
                  peer=peer, state="up", **extra)


@pytest.mark.parametrize(("hairpin", "isolated"), [  # attach's: both, or one of them
    (h, i) for h in (None, False, True) for i in (None, False, True) if (h, i) != (None, None)])
def test_bridge_port_requests_are_pyroute2s(batch: Any, hairpin: bool | None,
                                            isolated: bool | None) -> None:
    flags: dict = {}  # as bridge.attach passed them to brport('set', ...)
    if hairpin is not None:
        flags["mode"] = int(hairpin)
    if isolated is not None:
        flags["isolated"] = int(isolated)
    assert ours(lambda r: dumps.request(r, bridge.port_request(7, hairpin, isolated))) == \
        pyroute2s(batch, "brport", "set", index=7, **flags)


@pytest.mark.parametrize("mtu", [0, 1400])
@pytest.mark.parametrize("vlan_filtering", [False, True])
def test_the_bridge_request_is_pyroute2s(batch: Any, mtu: int, vlan_filtering: bool) -> None:
    extra: dict = {"mtu": mtu} if mtu else {}  # as bridge._create passed them to link('add')
    if vlan_filtering:
        extra["br_vlan_filtering"] = 1
    assert ours(lambda r: dumps.request(r, bridge._create_request("cni0", mtu, vlan_filtering))) \
        == pyroute2s(batch, "link", "add", ifname="cni0", kind="bridge", **extra)


@pytest.mark.parametrize("vid", [1, 2, 4094])
@pytest.mark.parametrize("flags", [0, bridge.VLAN_PVID | bridge.VLAN_UNTAGGED])
def test_vlan_filter_requests_are_pyroute2s(batch: Any, vid: int, flags: int) -> None:
    info = {"vid": vid, "flags": flags} if flags else {"vid": vid}  # as set_vlans passed it
    assert ours(lambda r: dumps.request(r, bridge.vlan_request(True, 7, vid, flags))) == \
        pyroute2s(batch, "vlan_filter", "add", index=7, vlan_info=info)
    if not flags:
        assert ours(lambda r: dumps.request(r, bridge.vlan_request(False, 7, vid))) == \
            pyroute2s(batch, "vlan_filter", "del", index=7, vlan_info=info)
