"""bandwidth through the exec'd binary: kernel state, the reference's numbers, errors, DEL, GC.

Pods are wired with a plain veth pair to a throwaway host namespace and a handcrafted prevResult,
so these tests depend on no other plugin. Traffic under shaping is in test_bandwidth_traffic.py.
"""

from __future__ import annotations

import json
import platform

import pytest
from bandwidth_util import (
    conf,
    foreign_tbf,
    ifbs,
    kinds,
    qdiscs,
    redirect_targets,
    runtime_bw,
    tbf_of,
    wire,
)
from cnitest import REFERENCE_BIN, probe_binary

from cni.host import tc
from cni.plugins import shaped
from cni.plugins.bandwidth import CONTAINERD_NO_BURST, CRIO_NO_BURST, derived_burst, ifb_name

pytestmark = pytest.mark.root

MBIT = 1_000_000


def add(plugins, w, cfg, cid="ctr1", **kw):
    cfg = cfg | {"prevResult": w.prev_result(cfg["cniVersion"])}
    return plugins.ok("bandwidth", "ADD", cfg, container_id=cid, netns=w.pod.path, **kw)


def assert_untouched(host, w) -> None:
    """Nothing of ours on the host: default root qdisc, no ingress qdisc, no marked ifb."""
    assert kinds(host, w.veth) == ["noqueue"]
    assert not [n for n in ifbs(host) if n.startswith("bwp")]


def test_add_ingress_and_egress_builds_tbf_ifb_and_redirect(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    out = add(plugins, w, cfg)
    name = ifb_name("bwnet", "ctr1")
    link = host.links()[name]
    assert out["interfaces"][:2] == w.prev_result()["interfaces"]
    assert out["interfaces"][2] == {"name": name, "mac": link["address"]}
    assert out["ips"] == w.prev_result()["ips"]
    # ifb: up, the veth's MTU, txqueuelen 0, our mark naming network and container
    assert "UP" in link["flags"] and link["mtu"] == 1500 and link.get("txqlen", 0) == 0
    assert link["ifalias"] == "pycni-bandwidth bwnet ctr1"
    assert kinds(host, w.veth) == ["ingress", "tbf"]
    assert redirect_targets(host, w.veth) == [name]
    assert tbf_of(host, w.veth) == tc.tbf_for(10 * MBIT, 80_000)
    assert tbf_of(host, name) == tc.tbf_for(20 * MBIT, 160_000)
    # 25 ms of rate plus the burst, as the reference computes the limit
    assert tbf_of(host, w.veth).limit == 1_250_000 * 25 // 1000 + 10_000
    plugins.ok("bandwidth", "CHECK", cfg | {"prevResult": out}, netns=pod.path)


def test_ingress_only_creates_no_ifb(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    out = add(plugins, w, conf(ingressRate=MBIT, ingressBurst=8 * 1500 * 4))
    assert len(out["interfaces"]) == 2
    assert kinds(host, w.veth) == ["tbf"] and not ifbs(host).keys() & {ifb_name("bwnet", "ctr1")}


def test_top_level_keys_take_precedence_over_runtime_config(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(ingressRate=5 * MBIT, ingressBurst=40_000,
               **runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    add(plugins, w, cfg)
    assert tbf_of(host, w.veth) == tc.tbf_for(5 * MBIT, 40_000)
    assert kinds(host, w.veth) == ["tbf"]  # runtimeConfig's egress ignored as a whole


@pytest.mark.parametrize(("ingress", "egress"), [
    ((10 * MBIT, 80_000), (20 * MBIT, 160_000)),
    ((1000, 8 * 1600), (8000, 8 * 3000)),
    ((1_000 * MBIT, 4 * MBIT), (3 * MBIT, 8 * 1514)),
    ((100_000 * MBIT, 1_000 * MBIT), (40_000 * MBIT, 16 * MBIT)),  # above 2^32 B/s: rate64
    ((12_345_678, 987_654), (999_999, 12_345)),  # odd values: truncations must agree
])
def test_tbf_numbers_equal_the_reference(plugins, netns_factory, ingress, egress) -> None:
    """Differential: the same input through /usr/lib/cni/bandwidth and ours, read back."""
    theirs_host, ours_host = netns_factory("pycni-ref"), plugins.host
    theirs, ours = wire(theirs_host, netns_factory("pycni-pod"), 1), \
        wire(ours_host, netns_factory("pycni-pod"), 1)
    cfg = conf("1.0.0", **runtime_bw(ingress, egress))
    ref = type(plugins)(theirs_host)
    ref.ok("bandwidth", "ADD", cfg | {"prevResult": theirs.prev_result("1.0.0")},
           container_id="ctr1", netns=theirs.pod.path, bin_dir=REFERENCE_BIN)
    add(plugins, ours, cfg)
    name = ifb_name("bwnet", "ctr1")
    assert name in ifbs(theirs_host)  # same ifb name
    for dev in (theirs.veth, name):
        assert tbf_of(ours_host, dev) == tbf_of(theirs_host, dev) is not None
        assert [q["options"] for q in qdiscs(ours_host, dev) if q["kind"] == "tbf"] == \
            [q["options"] for q in qdiscs(theirs_host, dev) if q["kind"] == "tbf"]
    assert host_link(ours_host, name)["mtu"] == host_link(theirs_host, name)["mtu"]
    assert host_link(ours_host, name).get("txqlen", 0) == \
        host_link(theirs_host, name).get("txqlen", 0)
    assert set(redirect_targets(theirs_host, theirs.veth)) == {name} == \
        set(redirect_targets(ours_host, ours.veth))


def test_a_tbf_above_2_32_bytes_per_second_keeps_its_rate64_after_other_tc_requests(host) -> None:
    """tc.tbf_add_message sends TCA_TBF_RATE64 (pyroute2's tbf options lack it: tc.tbf_message adds
    it) whatever pyroute2 encoded before in the process: an ingress qdisc first, as the
    daemon's warm-up does, once made the rate64 vanish (800 Gbit read back as 9726 Mbit)."""
    from cni.host import dumps, links, netns

    host.run("ip", "link", "add", "tbfa", "type", "veth", "peer", "name", "tbfb")
    want = tc.tbf_for(800_000 * MBIT, 1_000 * MBIT)
    assert want.rate > 2**32
    with netns.iproute(host.path) as ipr:
        dumps.request(ipr, tc.ingress_message(links.get(ipr, "tbfb").index, delete=False))
        index = links.get(ipr, "tbfa").index
        dumps.request(ipr, tc.tbf_add_message(index, want))
        assert tc.read_tbf(ipr, index) == want
    shown = host.run("tc", "qdisc", "show", "dev", "tbfa").stdout
    assert "rate 800Gbit" in shown, shown


@pytest.mark.parametrize("echoed", [True, False])
def test_the_ifb_comes_with_its_index_and_mac_whether_or_not_the_kernel_echoes(host,
                                                                           echoed) -> None:
    """ifb.add_message asks for an echo of the link it makes (Linux 6.3+), and ifb.made takes
    the index and MAC from it without another request; a kernel that answers with a bare ACK
    (here: the echo dropped from the replies) gets the lookup by name instead. Either way the
    index and MAC are the link's; marked, it is up and carries the alias."""
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    from cni.host import dumps, ifb, links, netns

    with netns.iproute(host.path) as ipr:
        [replies] = dumps.writes(ipr, [ifb.add_message("bwptest", 1400)])
        assert replies, "the add was refused"
        assert any(m["header"]["type"] == RTM_NEWLINK for m in replies) == \
            (tuple(int(n) for n in platform.release().split(".")[:2]) >= (6, 3))
        if not echoed:
            replies = [m for m in replies if m["header"]["type"] != RTM_NEWLINK]
        sent = []

        class Counted:  # the socket, counting what made() asks
            def __getattr__(self, name):
                return getattr(ipr, name)

            def nlm_request_batch(self, *a, **kw):
                sent.append(a)
                return ipr.nlm_request_batch(*a, **kw)

        made = ifb.made(Counted(), "bwptest", replies)
        assert len(sent) == (0 if echoed else 1)
        dumps.request(ipr, ifb.mark_message(made.index, ifb.alias_for("net", "ctr")))
        link = links.get(ipr, "bwptest")
    assert (made.index, made.mac) == (link.index, link.mac) and link.up and link.mtu == 1400
    assert host.links()["bwptest"]["ifalias"] == "pycni-bandwidth net ctr"


@pytest.mark.parametrize("rate, burst", [(10 * MBIT, 80_000), (100 * MBIT, CRIO_NO_BURST // 8)])
def test_the_tbf_request_is_what_pyroute2s_own_tbf_classes_encode(rate, burst) -> None:
    """tc.tbf_add_message's parms are pyroute2's struct without the encoder that computes a
    rate table (never sent): the request is byte for byte what pyroute2's tcmsg and sched_tbf
    classes encode for the same values (a rate under 2^32 bytes/s: they lack RATE64)."""
    import copy

    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    ours = tc.tbf_add_message(5, tc.tbf_for(rate, min(burst, tc.max_burst_bits(rate))))
    stock = tcmsg()
    for field in ("family", "index", "handle", "parent"):
        stock[field] = ours[field]
    stock["attrs"] = copy.deepcopy(ours["attrs"])
    stock["header"]["type"], stock["header"]["flags"] = (ours["header"]["type"],
                                                          ours["header"]["flags"])
    for msg in (ours, stock):
        msg["header"]["sequence_number"], msg["header"]["pid"] = 7, 9
        msg.encode()
    assert type(ours) is not tcmsg and bytes(ours.data) == bytes(stock.data)


def host_link(host, name: str) -> dict:
    return host.links()[name]


def test_annotations_give_the_same_qdiscs_as_runtime_config(plugins, host, netns_factory) -> None:
    a = wire(host, netns_factory("pycni-pod"), 1)
    b = wire(host, netns_factory("pycni-pod"), 2)
    annotated = conf(runtimeConfig={"io.kubernetes.cri.pod-annotations": {
        "kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "20M",
        "unrelated": "x"}})
    # containerd / CRI-O turn the same annotations into this: a 4 Gbit "burst" placeholder
    runtime = conf(**runtime_bw((10 * MBIT, 2**32 - 1), (20 * MBIT, 2**32 - 1)))
    add(plugins, a, annotated, cid="annotated")
    add(plugins, b, runtime, cid="runtime")
    assert tbf_of(host, a.veth) == tbf_of(host, b.veth) == \
        tc.tbf_for(10 * MBIT, derived_burst(10 * MBIT, 1500))
    assert tbf_of(host, ifb_name("bwnet", "annotated")) == \
        tbf_of(host, ifb_name("bwnet", "runtime")) == \
        tc.tbf_for(20 * MBIT, derived_burst(20 * MBIT, 1500))
    # the derived burst: 10 ms of the rate (12500 bytes at 10 Mbit/s), not 512 MB
    assert derived_burst(10 * MBIT, 1500) == 100_000


def test_derived_burst_floor_follows_the_veth_mtu(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    host.run("ip", "link", "set", w.veth, "mtu", "9000")
    add(plugins, w, conf(runtimeConfig={"io.kubernetes.cri.pod-annotations": {
        "kubernetes.io/ingress-bandwidth": "1M"}}))
    # 10 ms of 1 Mbit/s is 1250 bytes, less than one jumbo frame: the floor is 4 MTUs
    assert tbf_of(host, w.veth) == tc.tbf_for(MBIT, 4 * 9000 * 8)


@pytest.mark.parametrize(("value", "why"), [
    ("fast", "not a Kubernetes quantity"),
    ("-1M", "unreasonably small"),
    ("2P", "unreasonably large"),
    ("100m", "unreasonably small"),
    ("999", "unreasonably small"),
])
def test_bad_annotations_are_config_errors_and_create_nothing(plugins, host, pod,
                                                               value, why) -> None:
    w = wire(host, pod, 1)
    cfg = conf(runtimeConfig={"io.kubernetes.cri.pod-annotations": {
        "kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": value}})
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                netns=pod.path)
    assert code == 1 and out["code"] == 7, out
    assert "kubernetes.io/egress-bandwidth" in out["msg"] and f'"{value}"' in out["msg"]
    assert why in out["msg"]
    assert_untouched(host, w)


@pytest.mark.parametrize(("extra", "key", "value"), [
    ({"ingressRate": 1000}, "ingressRate", "1000"),
    ({"egressBurst": 8000}, "egressBurst", "8000"),
    ({"egressRate": 1000, "egressBurst": 8 * 2**32}, "egressBurst", str(8 * 2**32)),
    ({"ingressRate": -5, "ingressBurst": 8000}, "ingressRate", "-5"),
    ({"ingressRate": "10M", "ingressBurst": 8000}, "ingressRate", '"10M"'),
])
def test_invalid_keys_name_key_and_value(plugins, host, pod, extra, key, value) -> None:
    w = wire(host, pod, 1)
    for cfg, shown in ((conf(**extra), key),
                       (conf(runtimeConfig={"bandwidth": extra}),
                        f"runtimeConfig.bandwidth.{key}")):
        code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                    netns=pod.path)
        assert code == 1 and out["code"] == 7, out
        assert out["msg"].startswith(f"invalid network config: {shown}: {value}: "), out["msg"]
    assert_untouched(host, w)


@pytest.mark.parametrize("no_burst", [CONTAINERD_NO_BURST, CRIO_NO_BURST],
                         ids=["containerd", "crio"])
def test_each_runtimes_no_burst_sentinel_derives_the_burst(plugins, host, pod,
                                                           no_burst) -> None:
    """containerd sends 4294967295, CRI-O 1.33 34359738359 (what CRI-O sends for a pod annotated
    1M): both mean "no burst given", and tbf gets 10 ms of the rate (at least 4 MTUs)."""
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((MBIT, no_burst), (2 * MBIT, no_burst)))
    out = add(plugins, w, cfg)
    assert tbf_of(host, w.veth) == tc.tbf_for(MBIT, 4 * 1500 * 8)
    ifb = ifb_name("bwnet", "ctr1")
    assert tbf_of(host, ifb) == tc.tbf_for(2 * MBIT, 4 * 1500 * 8)
    plugins.ok("bandwidth", "CHECK", cfg | {"prevResult": out}, netns=pod.path)
    plugins.ok("bandwidth", "DEL", cfg, container_id="ctr1", netns=pod.path)
    assert_untouched(host, w)


@pytest.mark.parametrize("where", ["top", "runtime"])
def test_an_explicit_burst_beyond_what_tbf_holds_is_refused_naming_key_value_and_most(
        plugins, host, pod, where) -> None:
    """An explicit burst is applied exactly or not at all: one tbf cannot hold at its rate (1
    kbit/s with a 1 Gbit bucket is 10^6 s of buffer, more ticks than tbf's u32 holds) is code 7
    naming the key, the value and the largest it holds, and nothing is made. The largest itself
    is taken, exactly; so is CRI-O's sentinel only where it means "no burst"."""
    w = wire(host, pod, 1)
    most = tc.max_burst_bits(1000)
    prefix = "" if where == "top" else "runtimeConfig.bandwidth."

    def limited(ingress, egress):
        return (conf(ingressRate=ingress[0], ingressBurst=ingress[1], egressRate=egress[0],
                     egressBurst=egress[1])
                if where == "top" else conf(**runtime_bw(ingress, egress)))

    for cfg, key, value, rate in (
            (limited((1000, 10**9), (MBIT, 80_000)), "ingressBurst", 10**9, 1000),
            (limited((1000, most + 8), (MBIT, 80_000)), "ingressBurst", most + 8, 1000),
            (limited((MBIT, 80_000), (MBIT, 8 * (2**32 - 2))), "egressBurst", 8 * (2**32 - 2),
             MBIT)):
        code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                    netns=pod.path)
        assert code == 1 and out["code"] == 7, out
        rate_key = prefix + key.replace("Burst", "Rate")
        assert out["msg"] == (
            f"invalid {prefix}{key} {value}: more than tbf can hold at {rate_key} {rate} "
            f"bits/s: at most {tc.max_burst_bits(rate)} bits (its buffer of clock ticks and "
            "its queue limit are 32-bit)"), out
        assert_untouched(host, w)
        assert not shaped.listed()
    if where == "top":  # CRI-O's "no burst" value, written by the admin, is a burst like any
        code, out, _ = plugins.exec("bandwidth", "ADD", conf(
            egressRate=MBIT, egressBurst=CRIO_NO_BURST) | {"prevResult": w.prev_result()},
            netns=pod.path)
        assert code == 1 and out["code"] == 7 and f"egressBurst {CRIO_NO_BURST}" in out["msg"]
        assert_untouched(host, w)
    # The largest tbf holds is applied as given, and CHECK agrees.
    cfg = limited((1000, most), (MBIT, 80_000))
    out = add(plugins, w, cfg)
    held = tbf_of(host, w.veth)
    assert held == tc.tbf_for(1000, most)
    assert 2**32 - 10**6 < held.buffer <= 2**32 - 1
    plugins.ok("bandwidth", "CHECK", cfg | {"prevResult": out}, netns=pod.path)


def test_no_config_passes_prev_result_through(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    prev = w.prev_result() | {"dns": {"nameservers": ["10.0.0.53"]}}
    out = plugins.ok("bandwidth", "ADD", conf(prevResult=prev), netns=pod.path)
    assert out == prev
    zero = conf(**runtime_bw((0, 0), (0, 0)), prevResult=prev)
    assert plugins.ok("bandwidth", "ADD", zero, netns=pod.path) == prev
    assert_untouched(host, w)


def test_missing_prev_result_or_interfaces_or_peer(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((MBIT, 80_000)))
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg, netns=pod.path)
    assert code == 1 and "prevResult is missing" in out["msg"]
    prev = w.prev_result() | {"interfaces": [], "ips": [{"address": "10.77.1.2/24"}]}
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": prev}, netns=pod.path)
    assert code == 1 and "no interfaces" in out["msg"]
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                netns=pod.path, ifname="lo")
    assert code == 1 and "lo has no veth peer" in out["msg"], out
    other = w.prev_result()
    other["interfaces"][0]["name"] = "somethingelse"
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": other},
                                netns=pod.path)
    assert code == 1 and f"veth peer {w.veth}" in out["msg"] and "somethingelse" in out["msg"]
    assert_untouched(host, w)


def test_failed_add_removes_what_it_made_and_only_that(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    host.run("tc", "qdisc", "add", "dev", w.veth, "ingress")  # someone else's: ADD must fail
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                netns=pod.path)
    assert code == 1 and "ingress qdisc" in out["msg"], out
    assert ifb_name("bwnet", "ctr1") not in host.links()
    assert kinds(host, w.veth) == ["ingress", "noqueue"]  # our tbf gone, theirs kept
    plugins.ok("bandwidth", "DEL", cfg, netns=pod.path)  # no ifb of ours: their qdisc stays
    assert kinds(host, w.veth) == ["ingress", "noqueue"]


def test_failed_first_send_undoes_only_the_requests_the_kernel_did(plugins, host, pod) -> None:
    """ADD sends the host veth's tbf, the ifb and the ingress qdisc together; the kernel does
    each it can. Someone else's root qdisc on the host veth: the tbf is refused (the error
    names it, as when it was sent alone) and the ifb and ingress qdisc it made are taken back;
    their qdisc and the record's absence show nothing was taken for ours that was not."""
    w = wire(host, pod, 1)
    host.run("tc", "qdisc", "add", "dev", w.veth, "root", "handle", "1:", "pfifo")
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                netns=pod.path)
    assert code == 1 and out["msg"] == f"bandwidth: tbf on {w.veth}: File exists", out
    assert kinds(host, w.veth) == ["pfifo"]  # theirs, and no ingress qdisc of ours
    assert not [n for n in ifbs(host) if n.startswith("bwp")]
    assert shaped.recall("bwnet", "ctr1", "eth0") is None


def test_an_ifb_name_taken_fails_the_add_and_leaves_that_link(plugins, host, pod) -> None:
    """The ifb's name is taken (here by a bridge): its add is refused in the first send,
    the host veth's tbf and the ingress qdisc sent with it are taken back, the link that had
    the name stays."""
    w = wire(host, pod, 1)
    name = ifb_name("bwnet", "ctr1")
    host.run("ip", "link", "add", name, "type", "bridge")
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    code, out, _ = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                netns=pod.path)
    assert code == 1 and out["msg"] == f"bandwidth: ifb {name}: File exists", out
    assert kinds(host, w.veth) == ["noqueue"]
    assert name in host.links() and host.links()[name]["linkinfo"]["info_kind"] == "bridge"
    assert shaped.recall("bwnet", "ctr1", "eth0") is None


def test_writes_tells_each_requests_outcome_and_leaves_the_socket_clean(host) -> None:
    """dumps.writes: one send, per request its replies or None if refused (the kernel ran
    every request whatever became of the one before); the error comes from the request sent
    alone again. Nothing stays queued on the socket (no reply queue, no stray reply)."""
    from pyroute2 import NetlinkError

    from cni.host import dumps, links, netns

    host.run("ip", "link", "add", "wra", "type", "veth", "peer", "name", "wrb")
    host.run("tc", "qdisc", "add", "dev", "wrb", "root", "handle", "1:", "pfifo")
    with netns.iproute(host.path) as ipr:
        a, b = (links.get(ipr, n).index for n in ("wra", "wrb"))
        queues = ipr.asyncore.msg_queue
        before = queues.root.qsize()
        want = tc.tbf_for(10 * MBIT, 80_000)
        msgs = [tc.tbf_add_message(a, want), tc.tbf_add_message(b, want),
                tc.ingress_message(b, delete=False)]
        done = dumps.writes(ipr, msgs)
        assert [got is not None for got in done] == [True, False, True]
        assert list(queues.queues) == [0] and queues.root.qsize() == before
        with pytest.raises(NetlinkError) as refused:
            dumps.request(ipr, msgs[1])
        assert refused.value.code == 17
        assert tc.read_tbf(ipr, a) == want and tc.has_ingress(ipr, b)
    assert kinds(host, "wrb") == ["ingress", "pfifo"]


def test_the_qdisc_deletes_sent_together_each_do_what_they_did_alone(host) -> None:
    """tc.delete_qdiscs: the ingress and root deletes in one send; one the kernel refuses (no
    such qdisc, no such link, a root qdisc with another handle than ours, 1:) is sent again
    alone, where that is fine as it was, while the other is done."""
    from cni.host import links, netns

    host.run("ip", "link", "add", "dqa", "type", "veth", "peer", "name", "dqb")
    for dev in ("dqa", "dqb"):
        host.run("ip", "link", "set", dev, "up")
    host.run("tc", "qdisc", "add", "dev", "dqa", "ingress")
    host.run("tc", "qdisc", "add", "dev", "dqb", "root", "handle", "1:", "pfifo")
    with netns.iproute(host.path) as ipr:
        a, b = (links.get(ipr, n).index for n in ("dqa", "dqb"))
        tc.delete_qdiscs(ipr, a, a)  # dqa's ingress; no root qdisc of its own
        assert kinds(host, "dqa") == ["noqueue"] and kinds(host, "dqb") == ["pfifo"]
        tc.delete_qdiscs(ipr, 99999, b)  # no such link, dqb's root
        assert kinds(host, "dqb") == ["noqueue"]
        host.run("tc", "qdisc", "add", "dev", "dqb", "ingress")
        host.run("tc", "qdisc", "add", "dev", "dqa", "root", "handle", "2:", "pfifo")
        tc.delete_qdiscs(ipr, b, a)  # dqb's ingress; dqa's root is not 1:, stays
        assert kinds(host, "dqb") == ["noqueue"] and kinds(host, "dqa") == ["pfifo"]
        assert list(ipr.asyncore.msg_queue.queues) == [0]


def test_del_removes_ifb_and_qdiscs_and_is_idempotent(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    out = add(plugins, w, cfg)
    plugins.ok("bandwidth", "DEL", cfg | {"prevResult": out}, netns=pod.path)
    assert_untouched(host, w)
    plugins.ok("bandwidth", "DEL", cfg, netns=pod.path)
    plugins.ok("bandwidth", "DEL", cfg, netns="")
    plugins.ok("bandwidth", "DEL", cfg, netns="/run/netns/gone")


def test_del_without_netns_still_removes_the_ifb(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw(None, (20 * MBIT, 160_000)))
    add(plugins, w, cfg)
    pod.run("ip", "link", "del", "eth0")  # the pod is gone, and its veth with it
    plugins.ok("bandwidth", "DEL", cfg, netns="")
    assert ifb_name("bwnet", "ctr1") not in host.links()


def test_del_after_add_killed_before_the_redirect_removes_the_bare_ingress(plugins, host,
                                                                          pod) -> None:
    """Found by the reliability suite: a SIGKILL between the ingress qdisc and the redirect."""
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw(None, (20 * MBIT, 160_000)))
    add(plugins, w, cfg)
    host.run("tc", "filter", "del", "dev", w.veth, "parent", "ffff:")  # the state at the kill
    assert kinds(host, w.veth) == ["ingress", "noqueue"] and not redirect_targets(host, w.veth)
    plugins.ok("bandwidth", "DEL", cfg, netns=pod.path)
    assert_untouched(host, w)


def test_del_removes_the_recorded_tbf_whatever_the_config_says(plugins, host, pod) -> None:
    """The ingress tbf is found by the ADD's record, not the config: a DEL whose config its ADD
    would refuse, one without limits, or one without a netns removes it from the veth, which
    stays (the veth is not bandwidth's)."""
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    for bad in (conf(ingressRate="fast", ingressBurst=80_000), conf()):
        add(plugins, w, cfg)
        assert kinds(host, w.veth) == ["ingress", "tbf"]
        plugins.ok("bandwidth", "DEL", bad, netns=pod.path)
        assert_untouched(host, w)
    add(plugins, w, cfg)
    plugins.ok("bandwidth", "DEL", cfg, netns="")  # the netns is gone: the record still says
    assert_untouched(host, w)


def test_del_never_removes_a_tbf_its_add_did_not_make(plugins, host, pod) -> None:
    """ADD shaped egress only; someone put a tbf on the host veth; DEL with a config that now
    has ingress limits (or refused ones) leaves that tbf: only a recorded tbf is removed, as the
    reference's DEL never touches the host veth's root qdisc."""
    w = wire(host, pod, 1)
    add(plugins, w, conf(**runtime_bw(None, (20 * MBIT, 160_000))))
    foreign_tbf(host, w.veth)
    both = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    for cfg in (both, conf(ingressRate="fast", ingressBurst=80_000)):
        plugins.ok("bandwidth", "DEL", cfg, netns=pod.path)
        assert kinds(host, w.veth) == ["tbf"]
        assert not [n for n in ifbs(host) if n.startswith("bwp")]
    # And a tbf of the same shape put back after a DEL of our own is not ours either.
    host.run("tc", "qdisc", "del", "dev", w.veth, "root")
    add(plugins, w, both)
    plugins.ok("bandwidth", "DEL", both, netns=pod.path)
    foreign_tbf(host, w.veth)
    plugins.ok("bandwidth", "DEL", both, netns=pod.path)
    assert kinds(host, w.veth) == ["tbf"]


def test_null_network_name_is_refused_before_anything_is_made(plugins, host, pod) -> None:
    """Found by the fuzz: "name": null crashed the ifb naming (999 + traceback)."""
    w = wire(host, pod, 1)
    cfg = conf(name=None, **runtime_bw(None, (20 * MBIT, 160_000)))
    code, out, err = plugins.exec("bandwidth", "ADD", cfg | {"prevResult": w.prev_result()},
                                  netns=pod.path)
    assert code == 1 and out["code"] == 7 and out["msg"] == "invalid name null: must be a string"
    assert "Traceback" not in err
    assert_untouched(host, w)


def test_check_compares_kernel_state(plugins, host, pod) -> None:
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    out = add(plugins, w, cfg)
    chk = cfg | {"prevResult": out}
    plugins.ok("bandwidth", "CHECK", chk, netns=pod.path)
    changed = conf(**runtime_bw((10 * MBIT, 80_000), (30 * MBIT, 160_000)), prevResult=out)
    code, res, _ = plugins.exec("bandwidth", "CHECK", changed, netns=pod.path)
    assert code == 1 and "tbf rate on bwp" in res["msg"] and "3750000" in res["msg"], res
    host.run("tc", "qdisc", "del", "dev", w.veth, "root")
    code, res, _ = plugins.exec("bandwidth", "CHECK", chk, netns=pod.path)
    assert code == 1 and f"no tbf root qdisc on {w.veth}" in res["msg"]
    host.run("ip", "link", "del", ifb_name("bwnet", "ctr1"))
    only_egress = conf(**runtime_bw(None, (20 * MBIT, 160_000)), prevResult=out)
    code, res, _ = plugins.exec("bandwidth", "CHECK", only_egress, netns=pod.path)
    assert code == 1 and "not found" in res["msg"]


def test_check_names_each_failure_though_it_reads_in_one_send(plugins, host, pod,
                                                              netns_factory) -> None:
    """CHECK reads the host end, its root tbf, the ifb and the redirect in one send
    (dumps.together): a read the kernel refuses or answers with nothing is asked again alone,
    so each failure is the one the single requests found, in the same order."""
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    out = add(plugins, w, cfg)
    chk = cfg | {"prevResult": out}
    name = ifb_name("bwnet", "ctr1")
    host.run("tc", "filter", "del", "dev", w.veth, "parent", "ffff:")  # no redirect
    code, res, _ = plugins.exec("bandwidth", "CHECK", chk, netns=pod.path)
    assert code == 1 and res["msg"] == f"no ingress redirect from {w.veth} to ifb {name}", res
    other = json.loads(json.dumps(out))
    other["interfaces"][0]["name"] = "somethingelse"
    code, res, _ = plugins.exec("bandwidth", "CHECK", cfg | {"prevResult": other},
                                netns=pod.path)
    assert code == 1 and f"veth peer {w.veth}" in res["msg"] and "somethingelse" in res["msg"]
    code, res, _ = plugins.exec("bandwidth", "CHECK", chk, netns=pod.path, ifname="lo")
    assert code == 1 and "lo has no veth peer" in res["msg"], res
    away = netns_factory("pycni-away")
    host.run("ip", "link", "set", w.veth, "netns", away.name)  # the peer index: no host link
    code, res, _ = plugins.exec("bandwidth", "CHECK", chk, netns=pod.path)
    assert code == 1 and "is not in the host namespace" in res["msg"], res


COUNTED = """
import json, os, sys
from cni import skel
from cni.host import links, netns
from cni.host.nsfd import setns

host, pod, stdin = sys.argv[1], sys.argv[2], sys.argv[3].encode()
verbs = sys.argv[4].split(",") if len(sys.argv) > 4 else ("ADD", "CHECK", "DEL")
if "unindexed" in sys.argv[5:]:  # the interface table gives nothing: lookups by name
    links.index_of = lambda name: None
setns(os.open(host, os.O_RDONLY))
sends, sockets = [], []
made = netns.new_socket

def counted():  # each IPRoute a request makes: count it and what it sends
    ipr = made()
    sockets.append(1)
    send = ipr.asyncore.send
    ipr.asyncore.send = lambda *a, **k: (sends.append(1), send(*a, **k))[1]
    return ipr

netns.new_socket = counted
env = {"CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod, "CNI_IFNAME": "eth0",
       "CNI_PATH": "/nonexistent"}
out = {}
for verb in verbs:
    sends.clear()
    sockets.clear()
    reply = skel.run("bandwidth", env | {"CNI_COMMAND": verb}, stdin)
    assert reply.code == 0, reply
    out[verb] = [len(sockets), len(sends)]
print(json.dumps(out))
"""


def test_check_and_del_cost_few_round_trips(host, pod) -> None:
    """The sockets a request makes and what it sends on them (in-process, as a daemon's
    child): two, the container namespace's (its veth, asked where it lives: a lookup by the
    namespace's id from the host would give the host an nsid for itself) and the host's. On
    the host, one send for the host end and all that is read about it (for CHECK the ifb's
    tbf too); DEL's two qdisc deletes, in one send. The ifb's delete is linkgone's, on a socket
    of its own.
    ADD: the host end; then the host veth's tbf, the ifb's add (echoed: no lookup after it, on
    Linux 6.3 and later) and the ingress qdisc in one send; the ifb's alias, the redirect and
    the ifb's tbf in another."""
    import platform
    import subprocess
    import sys
    from pathlib import Path

    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    stdin = json.dumps(cfg | {"prevResult": w.prev_result()})
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", COUNTED, host.path, pod.path, stdin], cwd=root,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    echoes = tuple(int(n) for n in platform.release().split(".")[:2]) >= (6, 3)
    assert json.loads(run.stdout) == {"ADD": [2, 4 if echoes else 5], "CHECK": [2, 2],
                                      "DEL": [2, 3]}
    assert_untouched(host, w)


GUESSED = """
import os, sys
from cni import skel
from cni.host import links, netns
from cni.host.nsfd import setns

host, pod, stdin = sys.argv[1], sys.argv[2], sys.argv[3].encode()
setns(os.open(host, os.O_RDONLY))
env = {"CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod, "CNI_IFNAME": "eth0",
       "CNI_PATH": "/nonexistent", "CNI_COMMAND": "CHECK"}
sends = []
made = netns.new_socket

def counted():
    ipr = made()
    send = ipr.asyncore.send
    ipr.asyncore.send = lambda *a, **k: (sends.append(1), send(*a, **k))[1]
    return ipr

netns.new_socket = counted
real = links.index_of
for guess, want in ((real, 2), (lambda name: None, 3)):
    if guess is not None:
        links.index_of = guess  # the interface table's answer, or none (the ioctl failed)
    sends.clear()
    reply = skel.run("bandwidth", env, stdin)
    # the pod's veth; the host's reads, with the ifb's tbf; without the ifb's index from the
    # interface table, the ifb looked up alone (its tbf with it, as before)
    assert (reply.code, reply.stdout, len(sends)) == (0, b"", want), (reply, sends, want)
print("ok")
"""


def test_check_finds_the_ifb_by_its_name_without_a_netlink_lookup(plugins, host, pod) -> None:
    """CHECK takes the ifb's index from the host's interface table (if_nametoindex, then
    if_indextoname: its own name, not an altname), and asks its tbf with the rest: two sends.
    Without it, the ifb is looked up alone, as before (three sends), with the same verdict; a
    link that only has the ifb's name as an altname is no ifb, as links.get has it."""
    import subprocess
    import sys
    from pathlib import Path

    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    out = add(plugins, w, cfg)
    chk = cfg | {"prevResult": out}
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", GUESSED, host.path, pod.path, json.dumps(chk)],
                         cwd=root, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok"]
    name = ifb_name("bwnet", "ctr1")
    host.run("ip", "link", "del", name)
    host.run("ip", "link", "add", "bwdummy0", "type", "bridge")
    host.run("ip", "link", "property", "add", "dev", "bwdummy0", "altname", name)
    code, res, _ = plugins.exec("bandwidth", "CHECK", chk, netns=pod.path)
    assert code == 1 and res["msg"] == f"ifb {name} for egress shaping not found", res


@pytest.mark.parametrize("netns_given", [True, False])
def test_del_finds_the_ifb_by_name_when_the_interface_table_does_not(plugins, host, pod,
                                                                     netns_given) -> None:
    """DEL takes the ifb's index from the interface table (links.index_of, as CHECK does);
    without it, the ifb is looked up by name (with the host end's reads: the same sockets and
    sends as with it, test_check_and_del_cost_few_round_trips; or alone without a netns), and
    DEL removes the same: the ifb, the ingress qdisc, the recorded tbf."""
    import subprocess
    import sys
    from pathlib import Path

    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    add(plugins, w, cfg)
    assert ifb_name("bwnet", "ctr1") in ifbs(host) and kinds(host, w.veth) == ["ingress", "tbf"]
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", COUNTED, host.path,
                          pod.path if netns_given else "", json.dumps(cfg), "DEL", "unindexed"],
                         cwd=root, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    if netns_given:
        assert json.loads(run.stdout) == {"DEL": [2, 3]}
    assert_untouched(host, w)


def test_check_without_bandwidth_config_succeeds(plugins, host, pod) -> None:
    """Reference #1221: CHECK crashed with no bandwidth config."""
    w = wire(host, pod, 1)
    plugins.ok("bandwidth", "CHECK", conf(prevResult=w.prev_result()), netns=pod.path)
    plugins.ok("bandwidth", "CHECK", conf(), netns=pod.path)


def test_gc_removes_only_our_stale_ifbs(plugins, host, netns_factory) -> None:
    cfg = conf(**runtime_bw(None, (20 * MBIT, 160_000)))
    for n, cid in ((1, "keep"), (2, "stale")):
        add(plugins, wire(host, netns_factory("pycni-pod"), n), cfg, cid=cid)
    other = wire(host, netns_factory("pycni-pod"), 3)
    add(plugins, other, conf(name="othernet", **runtime_bw(None, (MBIT, 80_000))), cid="stale")
    host.run("ip", "link", "add", "bwpforeign", "type", "ifb")  # not ours: no mark
    host.run("ip", "link", "add", "ifbx", "type", "ifb")
    before = set(ifbs(host))

    gc = conf(**{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]})
    plugins.ok("bandwidth", "GC", gc)
    assert before - set(ifbs(host)) == {ifb_name("bwnet", "stale")}

    plugins.ok("bandwidth", "GC", conf(**{"cni.dev/attachments": []}))
    assert before - set(ifbs(host)) == {ifb_name("bwnet", "stale"), ifb_name("bwnet", "keep")}
    assert {"bwpforeign", "ifbx", ifb_name("othernet", "stale")} <= set(ifbs(host))
    plugins.ok("bandwidth", "GC", conf())  # no list at all: remove nothing
    assert ifb_name("othernet", "stale") in ifbs(host)


def test_gc_removes_the_tbf_of_a_stale_attachment_from_a_veth_that_stays(plugins, host,
                                                                         netns_factory) -> None:
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), None))
    wired = {cid: wire(host, netns_factory("pycni-pod"), n)
             for n, cid in ((1, "keep"), (2, "stale"))}
    for cid, w in wired.items():
        add(plugins, w, cfg, cid=cid)
    other = wire(host, netns_factory("pycni-pod"), 3)
    add(plugins, other, conf(name="othernet", **runtime_bw((MBIT, 80_000), None)), cid="stale")
    gc = conf(**{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]})
    plugins.ok("bandwidth", "GC", gc)
    assert kinds(host, wired["stale"].veth) == ["noqueue"]
    assert kinds(host, wired["keep"].veth) == ["tbf"] and kinds(host, other.veth) == ["tbf"]
    # Its record went with it: a later DEL of that attachment touches nothing.
    foreign_tbf(host, wired["stale"].veth)
    plugins.ok("bandwidth", "DEL", cfg, container_id="stale", netns=wired["stale"].pod.path)
    assert kinds(host, wired["stale"].veth) == ["tbf"]


def test_gc_judges_each_record_by_container_and_ifname(plugins, host, netns_factory) -> None:
    """The valid list names attachments (containerID, ifname): a tbf recorded for ifname eth0
    goes when only the same container's eth1 is valid; the container's ifb stays with it."""
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    w = wire(host, netns_factory("pycni-pod"), 1)
    add(plugins, w, cfg, cid="multi")
    gc = conf(**{"cni.dev/valid-attachments": [{"containerID": "multi", "ifname": "eth1"}]})
    plugins.ok("bandwidth", "GC", gc)
    assert kinds(host, w.veth) == ["ingress", "noqueue"]  # the tbf went, the redirect stayed
    assert shaped.listed() == []
    assert ifb_name("bwnet", "multi") in ifbs(host)


def test_any_gc_forgets_the_records_whose_veth_is_gone_even_of_a_network_that_is_gone(
        plugins, host, netns_factory) -> None:
    """A record is only good for a DEL that removes the tbf from its veth: once that veth is
    gone from the node, the GC of any network (with or without a valid list) forgets it, so
    the records of a network whose GC never runs again do not pile up. Records whose veth is
    there stay, whatever their network."""
    cfg = conf(name="gonenet", **runtime_bw((10 * MBIT, 80_000), None))
    gone, live = (wire(host, netns_factory("pycni-pod"), n) for n in (1, 2))
    add(plugins, gone, cfg, cid="gone")
    add(plugins, live, cfg, cid="live")
    host.run("ip", "link", "del", gone.veth)  # the pod went without a DEL
    assert {r.container_id for r in shaped.listed()} == {"gone", "live"}
    plugins.ok("bandwidth", "GC", conf())  # another network, no valid list: nothing of its own
    assert {r.container_id for r in shaped.listed()} == {"live"}
    plugins.ok("bandwidth", "GC", conf(**{"cni.dev/valid-attachments": []}))
    assert {r.container_id for r in shaped.listed()} == {"live"}
    assert kinds(host, live.veth) == ["tbf"]


def dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_temporary_record_is_never_read_and_goes_once_its_writer_is_dead(plugins, host,
                                                                          netns_factory) -> None:
    """An ADD of an earlier version killed between writing `<record>.tmp<pid>` and renaming it
    made no tbf: a tbf on that veth is someone else's. GC must neither read the file as a record
    (it removed that tbf) nor keep it forever; a live writer's file stays."""
    import os
    from pathlib import Path

    cfg = conf(**runtime_bw((10 * MBIT, 80_000), None))
    w, other = (wire(host, netns_factory("pycni-pod"), n) for n in (1, 2))
    add(plugins, w, cfg, cid="killed")
    add(plugins, other, cfg, cid="other")
    records = Path(shaped.RECORD_DIR)
    path, kept = (Path(shaped._path("bwnet", cid, "eth0")) for cid in ("killed", "other"))
    assert path.exists() and kept.exists()
    dead = path.with_name(f"{path.name}.tmp{dead_pid()}")
    path.rename(dead)  # the state at the kill: the file not yet renamed, no tbf made
    host.run("tc", "qdisc", "del", "dev", w.veth, "root")
    foreign_tbf(host, w.veth)
    live = kept.with_name(f"{kept.name}.tmp{os.getpid()}")
    live.write_text(dead.read_text())
    assert {r.container_id for r in shaped.listed()} == {"other"}
    plugins.ok("bandwidth", "GC", conf(**{"cni.dev/valid-attachments": [
        {"containerID": "other", "ifname": "eth0"}]}))
    assert kinds(host, w.veth) == ["tbf"]  # not ours: left
    assert not dead.exists() and live.exists()
    assert {r.container_id for r in shaped.listed()} == {"other"}
    live.unlink()
    assert list(records.iterdir()) == [kept]


def test_a_record_is_one_file_written_in_place_and_a_torn_one_is_never_trusted(
        tmp_path, monkeypatch) -> None:
    """remember and forget touch the record's own file only: no temporary file, no listing of
    the directory (whose size grows with the pods). A writer killed mid-write leaves a prefix
    of the record: no prefix reads as a record, for DEL (recall) or GC (listed)."""
    import os

    monkeypatch.setattr(shaped, "RECORD_DIR", str(tmp_path / "records"))

    def no_listing(*_):
        raise AssertionError("the record directory was listed")

    listdir = os.listdir
    shaped.remember("net", "ctr", "eth0", "veth1", 7)  # makes the directory
    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    shaped.remember("net", "ctr", "eth0", "veth2", 8)  # over the first
    path = shaped._path("net", "ctr", "eth0")
    assert listdir(tmp_path / "records") == [os.path.basename(path)]
    with open(path, "rb") as f:
        full = f.read()
    want = shaped.Shaped("net", "ctr", "eth0", "veth2", 8, shaped.node_netns())
    assert shaped.recall("net", "ctr", "eth0") == want
    shaped.forget("net", "ctr", "eth0")
    assert not os.path.exists(path) and shaped.recall("net", "ctr", "eth0") is None
    monkeypatch.undo()
    monkeypatch.setattr(shaped, "RECORD_DIR", str(tmp_path / "records"))
    for end in range(len(full)):
        with open(path, "wb") as f:
            f.write(full[:end])
        assert shaped.recall("net", "ctr", "eth0") is None, full[:end]
        assert shaped.listed() == []


def test_without_the_daemon_no_verb_loads_nftables_and_loopback_no_pydantic(host, pod) -> None:
    """Each exec imports what its verb needs: bandwidth's verbs load pydantic (its limits are a
    config model) and pyroute2, never libnftables; loopback's load neither pydantic nor
    libnftables. Run as the binary runs, in the host namespace, with no daemon to ask."""
    w = wire(host, pod, 1)
    cfg = conf(**runtime_bw((10 * MBIT, 80_000), (20 * MBIT, 160_000)))
    watch = ("pydantic", "nftables")
    env = {"CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": "/nonexistent", "PYCNI_SOCKET": "/nonexistent/pycni.sock"}
    lo = b'{"cniVersion":"1.1.0","name":"bwnet","type":"loopback"}'
    out = json.dumps(cfg | {"prevResult": w.prev_result()}).encode()
    allowed = {"loopback": [], "bandwidth": ["pydantic"]}
    for plugin, command, stdin in (("loopback", "ADD", lo), ("bandwidth", "ADD", out),
                                   ("bandwidth", "CHECK", out), ("bandwidth", "DEL", out),
                                   ("loopback", "DEL", lo)):
        body, code, loaded = probe_binary(plugin, env | {"CNI_COMMAND": command}, stdin,
                                          watch, netns=host.name)
        assert code == 0, (plugin, command, body)
        assert loaded == allowed[plugin], (plugin, command, loaded)
    assert_untouched(host, w)


def _encoded(msg, like: bytes) -> bytes:
    """`msg` encoded with the sequence number and port of the request `like`."""
    msg["header"]["sequence_number"] = int.from_bytes(like[8:12], "little")
    msg["header"]["pid"] = int.from_bytes(like[12:16], "little")
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize("case", ["ingress add", "ingress del", "root del", "redirect",
                                  "ifb add", "ifb mark"])
def test_prebuilt_requests_are_what_pyroute2_would_send(case) -> None:
    """tc.py's and ifb.py's prebuilt requests are byte for byte what pyroute2's tc() and
    link() encode for the calls they replace (IPBatch: encoded, not sent)."""
    from pyroute2 import IPBatch
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    from cni.host import ifb

    add_echoed = (RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO)
    mirred = {"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": 70000}
    calls = {
        "ingress add": (lambda b: b.tc("add", "ingress", 5, tc.INGRESS_HANDLE),
                        lambda: tc.ingress_message(5, delete=False)),
        "ingress del": (lambda b: b.tc("del", "ingress", 5, tc.INGRESS_HANDLE,
                                       parent=tc.TC_H_INGRESS),
                        lambda: tc.ingress_message(5, delete=True)),
        "root del": (lambda b: b.tc("del", index=5, handle=tc.TBF_HANDLE, parent=tc.TC_H_ROOT),
                     lambda: tc.root_delete_message(5)),
        "redirect": (lambda b: b.tc("add-filter", "u32", 5, parent=tc.INGRESS_HANDLE, prio=1,
                                    protocol=tc.ETH_P_ALL, target=tc.REDIRECT_CLASSID,
                                    keys=["0x0/0x0+0"], action=mirred),
                     lambda: tc.redirect_message(5, 70000)),
        "ifb add": (lambda b: b.link(add_echoed, ifname="bwp0123456789ab", kind="ifb",
                                     mtu=9000, txqlen=0),
                    lambda: ifb.add_message("bwp0123456789ab", 9000)),
        "ifb mark": (lambda b: b.link("set", index=70000, ifalias=ifb.alias_for("net", "c1"),
                                      state="up"),
                     lambda: ifb.mark_message(70000, ifb.alias_for("net", "c1"))),
    }
    high, prebuilt = calls[case]
    batch = IPBatch()
    high(batch)
    want = bytes(batch.batch)
    assert _encoded(prebuilt(), want) == want
