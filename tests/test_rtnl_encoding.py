"""bridge's, bandwidth's and portmap's link, address and route requests are built with
cni/host/rtnl.py: byte for byte the messages pyroute2 sent for the same calls (pyroute2 is the
oracle here), and the kernel takes them with the same result."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest
from netlink_spy import spied, without_ids
from pyroute2.netlink.exceptions import NetlinkError

from cni.host import links, rtnl

pytestmark = pytest.mark.root


def _send(ipr, request: rtnl.Request) -> list[tuple[int, bytes]]:
    return ipr.request_raw(*request)


def _index(ipr, name: str) -> int:
    return links.get(ipr, name).index


@pytest.mark.parametrize("mtu, vlan_filtering", [(0, False), (1400, True)])
def test_bridge_add(host, mtu, vlan_filtering) -> None:
    kw = {"ifname": "rtbr0", "kind": "bridge"}
    if mtu:
        kw["mtu"] = mtu
    if vlan_filtering:
        kw["br_vlan_filtering"] = 1
    states, errors = [], []
    for side in ("theirs", "ours"):
        with spied(host.path) as (ipr, sent):
            try:
                if side == "theirs":
                    ipr.link("add", **kw)
                else:
                    _send(ipr, rtnl.link_add_bridge("rtbr0", mtu, vlan_filtering))
                errors.append(None)
            except NetlinkError as e:  # EOPNOTSUPP: a kernel without bridge VLAN filtering
                errors.append(e.code)
            states.append(without_ids(sent))
        if errors[-1] is not None:
            assert "rtbr0" not in host.links()
            continue
        link = host.links()["rtbr0"]
        assert link["linkinfo"]["info_kind"] == "bridge"
        assert link["linkinfo"]["info_data"]["vlan_filtering"] == int(vlan_filtering)
        assert link["mtu"] == (mtu or 1500)
        host.run("ip", "link", "del", "rtbr0")
    assert states[0] == states[1] and errors[0] == errors[1]


@pytest.mark.parametrize("mtu, mac", [(0, ""), (1400, "02:aa:bb:cc:dd:0e")])
def test_veth_add(host, netns_factory, mtu, mac) -> None:
    pod = netns_factory("pycni-pod")
    fd = os.open(pod.path, os.O_RDONLY)
    sent_by = []
    try:
        for side in ("theirs", "ours"):
            with spied(host.path) as (ipr, sent):
                if side == "theirs":
                    peer: dict = {"ifname": "eth0", "net_ns_fd": fd, "txqlen": 0}
                    if mac:
                        peer["address"] = mac
                    if mtu:
                        peer["mtu"] = mtu
                    ipr.link("add", ifname="rtv0", kind="veth", peer=peer, txqlen=0,
                             **({"mtu": mtu} if mtu else {}))
                else:
                    _send(ipr, rtnl.link_add_veth("rtv0", "eth0", fd, mtu, mac))
                sent_by.append(without_ids(sent))
            here, there = host.links()["rtv0"], pod.links()["eth0"]
            assert here["linkinfo"]["info_kind"] == there["linkinfo"]["info_kind"] == "veth"
            assert here.get("txqlen", 0) == there.get("txqlen", 0) == 0
            assert here["mtu"] == there["mtu"] == (mtu or 1500)
            if mac:
                assert there["address"] == mac
            host.run("ip", "link", "del", "rtv0")
    finally:
        os.close(fd)
    assert sent_by[0] == sent_by[1]


def _port_setup(host) -> None:
    host.run("ip", "link", "add", "rtbr0", "type", "bridge")
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")


def test_link_sets(host) -> None:
    """up, promisc, master, MAC, hairpin, isolated: what links.py and bridge.py send."""
    _port_setup(host)
    with spied(host.path) as (ipr, sent):
        port, br = _index(ipr, "rtv0"), _index(ipr, "rtbr0")
        mac = "02:00:00:00:aa:01"
        theirs = [lambda: ipr.link("set", index=port, state="up"),
                  lambda: ipr.link("set", index=br, flags=links.IFF_PROMISC,
                                   change=links.IFF_PROMISC),
                  lambda: ipr.link("set", index=port, master=br),
                  lambda: ipr.link("set", index=br, address=mac),
                  lambda: ipr.brport("set", index=port, mode=1),
                  lambda: ipr.brport("set", index=port, isolated=1)]
        ours = [rtnl.link_set_flags(port, rtnl.IFF_UP, rtnl.IFF_UP),
                rtnl.link_set_flags(br, rtnl.IFF_PROMISC, rtnl.IFF_PROMISC),
                rtnl.link_set_master(port, br),
                rtnl.link_set_mac(br, mac),
                rtnl.brport_set(port, rtnl.IFLA_BRPORT_MODE, 1),
                rtnl.brport_set(port, rtnl.IFLA_BRPORT_ISOLATED, 1)]
        for call, request in zip(theirs, ours, strict=True):
            del sent[:]
            call()
            oracle = without_ids(sent)
            del sent[:]
            _send(ipr, request)
            assert without_ids(sent) == oracle
    links_now = host.links()
    link = links_now["rtv0"]
    assert "UP" in link["flags"] and link["master"] == "rtbr0"
    assert link["linkinfo"]["info_slave_data"]["hairpin"] is True
    assert link["linkinfo"]["info_slave_data"]["isolated"] is True
    assert "PROMISC" in links_now["rtbr0"]["flags"] and links_now["rtbr0"]["address"] == mac


def test_link_del(host) -> None:
    for side in ("theirs", "ours"):
        host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
        with spied(host.path) as (ipr, sent):
            index = _index(ipr, "rtv0")
            if side == "theirs":
                ipr.link("del", index=index)
                oracle = without_ids(sent, (rtnl.RTM_DELLINK,))
            else:
                _send(ipr, rtnl.link_del(index))
                got = without_ids(sent, (rtnl.RTM_DELLINK,))
        assert "rtv0" not in host.links()
    index_bytes = index.to_bytes(4, "little")
    assert got == [oracle[0][:12] + index_bytes + oracle[0][16:]]  # a new veth, a new index


def test_bridge_vlans(host) -> None:
    """VLANs on a bridge port: pyroute2's vlan_filter and get_vlans against rtnl.py's, sent
    through the same socket (a kernel without bridge VLAN filtering refuses the adds alike; the
    guest kernel of `make vm-test` takes them: test_bridge.py's VLAN tests)."""
    host.run("ip", "link", "add", "rtbr0", "type", "bridge")
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
    host.run("ip", "link", "set", "rtv0", "master", "rtbr0")
    sides = {}
    for side in ("theirs", "ours"):
        with spied(host.path) as (ipr, sent):
            index, errors = _index(ipr, "rtv0"), []
            for command, vid, flags in (("add", 10, 6), ("add", 20, 0), ("del", 1, 0)):
                try:
                    _vlan(ipr, side, command, index, vid, flags)
                    errors.append(None)
                except NetlinkError as e:
                    errors.append(e.code)
            found = (list(ipr.get_vlans(index=index)) if side == "theirs"
                     else rtnl.bridge_vlans_of(_send(ipr, rtnl.bridge_vlans_dump()), index))
            sides[side] = (without_ids(sent), errors, found)
    assert sides["ours"][0] == sides["theirs"][0] and len(sides["ours"][0]) == 5  # + the lookup
    assert sides["ours"][1] == sides["theirs"][1]
    theirs_vlans = [(info["flags"], info["vid"]) for msg in sides["theirs"][2]
                    if msg["index"] == index and msg.get("IFLA_AF_SPEC") is not None
                    for info in msg.get("IFLA_AF_SPEC").get_attrs("IFLA_BRIDGE_VLAN_INFO")]
    assert sides["ours"][2] == theirs_vlans


def _vlan(ipr, side: str, command: str, index: int, vid: int, flags: int) -> None:
    if side == "theirs":
        ipr.vlan_filter(command, index=index, vlan_info={"vid": vid, "flags": flags})
    elif command == "add":
        _send(ipr, rtnl.bridge_vlan_add(index, vid, flags))
    else:
        _send(ipr, rtnl.bridge_vlan_del(index, vid))


def test_bridge_vlans_of_reads_what_pyroute2_encodes() -> None:
    """The dump reader on a message pyroute2 encodes (this host's kernel reports no VLANs)."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    msg = ifinfmsg()
    msg["family"], msg["index"] = rtnl.AF_BRIDGE, 7
    msg["attrs"] = [["IFLA_AF_SPEC", {"attrs": [
        ["IFLA_BRIDGE_VLAN_INFO", {"flags": 6, "vid": 10}],
        ["IFLA_BRIDGE_VLAN_INFO", {"flags": 0, "vid": 20}]]}]]
    msg.encode()
    payload = bytes(msg.data[16:msg["header"]["length"]])
    other = payload[:4] + (8).to_bytes(4, "little") + payload[8:]
    replies = [(rtnl.RTM_NEWLINK, other), (rtnl.RTM_NEWLINK, payload)]
    assert rtnl.bridge_vlans_of(replies, 7) == [(6, 10), (0, 20)]
    assert rtnl.bridge_vlans_of(replies, 9) == []


def _iface(cidr: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface(cidr)


@pytest.mark.parametrize("cidr, broadcast, flags", [
    ("10.1.0.2/24", "10.1.0.255", 0), ("10.1.0.3/32", None, 0),
    ("fd00::2/64", None, 0x02), ("fd00::3/64", None, 0)])
def test_addresses(host, cidr, broadcast, flags) -> None:
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
    iface = _iface(cidr)
    kw: dict = {"address": str(iface.ip), "prefixlen": iface.network.prefixlen}
    if broadcast:
        kw["broadcast"] = broadcast
    if flags:
        kw["flags"] = flags
    sent_by, shown = [], []
    for side in ("theirs", "ours"):
        with spied(host.path) as (ipr, sent):
            index = _index(ipr, "rtv0")
            if side == "theirs":
                ipr.addr("add", index=index, **kw)
            else:
                _send(ipr, rtnl.addr_add(index, iface, broadcast and
                                         ipaddress.IPv4Address(broadcast), flags))
            shown.append(host.ip("addr", "show", "dev", "rtv0")[0]["addr_info"])
            if side == "ours":
                family = socket.AF_INET if iface.version == 4 else socket.AF_INET6
                mine = ipr.raw.address_entries(index, family)
                pyroute2s = [(m.get("IFA_ADDRESS"), m["prefixlen"],
                              m.get("IFA_FLAGS") or m["flags"])
                             for m in ipr.get_addr(family=family, index=index)]
                assert mine == pyroute2s and (str(iface.ip), iface.network.prefixlen) in \
                    [m[:2] for m in mine]
            if side == "theirs":
                ipr.addr("del", index=index, address=str(iface.ip),
                         prefixlen=iface.network.prefixlen)
            else:
                _send(ipr, rtnl.addr_del(index, iface))
            sent_by.append(without_ids(sent, (rtnl.RTM_NEWADDR, rtnl.RTM_DELADDR)))
        assert cidr not in host.addresses("rtv0")
    assert sent_by[0] == sent_by[1]
    assert shown[0] == shown[1]


ORDER = ("dst", "dst_len", "family", "oif", "proto", "gateway", "metrics", "priority", "table",
         "scope")
ROUTES = [  # routes.add's pyroute2 spec, and ours
    ({"dst_len": 0, "family": socket.AF_INET, "gateway": "10.1.0.1"},
     ("0.0.0.0/0", "10.1.0.1", {}, 0, None, 0)),
    ({"dst": "10.2.0.0", "dst_len": 16, "family": socket.AF_INET, "gateway": "10.1.0.1",
      "metrics": {"RTAX_MTU": 1400, "RTAX_ADVMSS": 1300}, "priority": 5, "table": 100},
     ("10.2.0.0/16", "10.1.0.1", {rtnl.RTAX_MTU: 1400, rtnl.RTAX_ADVMSS: 1300}, 5, 100, 0)),
    ({"dst": "10.3.0.0", "dst_len": 16, "family": socket.AF_INET, "table": 1000,
      "scope": 253}, ("10.3.0.0/16", None, {}, 0, 1000, 253)),
    ({"dst": "10.4.0.0", "dst_len": 16, "family": socket.AF_INET, "table": 255,
      "metrics": {"RTAX_ADVMSS": 1300}}, ("10.4.0.0/16", None, {rtnl.RTAX_ADVMSS: 1300}, 0,
                                          255, 0)),
    ({"dst": "10.5.0.0", "dst_len": 16, "family": socket.AF_INET, "table": 0},
     ("10.5.0.0/16", None, {}, 0, 0, 0)),
    ({"dst_len": 0, "family": socket.AF_INET6, "gateway": "fd00::1",
      "metrics": {"RTAX_MTU": 1400}}, ("::/0", "fd00::1", {rtnl.RTAX_MTU: 1400}, 0, None, 0)),
    ({"dst": "fd01::", "dst_len": 64, "family": socket.AF_INET6, "table": 256},
     ("fd01::/64", None, {}, 0, 256, 0)),
]


@pytest.mark.parametrize("spec, ours", ROUTES)
def test_route_append(host, spec, ours) -> None:
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
    host.run("ip", "link", "set", "rtv0", "up")
    host.run("ip", "addr", "add", "10.1.0.2/24", "dev", "rtv0")
    host.run("ip", "addr", "add", "fd00::2/64", "dev", "rtv0", "nodad")
    dst, gw, metrics, priority, table, scope = ours
    family = "-4" if spec["family"] == socket.AF_INET else "-6"
    sent_by, shown = [], []
    for side in ("theirs", "ours"):
        with spied(host.path) as (ipr, sent):
            index = _index(ipr, "rtv0")
            full = {**spec, "oif": index, "proto": 3}
            full = {k: full[k] for k in ORDER if k in full}  # routes.add's order: pyroute2's
            if side == "theirs":
                ipr.route("append", **full)
            else:
                _send(ipr, rtnl.route_append(
                    ipaddress.ip_network(dst), index, gw and ipaddress.ip_address(gw),
                    proto=3, metrics=metrics, priority=priority, table=table, scope=scope))
            sent_by.append(without_ids(sent, (rtnl.RTM_NEWROUTE,)))
            shown.append([r for r in host.ip(family, "-d", "route", "show", "table", "all")
                          if r.get("protocol") == "boot"])
            assert len(shown[-1]) == 1
            ipr.route("del", **full)
    assert sent_by[0] == sent_by[1]
    assert shown[0] == shown[1]


@pytest.mark.parametrize("address", ["10.1.0.9", "fd00::9"])
def test_route_get(host, address) -> None:
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
    host.run("ip", "link", "set", "rtv0", "up")
    host.run("ip", "addr", "add", "10.1.0.2/24", "dev", "rtv0")
    host.run("ip", "addr", "add", "fd00::2/64", "dev", "rtv0", "nodad")
    with spied(host.path) as (ipr, sent):
        theirs = ipr.route("get", dst=address)[0].get_attr("RTA_OIF")
        oracle = without_ids(sent, (rtnl.RTM_GETROUTE,))
        del sent[:]
        ours = rtnl.route_oif(_send(ipr, rtnl.route_get(ipaddress.ip_address(address))))
        assert without_ids(sent, (rtnl.RTM_GETROUTE,)) == oracle
        assert ours == theirs == _index(ipr, "rtv0")


@pytest.mark.parametrize("bad", [
    lambda: rtnl.link_add_bridge("x" * 16), lambda: rtnl.link_add_bridge(""),
    lambda: rtnl.link_add_bridge("a\0b"),
    lambda: rtnl.link_set_mac(1, "02:00:00:00:00"), lambda: rtnl.link_set_mac(1, "zz:" * 5 + "00"),
    lambda: rtnl.route_append(ipaddress.ip_network("10.0.0.0/8"), 1,
                              ipaddress.ip_address("fd00::1"), proto=3)])
def test_refuses_what_it_cannot_encode(bad) -> None:
    with pytest.raises(ValueError):
        bad()


def test_marked_ifbs_as_pyroute2_read_them(host) -> None:
    """ifb.marked (bandwidth's GC) reads the link dump with rtnl.py: the same ifbs, names,
    indexes and MACs as pyroute2's get_links gave."""
    from cni.host import ifb

    host.run("ip", "link", "add", "rtifb9", "type", "ifb")  # no mark: never ours
    host.run("ip", "link", "add", "rtv0", "type", "veth", "peer", "name", "rtv1")
    host.run("ip", "link", "set", "rtv0", "alias", ifb.alias_for("net", "cid0"))  # not an ifb
    with spied(host.path) as (ipr, _):
        made = [ifb.create(ipr, f"rtifb{i}", 1500, "net", f"cid{i}") for i in range(2)]
        theirs = []
        for link in ipr.get_links():
            info = link.get_attr("IFLA_LINKINFO")
            parts = (link.get_attr("IFLA_IFALIAS") or "").split(" ")
            if info is not None and info.get_attr("IFLA_INFO_KIND") == "ifb" and \
                    len(parts) == 3 and parts[0] == ifb.MARK:
                theirs.append(ifb.Ifb(link.get_attr("IFLA_IFNAME"), link["index"],
                                      link.get_attr("IFLA_ADDRESS"), parts[1], parts[2]))
        assert ifb.marked(ipr) == theirs == made
