"""pyroute2's first use of each request kind, paid once in the daemon before it forks.

pyroute2 builds a message class's encoder and decoder on their first use (the NLA maps of a link
kind, tc's options, conntrack's tuples): a veth add costs ~3.5 ms the first time in a process
and ~0.9 ms after. encode_requests() makes every request a verb sends into an IPBatch, which
encodes them into a buffer and sends nothing; read_replies() reads, in the caller's namespace,
the kinds of reply the verbs parse. The daemon's children are forked with all of it ready.
"""

from __future__ import annotations

import socket

# Placeholders: nothing here is sent, only encoded.
_INDEX = 1
_MAC = "02:00:00:00:00:01"


def encode_requests() -> None:
    """Every kind of request of links, veth, bridge, addrs, routes, ifb and tc, encoded once."""
    from pyroute2 import IPBatch

    from cni.host import tc

    batch = IPBatch()
    try:
        batch.link("add", ifname="pycniwarm0", kind="veth", txqlen=0, state="up", mtu=1500,
                   peer={"ifname": "eth0", "net_ns_fd": 0, "mtu": 1500, "address": _MAC})
        batch.link("add", ifname="pycniwarm1", kind="bridge", mtu=1500, br_vlan_filtering=1)
        batch.link("add", ifname="pycniwarm2", kind="ifb", mtu=1500, txqlen=0)
        batch.link("set", index=_INDEX, ifalias="pycni warm up", state="up")
        batch.link("set", index=_INDEX, master=_INDEX)
        batch.link("set", index=_INDEX, address=_MAC)
        batch.link("set", index=_INDEX, flags=0x100, change=0x100)
        batch.link("del", index=_INDEX)
        batch.brport("set", index=_INDEX, mode=0, isolated=0)
        batch.vlan_filter("add", index=_INDEX, vlan_info={"vid": 2, "flags": 6})
        batch.vlan_filter("del", index=_INDEX, vlan_info={"vid": 2})
        for address, brd in (("192.0.2.1", "192.0.2.255"), ("2001:db8::1", None)):
            extra = {"broadcast": brd} if brd else {"flags": 2}
            batch.addr("add", index=_INDEX, address=address, prefixlen=24, **extra)
            batch.addr("del", index=_INDEX, address=address, prefixlen=24)
        for family, dst, gateway in ((socket.AF_INET, "198.51.100.0", "192.0.2.2"),
                                     (socket.AF_INET6, "2001:db8:1::", "2001:db8::2")):
            batch.route("append", family=family, dst=dst, dst_len=24, oif=_INDEX,
                        gateway=gateway, proto=3, table=254, priority=1,
                        metrics={"mtu": 1400, "advmss": 1360})
        batch.route("get", dst="192.0.2.2")
        batch.tc("add", "ingress", _INDEX, tc.INGRESS_HANDLE)
        batch.tc("add-filter", "u32", _INDEX, parent=tc.INGRESS_HANDLE, prio=1,
                 protocol=tc.ETH_P_ALL, target=tc.REDIRECT_CLASSID, keys=["0x0/0x0+0"],
                 action={"kind": "mirred", "direction": "egress", "action": "redirect",
                         "ifindex": _INDEX})
        batch.tc("del", index=_INDEX, handle=tc.TBF_HANDLE, parent=tc.TC_H_ROOT)
    finally:
        batch.close()
    _encode_tbf()
    _encode_conntrack()


def _encode_tbf() -> None:
    from cni.host import tc

    msg = tc.tbf_message()()
    msg["index"], msg["handle"], msg["parent"] = _INDEX, tc.TBF_HANDLE, tc.TC_H_ROOT
    parms = {"rate_cell_log": 3, "rate_cell_align": -1, "rate": 1, "peak": 0, "limit": 1,
             "buffer": 1, "mtu": 0}
    msg["attrs"] = [["TCA_KIND", "tbf"],
                    ["TCA_OPTIONS", {"attrs": [["TCA_TBF_PARMS", parms],
                                               ["TCA_TBF_RATE64", 2**33]]}]]
    msg.encode()


def _encode_conntrack() -> None:
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg

    udp = NFCTAttrTuple(family=socket.AF_INET, proto=17, dport=53)
    nfct_msg.create_from(tuple_orig=udp, zone=1).encode()


def read_replies() -> None:
    """The replies the verbs parse, read once (read-only) in the caller's namespace: a link, a
    route, the qdiscs and filters of lo, alone and in one send (dumps.together)."""
    from cni.host import dumps, links, netns, routes, tc

    with netns.iproute() as ipr:
        lo = links.get(ipr, "lo")
        if lo is None:
            return
        routes.oif_toward(ipr, "127.0.0.1")
        tc.read_tbf(ipr, lo.index)
        tc.redirect_targets(ipr, lo.index)
        dumps.together(ipr, [links.get_request(index=lo.index), tc.root_request(ipr, lo.index),
                             tc.filters_request(lo.index)])
