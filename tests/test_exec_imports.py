"""What an exec without the daemon imports: bridge (with host-local run in-process) and portmap
load pydantic (config models) and pyroute2 (netlink): the libraries doing their jobs, imported
once by the daemon; an exec without it pays ~100 ms for each (each ADD stays <= 400 ms). What
they must never load is what belongs to the runner and the daemon: click and prometheus_client."""

from __future__ import annotations

import json

import pytest
from bridge_util import conf, ipam_path, masq_rules, reservations
from cnitest import probe_binary

pytestmark = pytest.mark.root

WATCH = ("click", "prometheus_client")


def test_bridge_and_portmap_verbs_load_none_of_the_costly_modules(host, pod, tmp_path) -> None:
    env = {"CNI_CONTAINERID": "ctr1", "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": ipam_path(), "PYCNI_SOCKET": "/nonexistent/pycni.sock"}
    bridge = conf(tmp_path, ipMasq=True)

    def run(plugin: str, command: str, config: dict) -> str:
        body, code, loaded = probe_binary(plugin, env | {"CNI_COMMAND": command},
                                          json.dumps(config).encode(), WATCH, netns=host.name)
        assert code == 0, (plugin, command, body)
        assert loaded == [], (plugin, command)
        return body

    result = json.loads(run("bridge", "ADD", bridge))
    assert reservations(tmp_path) and masq_rules(host)
    portmap = {"cniVersion": "1.0.0", "name": "testnet", "type": "portmap",
               "runtimeConfig": {"portMappings": [
                   {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                   {"hostPort": 8053, "containerPort": 53, "protocol": "udp"}]},
               "prevResult": result}
    run("portmap", "ADD", portmap)
    assert "dnat to" in host.run("nft", "list", "table", "ip", "cni_hostport").stdout
    run("portmap", "CHECK", portmap)
    run("bridge", "CHECK", bridge | {"prevResult": result})
    run("portmap", "DEL", portmap)
    run("bridge", "DEL", bridge)
    assert not reservations(tmp_path) and not masq_rules(host)
