"""bandwidth's tc and ifb writes are built with cni/host/rtnl.py: byte for byte the messages
pyroute2 sent for the same calls (pyroute2 is the oracle here), and the kernel takes them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from netlink_spy import HEADER as _HEADER
from netlink_spy import spied

from cni.host import ifb, links, netns, tc

pytestmark = pytest.mark.root


def changes(sent: list[bytes]) -> list[bytes]:
    """The requests that change something (RTM_NEW*), without seq and port id."""
    return [m[:8] + m[_HEADER:] for m in sent if int.from_bytes(m[4:6], "little") in (16, 36, 44)]


def both(host, ours: Callable, theirs: Callable, undo: Callable) -> None:
    with spied(host.path) as (ipr, sent):
        theirs(ipr)
        oracle = changes(sent)
        undo(ipr)
    with spied(host.path) as (ipr, sent):
        ours(ipr)
        assert changes(sent) == oracle


def _veth(host) -> int:
    host.run("ip", "link", "add", "tcv0", "type", "veth", "peer", "name", "tcv1")
    with netns.iproute(host.path) as ipr:
        return links.get(ipr, "tcv0").index


def _tbf_msg_class() -> type:
    """pyroute2's tcmsg with tbf options that know TCA_TBF_RATE64: the oracle's encoder (tc.py
    used it before it wrote tbf with rtnl.py)."""
    global _TBF_MSG
    if _TBF_MSG is not None:
        return _TBF_MSG
    from pyroute2.netlink import nla
    from pyroute2.netlink.rtnl.tcmsg import sched_tbf, tcmsg

    class tbf_options(nla):
        nla_map = (
            ("TCA_TBF_UNSPEC", "none"),
            ("TCA_TBF_PARMS", "tbf_parms"),
            ("TCA_TBF_RTAB", "hex"),
            ("TCA_TBF_PTAB", "hex"),
            ("TCA_TBF_RATE64", "uint64"),
            ("TCA_TBF_PRATE64", "uint64"),
            ("TCA_TBF_BURST", "uint32"),
            ("TCA_TBF_PBURST", "uint32"),
            ("TCA_TBF_PAD", "hex"),
        )
        tbf_parms = sched_tbf.options.tbf_parms

    class tbfmsg(tcmsg):
        @staticmethod
        def get_options(self, *argv, **kwarg):
            if self.get_attr("TCA_KIND") == "tbf":
                return tbf_options
            return tcmsg.get_options(self, *argv, **kwarg)

    _TBF_MSG = tbfmsg
    return tbfmsg


_TBF_MSG: type | None = None


def _pyroute2_tbf(ipr, index: int, t: tc.Tbf) -> None:
    """What tc.add_tbf sent through pyroute2 before it used rtnl.py."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    msg = _tbf_msg_class()()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, 0x10000, 0xFFFFFFFF
    parms = {"rate": t.rate & tc.U32_MAX, "peak": 0, "limit": t.limit, "buffer": t.buffer,
             "mtu": 0}
    options = [["TCA_TBF_PARMS", parms]]
    if t.rate > tc.U32_MAX:
        options.append(["TCA_TBF_RATE64", t.rate])
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": options}]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    ipr.nlm_request_batch([msg])


@pytest.mark.parametrize("t", [tc.Tbf(rate=12_500_000, limit=437_500, buffer=156_250),
                               tc.Tbf(rate=10 * 2**32, limit=1_073_866_824, buffer=31),
                               tc.Tbf(rate=1, limit=1, buffer=2**32 - 1)])
def test_tbf(host, t) -> None:
    index = _veth(host)
    both(host, lambda ipr: tc.add_tbf(ipr, index, t), lambda ipr: _pyroute2_tbf(ipr, index, t),
         lambda ipr: tc.delete_root(ipr, index))
    with netns.iproute(host.path) as ipr:
        assert tc.read_tbf(ipr, index) == t


def test_ingress_and_redirect(host) -> None:
    index = _veth(host)
    with netns.iproute(host.path) as ipr:
        target = links.get(ipr, "tcv1").index

    def theirs(ipr) -> None:
        ipr.tc("add", "ingress", index, tc.INGRESS_HANDLE)
        ipr.tc("add-filter", "u32", index, parent=tc.INGRESS_HANDLE, prio=1,
               protocol=tc.ETH_P_ALL, target=tc.REDIRECT_CLASSID, keys=["0x0/0x0+0"],
               action={"kind": "mirred", "direction": "egress", "action": "redirect",
                       "ifindex": target})

    def ours(ipr) -> None:
        tc.add_ingress(ipr, index)
        tc.add_redirect(ipr, index, target)

    both(host, ours, theirs, lambda ipr: tc.delete_ingress(ipr, index))
    with netns.iproute(host.path) as ipr:
        assert tc.redirect_targets(ipr, index) == [target]
        assert tc.ingress_is_for(ipr, index, target)


def test_ifb_create(host) -> None:
    alias = ifb.alias_for("net", "cid")

    def theirs(ipr) -> None:
        ipr.link("add", ifname="tcifb", kind="ifb", mtu=1400, txqlen=0)
        index = links.get(ipr, "tcifb").index
        ipr.link("set", index=index, ifalias=alias, state="up")

    with spied(host.path) as (ipr, sent):
        theirs(ipr)
        oracle = changes(sent)
        ifb.delete(ipr, "tcifb")
    with spied(host.path) as (ipr, sent):
        dev = ifb.create(ipr, "tcifb", 1400, "net", "cid")
        ours = changes(sent)
    assert ours[0] == oracle[0]  # the ifindex of the second differs: a new link
    index = (dev.index).to_bytes(4, "little")
    assert ours[1] == oracle[1][:12] + index + oracle[1][16:]
    link = host.links()["tcifb"]
    assert link["ifalias"] == alias and link["mtu"] == 1400 and link.get("txqlen", 0) == 0
    assert "UP" in link["flags"]


def test_deletes(host) -> None:
    """Root tbf, ingress qdisc and ifb removal; a second removal finds nothing and is fine."""
    index = _veth(host)

    def setup(ipr) -> int:
        tc.add_tbf(ipr, index, tc.Tbf(rate=12_500_000, limit=437_500, buffer=156_250))
        tc.add_ingress(ipr, index)
        return ifb.create(ipr, "tcifb", 1500, "net", "cid").index

    def deletes(sent: list[bytes]) -> list[bytes]:  # RTM_DELQDISC (the ifb's RTM_DELLINK goes
        # out on linkgone's own socket; its bytes: test_rtnl_encoding.test_link_del)
        return [m[:8] + m[_HEADER:] for m in sent if int.from_bytes(m[4:6], "little") == 37]

    with spied(host.path) as (ipr, sent):
        dev = setup(ipr)
        ipr.tc("del", index=index, handle=tc.TBF_HANDLE, parent=tc.TC_H_ROOT)
        ipr.tc("del", "ingress", index, tc.INGRESS_HANDLE, parent=tc.TC_H_INGRESS)
        ipr.link("del", index=dev)
        oracle = deletes(sent)
    with spied(host.path) as (ipr, sent):
        dev = setup(ipr)
        tc.delete_root(ipr, index)
        tc.delete_ingress(ipr, index)
        assert ifb.delete(ipr, "tcifb", dev)
        ours = deletes(sent)
        tc.delete_root(ipr, index)  # the default root qdisc: ENOENT, ignored
        tc.delete_ingress(ipr, index)
        assert not ifb.delete(ipr, "tcifb", dev)
    assert len(ours) == 2 and ours == oracle
    with netns.iproute(host.path) as ipr:
        assert tc.root_kind(ipr, index) != "tbf" and not tc.has_ingress(ipr, index)
    assert "tcifb" not in host.links()
