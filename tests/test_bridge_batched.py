"""bridge ADD's batched netlink sends, when the kernel refuses one of their requests.

The pod interface's addresses, its up and its routes go to the kernel in one send (two with an
IPv6 gateway: DAD settles between), and the host end's port flags with the bridge's MAC pin in
another (cni.host.dumps.writes_redone). The kernel runs every request of a send, whatever
became of the ones before: the first it refused, in the order they were once sent one by one,
must still be the error, in the words it had alone (the texts here are what the ADD said when
each request had a send of its own), and the failed ADD must leave nothing behind: no veth, no
reservation, no masquerade rule.
"""

from __future__ import annotations

import json
import re

import pytest
from bridge_util import conf, host_veths, ipam_path, masq_rules, reservations
from cnitest import ROOT, VENV_PY

pytestmark = pytest.mark.root

OK_A = {"dst": "10.50.0.0/16"}
OK_B = {"dst": "10.70.0.0/16"}
UNREACHABLE_1 = {"dst": "10.60.0.0/16", "gw": "10.99.99.1"}  # no route to either gateway
UNREACHABLE_2 = {"dst": "10.80.0.0/16", "gw": "10.98.98.1"}


def unreachable(route: dict) -> str:
    return (f"failed to add route '{route['dst']} via {route['gw']} dev eth0': "
            "Network is unreachable")


def existing_bridge(plugins, pod, tmp_path) -> None:
    """An ADD and DEL before: cni0 exists with its gateway address, and the ADD under test
    pins the MAC it finds in the same send as the port's flags."""
    plugins.ok("bridge", "ADD", conf(tmp_path), netns=pod.path, container_id="first",
               path=ipam_path())
    plugins.ok("bridge", "DEL", conf(tmp_path), netns=pod.path, container_id="first",
               path=ipam_path())


def nothing_left(host, pod, tmp_path) -> None:
    assert host_veths(host) == [], "the failed ADD left its veth"
    assert "eth0" not in pod.links()
    assert reservations(tmp_path) == [], "the failed ADD left its reservation"
    assert masq_rules(host) == [], "the failed ADD left a masquerade rule"


@pytest.mark.parametrize("ipam_routes, refused", [
    pytest.param([OK_A, UNREACHABLE_1, OK_B], UNREACHABLE_1, id="the middle one refused"),
    pytest.param([UNREACHABLE_1, OK_A, UNREACHABLE_2], UNREACHABLE_1, id="two refused"),
    pytest.param([OK_A, OK_A, UNREACHABLE_2], UNREACHABLE_2,
                 id="an identical route accepted, a later one refused"),
])
def test_a_refused_route_is_the_error_it_was_alone_and_nothing_is_left(
        plugins, host, pod, tmp_path, ipam_routes, refused) -> None:
    c = conf(tmp_path, isDefaultGateway=True, ipMasq=True)
    c["ipam"]["routes"] = ipam_routes
    existing_bridge(plugins, pod, tmp_path)
    code, out, _ = plugins.exec("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert code == 1 and (out["code"], out["msg"]) == (999, unreachable(refused)), out
    nothing_left(host, pod, tmp_path)


def test_an_identical_route_is_fine_and_the_routes_after_it_are_added(plugins, host, pod,
                                                                       tmp_path) -> None:
    c = conf(tmp_path, isDefaultGateway=True)
    c["ipam"]["routes"] = [OK_A, OK_A, OK_B]
    out = plugins.ok("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    got = {(r["dst"], r.get("gateway"), r["dev"]) for r in pod.ip("route", "show")}
    assert {("10.50.0.0/16", "10.22.0.1", "eth0"), ("10.70.0.0/16", "10.22.0.1", "eth0"),
            ("default", "10.22.0.1", "eth0"), ("10.22.0.0/24", None, "eth0")} <= got, got
    assert pod.addresses("eth0")[:1] == ["10.22.0.2/24"]
    assert "UP" in pod.links()["eth0"]["flags"]
    plugins.ok("bridge", "CHECK", c | {"prevResult": out}, netns=pod.path, path=ipam_path())
    plugins.ok("bridge", "DEL", c, netns=pod.path, path=ipam_path())
    nothing_left(host, pod, tmp_path)


def static(addresses: list[dict], routes: list[dict], **keys) -> dict:
    """A bridge whose IPAM is the reference's static plugin: addresses host-local never gives."""
    return {"cniVersion": "1.0.0", "name": "testnet", "type": "bridge", "bridge": "cni0",
            "isGateway": True, "ipMasq": True, **keys,
            "ipam": {"type": "static", "addresses": addresses, "routes": routes}}


@pytest.mark.parametrize("addresses, routes, msg", [
    pytest.param([{"address": "10.30.0.5/24"}, {"address": "10.30.0.5/24"}],
                 [{"dst": "10.50.0.0/16", "gw": "10.30.0.1"}],
                 'failed to add IP addr 10.30.0.5/24 to "eth0": File exists',
                 id="an address twice, a route after it"),
    pytest.param([{"address": "10.30.0.5/24"}, {"address": "10.30.0.6/24"}],
                 [{"dst": "10.50.0.0/16", "gw": "10.31.0.1"},
                  {"dst": "10.60.0.0/16", "gw": "10.30.0.1"}],
                 "failed to add route '10.50.0.0/16 via 10.31.0.1 dev eth0': "
                 "Network is unreachable", id="a route through a gateway on no subnet"),
    pytest.param([{"address": "fd00:30::5/64", "gateway": "fd00:30::1"}],
                 [{"dst": "fd00:50::/64"}, {"dst": "fd00:60::/64", "gw": "fd00:99::1"}],
                 "failed to add route 'fd00:60::/64 via fd00:99::1 dev eth0': "
                 "No route to host", id="IPv6 gateway: a route after DAD settled"),
])
def test_a_refused_request_of_static_addresses_is_the_error_it_was_alone(
        plugins, host, pod, tmp_path, addresses, routes, msg) -> None:
    code, out, _ = plugins.exec("bridge", "ADD", static(addresses, routes), netns=pod.path,
                                path=ipam_path())
    assert code == 1 and (out["code"], out["msg"]) == (999, msg), out
    nothing_left(host, pod, tmp_path)


# The host end's port flags and the bridge's MAC pin share a send. A real kernel refuses
# neither for a veth it just enslaved: the requests are sent to a link that is not there
# (ENODEV) by wrapping links.message, which builds both, before (request by request) and now.
_REFUSED = """
import json, sys
from cni import skel
from cni.host import links

refuse = set(sys.argv[2].split(","))
built = links.message

def message(msg_type, index=0, ifname=None, flags=0, change=0, attrs=()):
    names = [name for name, _ in attrs]
    port = names == ["IFLA_LINKINFO"] and attrs[0][1]["attrs"][0][1] == "bridge_slave"
    mac = names == ["IFLA_ADDRESS"]
    if ("port" in refuse and port) or ("mac" in refuse and mac):
        index = 2**31 - 1  # no such link
    return built(msg_type, index, ifname, flags, change, attrs)

links.message = message
reply = skel.run("bridge", json.loads(sys.argv[1]), sys.stdin.buffer.read())
sys.stdout.write(reply.stdout.decode())
"""


@pytest.mark.parametrize("refuse, msg", [
    ("port", r"failed to setup hairpin mode for veth[0-9a-f]{8}: \(19, 'No such device'\)"),
    ("mac", r"could not set bridge's mac: \(19, 'No such device'\)"),
    ("port,mac",
     r"failed to setup hairpin mode for veth[0-9a-f]{8}: \(19, 'No such device'\)"),
])
def test_a_refused_port_flag_or_mac_pin_is_the_error_it_was_alone(
        plugins, host, pod, tmp_path, refuse, msg) -> None:
    c = conf(tmp_path, hairpinMode=True, ipMasq=True)
    existing_bridge(plugins, pod, tmp_path)
    mac = host.links()["cni0"]["address"]
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": ipam_path()}
    proc = host.run(str(VENV_PY), "-c", _REFUSED, json.dumps(env), refuse,
                    input=json.dumps(c), cwd=ROOT, check=False)
    out = json.loads(proc.stdout)
    assert out["code"] == 999 and re.fullmatch(msg, out["msg"]), out
    nothing_left(host, pod, tmp_path)
    assert host.links()["cni0"]["address"] == mac


def test_a_port_not_forwarding_when_read_with_the_gateway_is_waited_for_as_before(
        plugins, host, pod, tmp_path) -> None:
    # With isGateway the host end is first read in the send of the bridge's address dump, once
    # the pod's end is up: a port that is not forwarding there is polled as before. On a
    # bridge running STP the port listens, then learns, for forward_delay each (2 s at least):
    # longer than the wait, so the ADD fails with the port's state, and is undone.
    host.run("ip", "link", "add", "cni0", "type", "bridge", "stp_state", "1",
             "forward_delay", "2")
    c = conf(tmp_path, ipMasq=True)
    code, out, _ = plugins.exec("bridge", "ADD", c, netns=pod.path, path=ipam_path())
    assert code == 1 and (out["code"], out["msg"]) == (999, "bridge port in error state: UP")
    nothing_left(host, pod, tmp_path)
