"""Config keys are matched case-insensitively, as Go's encoding/json matches the reference's
structs: containerd's CRI sends `HostPort`, `IngressRate`. An exact-case key wins over a
differently cased duplicate, and errors name the key as the user wrote it."""

from __future__ import annotations

import json

import pytest

from cni import skel
from cni.ipam import config as ipam_config
from cni.plugins import bandwidth, bridge, portmap
from cni.spec import keys, names
from cni.spec.errors import CNIError


def request(config: dict, args: str = "") -> skel.Request:
    """A Request as skel.run builds it from this config on stdin (no kernel work)."""
    folded = keys.match(skel.decode_config(json.dumps(config).encode()), skel.COMMON_KEYS)
    return skel.Request(plugin=config.get("type", "x"), command="ADD", container_id="c1",
                        netns="/run/netns/x", ifname="eth0", args=names.parse_args(args), path=[],
                        config=folded, version="1.0.0", stdin=b"", env={})


# --- the matcher itself -------------------------------------------------------------------------

@pytest.mark.parametrize("raw,expected", [
    ({"HostPort": 1}, {"hostPort": 1}),
    ({"HOSTPORT": 1}, {"hostPort": 1}),
    ({"hostport": 1, "other": 2}, {"hostPort": 1, "other": 2}),
    ({"hostPort": 1, "HostPort": 2}, {"hostPort": 1}),  # exact wins, whatever the order
    ({"HostPort": 2, "hostPort": 1}, {"hostPort": 1}),
    ({"HostPort": 2, "HOSTPORT": 3}, {"hostPort": 3}),  # no exact: the last one, as Go
    ({"ho\u017ftPort": 5}, {"hostPort": 5}),  # long s folds to s in Go's EqualFold
    ({"Unknown": 1}, {"Unknown": 1}),  # unknown keys kept as written
])
def test_match(raw, expected) -> None:
    assert keys.match(raw, ["hostPort"]) == expected


def test_written_names_the_users_spelling() -> None:
    found = keys.match({"HostPort": 1, "protocol": "tcp"}, ["hostPort", "protocol", "hostIP"])
    assert (found.written("hostPort"), found.written("protocol"), found.written("hostIP")) == (
        "HostPort", "protocol", "hostIP")
    assert keys.written_path({"Ipam": {"Ranges": [[{"SUBNET": 1}]]}},
                             ["ipam", "ranges", 0, 0, "subnet"]) == ["Ipam", "Ranges", 0, 0,
                                                                     "SUBNET"]


# --- each capability, as containerd's CRI sends it ----------------------------------------------

def test_port_mappings_capitalised() -> None:
    req = request({"type": "portmap", "runtimeConfig": {"portMappings": [
        {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
        {"hostPort": 53, "HostPort": 9999, "containerPort": 53, "protocol": "UDP",
         "hostIP": "127.0.0.1"}]}})
    got = portmap.parse_mappings(req.runtime_config.get("portMappings"))
    assert [(m.host_port, m.container_port, m.protocol, m.host_ip) for m in got] == [
        (8080, 80, "tcp", ""), (53, 53, "udp", "127.0.0.1")]


def test_port_mapping_error_names_the_key_as_written() -> None:
    req = request({"runtimeConfig": {"portMappings": [{"HostPort": None, "ContainerPort": 80,
                                                       "Protocol": "tcp"}]}})
    with pytest.raises(CNIError) as e:
        portmap.parse_mappings(req.runtime_config.get("portMappings"))
    assert e.value.code == 7
    assert "runtimeConfig.portMappings[0].HostPort null" in e.value.msg


def test_bandwidth_capitalised_with_containerd_burst() -> None:
    req = request({"type": "bandwidth", "runtimeConfig": {"bandwidth": {
        "IngressRate": 1_000_000, "IngressBurst": 4294967295,
        "EgressRate": 2_000_000, "EgressBurst": 4294967295}}})
    got = bandwidth.limits(req)
    assert got is not None and got.ingress is not None and got.egress is not None
    assert (got.ingress.rate, got.egress.rate) == (1_000_000, 2_000_000)
    # MaxUint32 means "no burst known": derived from the rate, not a 512 MB bucket.
    assert got.ingress.burst is None and got.egress.burst is None
    assert got.ingress.rate_key == "runtimeConfig.bandwidth.IngressRate"


def test_bandwidth_exact_key_wins_and_errors_name_it() -> None:
    req = request({"runtimeConfig": {"bandwidth": {"ingressRate": 8000, "IngressRate": 1,
                                                   "ingressBurst": 800}}})
    got = bandwidth.limits(req)
    assert got is not None and got.ingress is not None
    assert (got.ingress.rate, got.ingress.burst) == (8000, 800)
    bad = request({"runtimeConfig": {"bandwidth": {"IngressRate": 8000}}})
    with pytest.raises(CNIError, match="runtimeConfig.bandwidth.IngressRate: 8000: "):
        bandwidth.limits(bad)


def test_bandwidth_top_level_keys_capitalised() -> None:
    req = request({"type": "bandwidth", "IngressRate": 8000, "IngressBurst": 800})
    got = bandwidth.limits(req)
    assert got is not None and got.ingress is not None and got.egress is None
    assert (got.ingress.rate, got.ingress.burst) == (8000, 800)


def test_runtime_config_and_annotations_capability_names() -> None:
    req = request({"RuntimeConfig": {"IO.Kubernetes.CRI.Pod-Annotations": {
        "kubernetes.io/ingress-bandwidth": "1M"}}})
    got = bandwidth.limits(req)
    assert got is not None and got.ingress is not None and got.ingress.rate == 1_000_000


@pytest.mark.parametrize("runtime,args,expected", [
    ({"IPs": ["10.1.0.9"]}, {}, ["10.1.0.9"]),
    ({"ips": ["10.1.0.9"], "IPS": ["10.1.0.10"]}, {}, ["10.1.0.9"]),
    ({}, {"CNI": {"IPS": ["10.1.0.11"]}}, ["10.1.0.11"]),
])
def test_host_local_requested_ips(runtime, args, expected) -> None:
    config = {"cniVersion": "1.0.0", "name": "n", "RuntimeConfig": runtime, "Args": args,
              "IPAM": {"Type": "host-local", "Ranges": [[{"Subnet": "10.1.0.0/24"}]]}}
    req = request(config)
    got = ipam_config.load(req.config, "1.0.0", [])
    assert [str(ip) for ip in got.requested] == expected
    assert str(got.ranges[0][0].network) == "10.1.0.0/24"


def test_host_local_ip_ranges_capability() -> None:
    config = {"name": "n", "runtimeConfig": {"IPRanges": [[{"Subnet": "10.2.0.0/24"}]]},
              "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/24"}]]}}
    got = ipam_config.load(request(config).config, "1.0.0", [])
    assert str(got.ranges[0][0].network) == "10.2.0.0/24"


def test_host_local_error_names_key_as_written() -> None:
    config = {"name": "n", "IPAM": {"type": "host-local", "Ranges": [[{"Subnet": 5}]]}}
    with pytest.raises(CNIError) as e:
        ipam_config.load(request(config).config, "1.0.0", [])
    assert e.value.code == 7 and "IPAM.Ranges.0.0.Subnet" in e.value.msg, e.value.msg


def test_bridge_keys_and_mac_capability() -> None:
    req = request({"type": "bridge", "Bridge": "br7", "IsGateway": True, "isGateway": False,
                   "IPMasq": True, "MTU": 1400, "RuntimeConfig": {"Mac": "02:00:00:00:00:07"},
                   "ipam": {"Type": "host-local"}})
    conf = bridge.load(req)
    assert (conf.bridge, conf.isGateway, conf.ipMasq, conf.mtu) == ("br7", False, True, 1400)
    assert conf.mac == "02:00:00:00:00:07" and conf.ipam_type == "host-local"


def test_bridge_derived_fields_not_settable_however_cased() -> None:
    req = request({"type": "bridge", "MAC": "02:00:00:00:00:09", "Vlans": [5]})
    conf = bridge.load(req)
    assert conf.mac == "" and not conf.vlans


def test_bridge_type_error_names_key_as_written() -> None:
    with pytest.raises(CNIError, match="IsGateway"):
        bridge.load(request({"type": "bridge", "IsGateway": "yes"}))


def test_gc_valid_attachments_entries_capitalised() -> None:
    req = request({"cni.dev/valid-attachments": [{"ContainerID": "a", "IfName": "eth0"}]})
    assert skel.valid_attachments(req.config) == {("a", "eth0")}


def test_is_one_of_folds_as_go_and_skips_keys_that_are_not_strings() -> None:
    assert keys.is_one_of("ingressRate", bandwidth.KEYS)
    assert keys.is_one_of("IngressRate", bandwidth.KEYS)  # containerd's CRI spelling
    assert keys.is_one_of("INGRESSBURST", bandwidth.KEYS)
    assert keys.is_one_of("maſk", ("mask",))  # the long s folds to s, as EqualFold
    assert not keys.is_one_of("ingress_rate", bandwidth.KEYS)
    assert not keys.is_one_of(1, bandwidth.KEYS)
    assert not keys.is_one_of(None, ("mac",))
