"""Result conversion between every spec version: exact shapes and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import CNIError
from cni.spec.result import convert, from_current, to_current
from cni.spec.version import SUPPORTED

FULL = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
        {"name": "veth1234abcd", "mac": "aa:bb:cc:dd:ee:01", "mtu": 1500},
        {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/p"},
    ],
    "ips": [
        {"interface": 2, "address": "10.1.0.2/24", "gateway": "10.1.0.1"},
        {"interface": 2, "address": "fd00::2/64", "gateway": "fd00::1"},
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "::/0"}],
    "dns": {"nameservers": ["10.1.0.10"]},
}


def test_1x_shape_keeps_order_and_omits_empty() -> None:
    out = from_current(to_current(FULL, "1.1.0"), "1.0.0")
    assert list(out) == ["cniVersion", "interfaces", "ips", "routes", "dns"]
    assert out["interfaces"][1] == {"name": "veth1234abcd", "mac": "aa:bb:cc:dd:ee:01",
                                    "mtu": 1500}
    assert out["ips"][0] == {"interface": 2, "address": "10.1.0.2/24", "gateway": "10.1.0.1"}
    assert out["routes"][1] == {"dst": "::/0"}


def test_04_adds_version_first_and_drops_mtu() -> None:
    out = convert(FULL, "1.1.0", "0.4.0")
    assert out["ips"][0] == {"version": "4", "interface": 2, "address": "10.1.0.2/24",
                             "gateway": "10.1.0.1"}
    assert out["ips"][1]["version"] == "6"
    assert "mtu" not in out["interfaces"][1]


def test_04_to_1x_drops_version() -> None:
    old = convert(FULL, "1.1.0", "0.3.1")
    assert convert(old, "0.3.1", "1.0.0")["ips"][0] == {
        "interface": 2, "address": "10.1.0.2/24", "gateway": "10.1.0.1"}


def test_02_takes_first_of_each_family_and_splits_routes() -> None:
    out = convert(FULL, "1.1.0", "0.2.0")
    assert out == {
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.1.0.2/24", "gateway": "10.1.0.1",
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}]},
        "ip6": {"ip": "fd00::2/64", "gateway": "fd00::1", "routes": [{"dst": "::/0"}]},
        "dns": {"nameservers": ["10.1.0.10"]},
    }


def test_02_without_ips_cannot_convert() -> None:
    with pytest.raises(CNIError, match="cannot convert: no valid IP addresses"):
        convert({"cniVersion": "1.0.0", "interfaces": [{"name": "lo"}]}, "1.0.0", "0.2.0")


def test_02_upgrades_to_1x() -> None:
    old = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.5/16", "gateway": "10.0.0.1",
                                          "routes": [{"dst": "0.0.0.0/0"}]}}
    assert convert(old, "0.2.0", "1.0.0") == {
        "cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/16", "gateway": "10.0.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}]}


@pytest.mark.parametrize("version,printed", [
    ("0.1.0", True), ("0.2.0", True), ("0.3.0", True), ("0.3.1", True), ("0.4.0", True),
    ("1.0.0", False), ("1.1.0", False)])
def test_empty_dns_is_printed_before_1_0_0_only(version, printed) -> None:
    """v1.9.1 prints an empty "dns" before 1.0.0 (a struct there) and omits it from 1.0.0 on
    (1.1.1 printed it at 1.0.0 too); a non-empty one is printed at every version."""
    out = convert({"ips": [{"address": "10.0.0.2/24"}]}, "1.1.0", version)
    assert ("dns" in out) is printed and out.get("dns", {}) == {}
    full = convert({"ips": [{"address": "10.0.0.2/24"}], "dns": {"domain": "x"}}, "1.1.0",
                   version)
    assert full["dns"] == {"domain": "x"}


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_02_prev_result_without_ips_passes_through(version) -> None:
    """A 0.1.0/0.2.0 prevResult handed on unchanged prints as it came, as the reference's
    portmap prints it; only a result converted down from a later shape needs an address."""
    for prev, printed in (({"cniVersion": version}, {"cniVersion": version, "dns": {}}),
                          ({"cniVersion": version, "dns": {"search": ["a"]}},
                           {"cniVersion": version, "dns": {"search": ["a"]}})):
        canonical = to_current(prev, version)
        assert from_current(canonical, version, passthrough=True) == printed
        with pytest.raises(CNIError, match="cannot convert: no valid IP addresses"):
            from_current(canonical, version)


@pytest.mark.parametrize("bad", [
    [], {"ips": [{"address": "nope"}]}, {"ips": [{"address": "10.0.0.2/24", "interface": 3}]},
    {"interfaces": [{"mac": "x"}]}, {"routes": [{"gw": "10.0.0.1"}]},
])
def test_malformed_results_are_decode_errors(bad) -> None:
    with pytest.raises(CNIError) as e:
        to_current(bad, "1.0.0")
    assert e.value.code == 6


v4 = st.tuples(st.integers(1, 223), st.integers(0, 255), st.integers(0, 255),
               st.integers(1, 254)).map(lambda t: ".".join(map(str, t)))
v6 = st.integers(1, 0xFFFF).map(lambda n: f"fd00::{n:x}")
ips = st.lists(st.tuples(st.sampled_from(["4", "6"]), st.booleans()), min_size=1, max_size=4)


@given(ips=ips, a4=v4, a6=v6, version=st.sampled_from([v for v in SUPPORTED if v >= "0.3.0"]))
def test_round_trip_through_any_1x_and_03_version(ips, a4, a6, version) -> None:
    result = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
              "ips": [], "routes": [], "dns": {}}
    for fam, with_if in ips:
        entry = {"address": f"{a4}/24" if fam == "4" else f"{a6}/64"}
        if with_if:
            entry = {"interface": 0} | entry
        result["ips"].append(entry)
    there = convert(result, "1.1.0", version)
    back = to_current(there, version)
    assert back["ips"] == result["ips"]
    assert back["interfaces"] == result["interfaces"]


@given(a4=v4, a6=v6, both=st.booleans())
def test_round_trip_through_02_keeps_first_address(a4, a6, both) -> None:
    result = {"cniVersion": "1.1.0", "interfaces": [],
              "ips": [{"address": f"{a4}/24"}] + ([{"address": f"{a6}/64"}] if both else []),
              "routes": [], "dns": {}}
    back = to_current(convert(result, "1.1.0", "0.2.0"), "0.2.0")
    assert back["ips"] == result["ips"]
