"""Wiring for portmap tests: a node with a bridge, pods, an outside client and a far network.

    outside (192.168.77.2, fd77::2) --- host (192.168.77.1 / fd77::1) --- far (10.99.0.5, fd99::5)
                                         br0 10.88.0.1/24 fd88::1/64
                                          |-- pod N: eth0 10.88.0.N / fd88::N, default via br0

Servers and clients are small Python programs run in the namespaces, each with a hard time
limit; servers answer "<name> <peer address>" so tests can see who answered and from where.
"""

from __future__ import annotations

import select
import subprocess
from dataclasses import dataclass, field

import pytest
from cnitest import Netns

BR = {4: "10.88.0.1", 6: "fd88::1"}
HOST_OUT = {4: "192.168.77.1", 6: "fd77::1"}
OUTSIDE = {4: "192.168.77.2", 6: "fd77::2"}
FAR = {4: "10.99.0.5", 6: "fd99::5"}
LOCALHOST = {4: "127.0.0.1", 6: "::1"}

SERVER = r"""
import signal, socket, sys
proto, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
signal.alarm(120)  # never outlive a test run
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET6, kind)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", port))
def peer(addr):
    return addr[0].removeprefix("::ffff:")
if kind == socket.SOCK_STREAM:
    s.listen(16)
print("ready", flush=True)
while True:
    if kind == socket.SOCK_STREAM:
        c, addr = s.accept()
        c.sendall(f"{name} {peer(addr)}\n".encode())
        c.close()
    else:
        data, addr = s.recvfrom(2048)
        s.sendto(f"{name} {peer(addr)}\n".encode(), addr)
"""

CLIENT = r"""
import socket, sys
proto, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(family, kind)
s.settimeout(1.5)
try:
    s.connect((host, port))
    if kind == socket.SOCK_DGRAM:
        s.send(b"ping")
    print(s.recv(2048).decode().strip())
except ConnectionRefusedError:
    print("REFUSED")
except (TimeoutError, OSError) as e:
    print("TIMEOUT" if isinstance(e, TimeoutError) else f"ERROR {e}")
"""

# A UDP client that keeps one socket (one source port, so one conntrack entry) and sends a
# datagram each time it reads a line on stdin, printing the answer or TIMEOUT.
STEPPED_UDP_CLIENT = r"""
import socket, sys, signal
host, port = sys.argv[1], int(sys.argv[2])
signal.alarm(120)
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.5)
for _ in sys.stdin:
    s.sendto(b"ping", (host, port))
    try:
        print(s.recvfrom(2048)[0].decode().strip(), flush=True)
    except TimeoutError:
        print("TIMEOUT", flush=True)
"""


def _wire(host: Netns, peer: Netns, host_if: str, peer_if: str) -> None:
    host.run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if,
             "netns", peer.name)
    host.run("ip", "link", "set", host_if, "up")
    peer.run("ip", "link", "set", peer_if, "up")


def _addr(ns: Netns, ifname: str, *cidrs: str) -> None:
    for cidr in cidrs:
        extra = ["nodad"] if ":" in cidr else []
        ns.run("ip", "addr", "add", cidr, "dev", ifname, *extra)


@dataclass
class Node:
    """The test host and its neighbours; pods are added with `add_pod`."""

    host: Netns
    outside: Netns
    far: Netns
    pods: dict[str, tuple[Netns, int]] = field(default_factory=dict)

    def add_pod(self, ns: Netns) -> Netns:
        n = len(self.pods) + 2
        _wire(self.host, ns, f"vp{n}", "eth0")
        self.host.run("ip", "link", "set", f"vp{n}", "master", "br0")
        # As the bridge plugin's hairpinMode: with br_netfilter loaded, a pod reaching itself
        # through its hostPort is DNAT'ed while bridged and must leave by the port it came in.
        self.host.run("ip", "link", "set", f"vp{n}", "type", "bridge_slave", "hairpin", "on")
        _addr(ns, "eth0", f"10.88.0.{n}/24", f"fd88::{n}/64")
        ns.run("ip", "route", "add", "default", "via", BR[4])
        ns.run("ip", "-6", "route", "add", "default", "via", BR[6])
        self.pods[ns.name] = (ns, n)
        return ns

    def pod_ip(self, ns: Netns, family: int) -> str:
        n = self.pods[ns.name][1]
        return f"10.88.0.{n}" if family == 4 else f"fd88::{n}"

    def prev_result(self, ns: Netns, ifname: str = "eth0") -> dict:
        n = self.pods[ns.name][1]
        return {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "br0"}, {"name": f"vp{n}"},
                           {"name": ifname, "sandbox": ns.path}],
            "ips": [{"interface": 2, "address": f"10.88.0.{n}/24", "gateway": BR[4]},
                    {"interface": 2, "address": f"fd88::{n}/64", "gateway": BR[6]}],
        }  # an empty dns is left out at 1.x, by the bridge and by libcni, as v1.9.1's


def build_node(host: Netns, netns_factory) -> Node:
    node = Node(host, netns_factory("pycni-out"), netns_factory("pycni-far"))
    for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
        host.run("sysctl", "-qw", key)
    # Link-local addresses (which neighbour discovery needs) would sit tentative in DAD for a
    # second on every new link, losing the first datagram of a UDP test now and then.
    for ns in (host, node.outside, node.far):
        ns.run("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
    host.run("ip", "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
    host.run("ip", "link", "set", "br0", "up")
    _addr(host, "br0", f"{BR[4]}/24", f"{BR[6]}/64")
    _wire(host, node.outside, "vout", "eth0")
    _addr(host, "vout", f"{HOST_OUT[4]}/24", f"{HOST_OUT[6]}/64")
    _addr(node.outside, "eth0", f"{OUTSIDE[4]}/24", f"{OUTSIDE[6]}/64")
    node.outside.run("ip", "route", "add", "default", "via", HOST_OUT[4])
    node.outside.run("ip", "-6", "route", "add", "default", "via", HOST_OUT[6])
    _wire(host, node.far, "vfar", "eth0")
    _addr(host, "vfar", "10.99.0.1/24", "fd99::1/64")
    _addr(node.far, "eth0", f"{FAR[4]}/24", f"{FAR[6]}/64")
    node.far.run("ip", "route", "add", "default", "via", "10.99.0.1")
    node.far.run("ip", "-6", "route", "add", "default", "via", "fd99::1")
    return node


class Servers:
    """Servers started in namespaces; all killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, ns: Netns, proto: str, port: int, name: str) -> None:
        proc = subprocess.Popen(["ip", "netns", "exec", ns.name, "python3", "-c", SERVER,
                                 proto, str(port), name],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready and proc.stdout.readline().strip() == "ready", proc.stderr.read()

    def stepped_udp_client(self, ns: Netns, host: str, port: int) -> SteppedClient:
        proc = subprocess.Popen(["ip", "netns", "exec", ns.name, "python3", "-c",
                                 STEPPED_UDP_CLIENT, host, str(port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return SteppedClient(proc)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class SteppedClient:
    proc: subprocess.Popen

    def send(self) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        assert ready, "stepped client hung"
        return self.proc.stdout.readline().strip()


def ask(ns: Netns, proto: str, host: str, port: int) -> str:
    """One request from `ns`: the answer line, or REFUSED / TIMEOUT."""
    out = ns.run("python3", "-c", CLIENT, proto, host, str(port), timeout=15)
    return out.stdout.strip()


def answered_by(ns: Netns, proto: str, host: str, port: int) -> str:
    """Just the server name of the answer (or REFUSED / TIMEOUT)."""
    return ask(ns, proto, host, port).split(" ")[0]


RECORD_PREFIX = "pycni-att-"


def rules_with(ns: Netns, text: str) -> list[dict]:
    """Every container rule (not an attachment record) whose comment contains `text`."""
    return [o["rule"] for o in ns.nft_ruleset().get("nftables", [])
            if "rule" in o and text in o["rule"].get("comment", "")
            and not o["rule"]["chain"].startswith(RECORD_PREFIX)]


def records(ns: Netns) -> list[tuple[str, str, str]]:
    """(family, record chain, comment) of every attachment record chain, in any state."""
    objs = ns.nft_ruleset().get("nftables", [])
    comments = {(o["rule"]["family"], o["rule"]["chain"]): o["rule"].get("comment", "")
                for o in objs if "rule" in o}
    return sorted((o["chain"]["family"], o["chain"]["name"],
                   comments.get((o["chain"]["family"], o["chain"]["name"]), ""))
                  for o in objs if "chain" in o and o["chain"]["name"].startswith(RECORD_PREFIX))


def portmap_conf(prev: dict | None, mappings: list | None, **keys) -> dict:
    conf: dict = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap", **keys}
    if mappings is not None:
        conf["runtimeConfig"] = {"portMappings": mappings}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


# Fixtures test_portmap and test_firewall share (each imports them by name).
@pytest.fixture
def servers():
    made = Servers()
    yield made
    made.stop()


@pytest.fixture
def node(host, netns_factory):
    """The node of build_node with two pods on its bridge."""
    node = build_node(host, netns_factory)
    node.add_pod(netns_factory("pycni-poda"))
    node.add_pod(netns_factory("pycni-podb"))
    return node
