"""portmap pieces without the kernel: conditions allow-list, owner comments, IP choice."""

from __future__ import annotations

import pytest

from cni.host import hostport
from cni.plugins.portmap import container_ips


@pytest.mark.parametrize("tokens,text", [
    (["ip", "daddr", "!=", "{ 127.0.0.0/8, 198.19.254.254 }"],
     "ip daddr != { 127.0.0.0/8, 198.19.254.254 }"),
    (["iifname", "eth0"], "iifname eth0"),
    (['iifname != "veth*"'], 'iifname != "veth*"'),
    (["meta mark & 0x4000 == 0x4000"], "meta mark & 0x4000 == 0x4000"),
    (["ip6 saddr fd00::/8 tcp dport 1000-2000"], "ip6 saddr fd00::/8 tcp dport 1000-2000"),
    (["meta pkttype host"], "meta pkttype host"),
    (["fib saddr type != local", "ct state established,related"],
     "fib saddr type != local ct state established, related"),
])
def test_conditions_accepted(tokens, text) -> None:
    assert hostport.conditions_text(tokens) == text


@pytest.mark.parametrize("tokens", [
    ["ip daddr 1.2.3.4;", "flush ruleset"], ["ip daddr 1.2.3.4\n"], ["accept"], ["drop"],
    ["jump x"], ["goto x"], ["counter"], ["dnat to 1.2.3.4"], ["meta mark set 1"],
    ["iifname accept"], ["iifname", "jump"], ["ip saddr @set"], ["ip saddr $var"],
    ["ip daddr vmap { 1.2.3.4 : drop }"], ["{ { 1 } }"], ["}"], ["{ 1"], ['"eth0'],
    ["ip daddr 1.2.3.4 # comment"], ['iifname "a; drop"'], ["log prefix x"],
    ["ct count over 10"], ["limit rate 1/second"], ["ip saddr 1.2.3.4 notrack"],
    ["meta mark set 1"], ["ip daddr 1.2.3.4 reject"], ["ip daddr 1.2.3.4 queue"],
])
def test_conditions_refused(tokens) -> None:
    with pytest.raises(ValueError):
        hostport.conditions_text(tokens)


def test_legacy_owner_is_still_read() -> None:
    assert hostport.legacy_owner("abc", "net", "eth0") == "abc net eth0"
    # Too long or unsafe words: "=" and the first 16 hex digits of their UTF-8 SHA-256.
    long = hostport.legacy_owner("c" * 200, "n" * 200, "äöü#")
    assert long == "=5e39abe881f543e1 =1be63cc0bde6bd45 =33644f2f789ee240"
    owner = hostport.legacy_owner("abc", "net", "eth0")
    assert hostport.legacy_owner_in_network(owner, "net") == ("abc", "eth0")
    assert hostport.legacy_owner_in_network("abc", "net") is None  # the reference's bare IDs


def test_container_ips_first_per_family_on_the_sandbox_ifname() -> None:
    prev = {"interfaces": [{"name": "eth0"}, {"name": "eth0", "sandbox": "/n"},
                           {"name": "net1", "sandbox": "/n"}],
            "ips": [{"interface": 0, "address": "10.0.0.9/24"},
                    {"interface": 2, "address": "10.1.0.2/24"},
                    {"interface": 1, "address": "10.0.0.2/24"},
                    {"interface": 1, "address": "10.0.0.3/24"},
                    {"interface": 1, "address": "fd00::2/64"}]}
    assert container_ips(prev, "eth0") == {4: "10.0.0.2", 6: "fd00::2"}
