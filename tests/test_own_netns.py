"""The reference skel's CNI_NETNS_OVERRIDE rule: ADD and DEL refuse (code 8) a CNI_NETNS that is
the plugin's own network namespace. We refuse before running the plugin, so nothing changes; the
exec'd path and the daemon's child (which enters the caller's namespace first) answer alike.
Through the daemon the shim's fallback is off, and the daemon's own count shows it answered."""

from __future__ import annotations

import pytest
from cnitest import Netns, Plugins
from test_daemon import NO_DAEMON, start_daemon  # noqa: F401 (a fixture)

pytestmark = pytest.mark.root
LOOPBACK = {"cniVersion": "1.0.0", "name": "ownns", "type": "loopback"}


def bridge_conf(tmp_path) -> dict:
    return {"cniVersion": "1.0.0", "name": "ownns", "type": "bridge", "bridge": "ownbr0",
            "isGateway": True, "ipMasq": True,
            "ipam": {"type": "host-local", "subnet": "10.251.7.0/24",
                     "dataDir": str(tmp_path / "ipam")}}


class Via:
    """The env a test's requests go with, and (through the daemon) its proof it served them."""

    def __init__(self, via: str, host: Netns, start_daemon) -> None:  # noqa: F811
        self.daemon = start_daemon(host) if via == "daemon" else None
        self.env = self.daemon.env if self.daemon else NO_DAEMON

    def served(self, count: int) -> None:
        if self.daemon is not None:
            self.daemon.wait_served(count)


@pytest.mark.parametrize("via", ["exec", "daemon"])
@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_own_netns_is_refused_and_nothing_changes(via, command, plugins: Plugins, host: Netns,
                                                  start_daemon, tmp_path) -> None:  # noqa: F811
    path = Via(via, host, start_daemon)
    links, rules = set(host.links()), host.nft_ruleset()
    code, out, _ = plugins.exec("bridge", command, bridge_conf(tmp_path), netns=host.path,
                                env=path.env)
    assert code == 1, out
    assert out["code"] == 8, out
    assert out["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"
    path.served(1)
    assert host.path in out["details"] and "CNI_NETNS_OVERRIDE" in out["details"]
    assert set(host.links()) == links  # no bridge, no veth
    assert host.nft_ruleset() == rules  # no masquerade rule
    assert not (tmp_path / "ipam").exists()  # no reservation


@pytest.mark.parametrize("via", ["exec", "daemon"])
@pytest.mark.parametrize("override", ["1", "true", "TRUE"])
def test_override_allows_the_own_netns(via, override, plugins: Plugins, host: Netns,
                                       start_daemon) -> None:  # noqa: F811
    path = Via(via, host, start_daemon)
    env = path.env | {"CNI_NETNS_OVERRIDE": override}
    host.run("ip", "link", "set", "lo", "down")
    plugins.ok("loopback", "ADD", LOOPBACK, netns=host.path, ifname="lo", env=env)
    assert "UP" in host.links()["lo"]["flags"]
    plugins.ok("loopback", "DEL", LOOPBACK, netns=host.path, ifname="lo", env=env)
    assert "UP" not in host.links()["lo"]["flags"]
    path.served(2)


def test_other_values_do_not_override(plugins: Plugins, host: Netns) -> None:
    host.run("ip", "link", "set", "lo", "down")
    code, out, _ = plugins.exec("loopback", "ADD", LOOPBACK, netns=host.path, ifname="lo",
                                env=NO_DAEMON | {"CNI_NETNS_OVERRIDE": "yes"})
    assert code == 1 and out["code"] == 8
    assert "UP" not in host.links()["lo"]["flags"]
