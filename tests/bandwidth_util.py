"""Helpers for the bandwidth tests: wire a pod to the host namespace, read tc state back."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cnitest import Netns

from cni.host import links, netns, tc


@dataclass
class Wired:
    pod: Netns
    veth: str  # host end
    host_ip: str
    pod_ip: str

    def prev_result(self, version: str = "1.1.0") -> dict:
        """What a main plugin (bridge, ptp) would have returned for this wiring."""
        return {
            "cniVersion": version,
            "interfaces": [{"name": self.veth},
                           {"name": "eth0", "sandbox": self.pod.path}],
            "ips": [{"interface": 1, "address": f"{self.pod_ip}/24"}],
        }


def wire(host: Netns, pod: Netns, n: int) -> Wired:
    """A veth pair host<->pod on 10.77.<n>.0/24 (host .1, pod .2)."""
    veth = f"vbw{n}"
    host.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
             "netns", pod.name)
    host_ip, pod_ip = f"10.77.{n}.1", f"10.77.{n}.2"
    host.run("ip", "addr", "add", f"{host_ip}/24", "dev", veth)
    host.run("ip", "link", "set", veth, "up")
    pod.run("ip", "addr", "add", f"{pod_ip}/24", "dev", "eth0")
    pod.run("ip", "link", "set", "eth0", "up")
    return Wired(pod, veth, host_ip, pod_ip)


def conf(version: str = "1.1.0", name: str = "bwnet", **extra) -> dict:
    return {"cniVersion": version, "name": name, "type": "bandwidth", **extra}


def runtime_bw(ingress: tuple[int, int] | None = None,
               egress: tuple[int, int] | None = None) -> dict:
    bw = {}
    if ingress:
        bw |= {"ingressRate": ingress[0], "ingressBurst": ingress[1]}
    if egress:
        bw |= {"egressRate": egress[0], "egressBurst": egress[1]}
    return {"runtimeConfig": {"bandwidth": bw}}


def tbf_of(host: Netns, dev: str) -> tc.Tbf | None:
    """The root tbf of `dev` in `host`, read over netlink."""
    with netns.iproute(host.path) as ipr:
        link = links.get(ipr, dev)
        assert link is not None, f"{dev} not in {host.name}"
        return tc.read_tbf(ipr, link.index)


def qdiscs(host: Netns, dev: str) -> list[dict]:
    out = host.run("tc", "-j", "qdisc", "show", "dev", dev).stdout
    return json.loads(out) if out.strip() else []


def kinds(host: Netns, dev: str) -> list[str]:
    return sorted(q["kind"] for q in qdiscs(host, dev))


def ifbs(host: Netns) -> dict[str, dict]:
    return {name: link for name, link in host.links().items()
            if link.get("linkinfo", {}).get("info_kind") == "ifb"}


def redirect_targets(host: Netns, dev: str) -> list[str]:
    """Devices the ingress filters of `dev` redirect to, from `tc -j filter show`."""
    out = host.run("tc", "-j", "filter", "show", "dev", dev, "ingress").stdout
    targets = []
    for f in json.loads(out) if out.strip() else []:
        for action in f.get("options", {}).get("actions", []):
            if action.get("kind") == "mirred":
                targets.append(action["to_dev"])
    return targets


def foreign_tbf(host: Netns, dev: str) -> None:
    """A tbf someone else put on `dev`, with the handle bandwidth (and the reference) gives its
    own (1:): only a record tells them apart."""
    host.run("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", "1mbit",
             "burst", "10kb", "latency", "50ms")
