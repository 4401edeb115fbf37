"""Table-driven tests of the pure parts the kernel tests reach only indirectly: host-local's
candidate order and range-set overlaps, the tbf numbers, bandwidth's derived burst. Expected
values are literals worked out by hand from the reference's rules, not recomputed here."""

from __future__ import annotations

import ipaddress

import pytest

from cni.host import tc
from cni.ipam import config as ipam_config
from cni.ipam.allocator import candidates
from cni.plugins.bandwidth import derived_burst, ifb_name
from cni.spec.errors import CNIError


def range_sets(*sets: list[dict]) -> list[ipam_config.RangeSet]:
    conf = {"cniVersion": "1.0.0", "name": "n",
            "ipam": {"type": "host-local", "ranges": [list(s) for s in sets]}}
    return ipam_config.load(conf, "1.0.0", []).ranges


def walk(ranges: ipam_config.RangeSet, last: str | None) -> list[str]:
    start = ipaddress.ip_address(last) if last else None
    return [r.ip(value) for r, value in candidates(ranges, start)]


@pytest.mark.parametrize("rset,last,expected", [
    # /29: gateway .1 by default, usable .2-.6 (broadcast .7 excluded)
    ([{"subnet": "10.0.0.0/29"}], None, ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5",
                                         "10.0.0.6"]),
    # round-robin: start after the last reserved, wrap, end on it
    ([{"subnet": "10.0.0.0/29"}], "10.0.0.4", ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3",
                                               "10.0.0.4"]),
    # last reserved outside the set (the config changed): from the first range's start
    ([{"subnet": "10.0.0.0/29"}], "10.9.9.9", ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5",
                                               "10.0.0.6"]),
    # a gateway inside the range is skipped wherever it sits
    ([{"subnet": "10.0.0.0/29", "gateway": "10.0.0.4"}], None,
     ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.5", "10.0.0.6"]),
    # two ranges in one set: the walk goes on into the next, and wraps to the first
    ([{"subnet": "10.0.0.0/30"}, {"subnet": "10.0.1.0/30"}], "10.0.0.2",
     ["10.0.1.2", "10.0.0.2"]),
    # explicit bounds
    ([{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.12"}], None,
     ["10.0.0.10", "10.0.0.11", "10.0.0.12"]),
    # IPv6: the last address is usable (no broadcast)
    ([{"subnet": "fd00::/126"}], None, ["fd00::2", "fd00::3"]),
    # last reserved at the end of the second of three ranges: on to the third, wrap, and back
    ([{"subnet": "fd00::/126"}, {"subnet": "fd00:1::/126"}, {"subnet": "fd00:2::/126"}],
     "fd00:1::3", ["fd00:2::2", "fd00:2::3", "fd00::2", "fd00::3", "fd00:1::2", "fd00:1::3"]),
    # an IPv4-compatible IPv6 range: the address written as Go writes it, not ::0.0.0.2
    ([{"subnet": "::/126"}], None, ["::2", "::3"]),
])
def test_candidate_order(rset, last, expected) -> None:
    assert walk(range_sets(rset)[0], last) == expected


@pytest.mark.parametrize("sets,fragment", [
    ([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]], "range set 0 overlaps with 1"),
    ([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}], [{"subnet": "10.1.0.128/25"}]],
     "range set 1 overlaps with 2"),
    ([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}]],
     "overlap"),
    # sets of several ranges meeting only in their middle ranges
    ([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.5.0/24", "rangeStart": "10.0.5.200"},
       {"subnet": "10.0.9.0/24"}],
      [{"subnet": "10.0.3.0/24"}, {"subnet": "10.0.5.0/24", "rangeEnd": "10.0.5.200"}]],
     "range set 0 overlaps with 1"),
    ([[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64", "rangeStart": "fd00::ff"}],
      [{"subnet": "fd00::/64", "rangeEnd": "fd00::ff"}]], "range set 1 overlaps with 2"),
])
def test_overlapping_ranges_refused(sets, fragment) -> None:
    with pytest.raises(CNIError) as e:
        range_sets(*sets)
    assert e.value.code == 7 and fragment in e.value.msg, e.value.msg


@pytest.mark.parametrize("sets", [
    [[{"subnet": "10.0.0.0/25"}], [{"subnet": "10.0.0.128/25"}]],  # adjacent
    [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]],  # other family
    [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.99"},
      {"subnet": "10.0.1.0/24"}]],  # two ranges in one set, disjoint
    [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.99"}, {"subnet": "10.0.9.0/24"}],
     [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}, {"subnet": "10.0.8.0/24"}]],
    [[{"subnet": "fd00::/64", "rangeEnd": "fd00::fe"}],
     [{"subnet": "fd00::/64", "rangeStart": "fd00::ff"}]],  # one /64 split between two sets
])
def test_disjoint_ranges_accepted(sets) -> None:
    assert len(range_sets(*sets)) == len(sets)


@pytest.mark.parametrize("rate,burst,ticks,expected", [
    # 1 Mbit/s = 125000 B/s, burst 100000 bits = 12500 B: 100 ms of buffer;
    # limit = 125000 B/s * 25 ms + 12500 B = 3125 + 12500
    (1_000_000, 100_000, 1.0, tc.Tbf(rate=125_000, limit=15_625, buffer=100_000)),
    (1_000_000, 100_000, 15.625, tc.Tbf(rate=125_000, limit=15_625, buffer=1_562_500)),
    # 10 Mbit/s, 1 MB burst: 800 ms of buffer, limit 31250 + 1000000
    (10_000_000, 8_000_000, 1.0, tc.Tbf(rate=1_250_000, limit=1_031_250, buffer=800_000)),
    # bits that are not a whole byte are dropped, as the reference's integer division
    (8_007, 807, 1.0, tc.Tbf(rate=1_000, limit=125, buffer=100_000)),
])
def test_tbf_numbers(rate, burst, ticks, expected) -> None:
    assert tc.tbf_for(rate, burst, ticks) == expected


@pytest.mark.parametrize("rate,burst", [(7, 800), (800, 7), (8, 2**40)])
def test_tbf_refuses_what_tbf_cannot_hold(rate, burst) -> None:
    with pytest.raises(ValueError):
        tc.tbf_for(rate, burst, 1.0)


@pytest.mark.parametrize("rate,mtu,expected", [
    (10_000_000, 1500, 100_000),  # 10 ms of 10 Mbit/s
    (1_000_000, 1500, 48_000),  # 10 ms is 10000 bits: 4 MTUs of 1500 B win
    (1_000_000, 9000, 288_000),  # jumbo frames: 4 x 9000 B
    (1_000_000, 500, 48_000),  # never under 4 x 1500 B
    (10**15, 1500, 10**13),  # not capped here: _tbf clamps to what tbf holds (max_burst_bits)
])
def test_derived_burst(rate, mtu, expected) -> None:
    assert derived_burst(rate, mtu) == expected


@pytest.mark.parametrize("network,cid,expected", [
    ("bwnet", "ctr1", "bwpea62040b30ca"),  # 'bwp' + sha512(network + cid)[:12], by hashlib
    ("benchnet", "abcdef0123456789", "bwp4dc7db97971d"),
])
def test_ifb_name(network, cid, expected) -> None:
    """The reference's name: 'bwp' + sha512(network + cid)[:12], values computed by hand."""
    assert ifb_name(network, cid) == expected


def searched_max_burst_bits(rate_bits: int, ticks: float) -> int:
    """The search max_burst_bits replaced (commit 828692d): an estimate in exact arithmetic,
    then down one byte at a time until tbf_for accepts it."""
    rate = rate_bits // 8
    usec_max = int(tc.U32_MAX / ticks)
    by_buffer = ((usec_max + 1) * rate - 1) // tc.TIME_UNITS_PER_SEC
    burst = min(by_buffer, tc.U32_MAX - int(rate * tc.LATENCY_USEC / tc.TIME_UNITS_PER_SEC))
    while burst > 0:
        try:
            tc.tbf_for(rate_bits, burst * 8, ticks)
            return burst * 8
        except ValueError:
            burst -= 1
    return 0


RATES = [8, 1000, 8007, 1_000_000, 12_345_678, 125_000_000, 10**9, 8 * 10**9 + 3, 10**11,
         10**12, 1_370_000_000_000, 1_380_000_000_000, 10**13]


@pytest.mark.parametrize("ticks", [15.625, 1.0, 1000.0, 0.064, 1 / 3])  # psched: us2t 64 ...
@pytest.mark.parametrize("rate", RATES)
def test_max_burst_is_the_largest_tbf_holds_and_agrees_with_the_old_search(rate, ticks) -> None:
    most = tc.max_burst_bits(rate, ticks)
    assert most == searched_max_burst_bits(rate, ticks)
    assert most % 8 == 0
    if most:
        tc.tbf_for(rate, most, ticks)  # fits
    with pytest.raises(ValueError):
        tc.tbf_for(rate, most + 8, ticks)  # one byte more does not


@pytest.mark.parametrize("rate,ticks,expected", [
    # 125 B/s, 15.625 ticks/us: 274877906 us of buffer at most (4294967281 ticks), i.e.
    # trunc(274877906.xxx * 125 / 1e6) = 34359 bytes
    (1000, 15.625, 34_359 * 8),
    # 1 Tbit/s: 25 ms of 125 GB/s is 3125000000 bytes of queue, 4294967295 in all
    (10**12, 15.625, (2**32 - 1 - 3_125_000_000) * 8),
    (11 * 10**12, 15.625, 0),  # 25 ms alone passes 2^32 bytes
])
def test_max_burst_values_worked_by_hand(rate, ticks, expected) -> None:
    assert tc.max_burst_bits(rate, ticks) == expected



def test_tick_in_usec_reads_psched_once(monkeypatch) -> None:
    """/proc/net/psched holds the kernel's constants: read once per process, then remembered
    (a text given is parsed as given; an unreadable file is 1.0, as netlink's)."""
    import builtins

    first = tc.tick_in_usec()
    opened = []
    real_open = builtins.open

    def counting_open(path, *args, **kwargs):
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    assert tc.tick_in_usec() == first
    assert "/proc/net/psched" not in opened
    assert tc.tick_in_usec("000003e8 00000040 000f4240 3b9aca00") == 15.625
    assert tc.tick_in_usec("nonsense") == 1.0
