"""loopback through the exec'd binary, in throwaway namespaces."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.root

CONF = {"cniVersion": "1.1.0", "name": "lo", "type": "loopback"}


def lo_up(ns) -> bool:
    return "UP" in ns.links()["lo"]["flags"]


def test_add_sets_lo_up_and_reports_it(plugins, netns_factory) -> None:
    pod = netns_factory("pycni-pod")
    pod.run("ip", "link", "set", "lo", "down")
    out = plugins.ok("loopback", "ADD", CONF, netns=pod.path, ifname="lo")
    assert lo_up(pod)
    assert out == {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": pod.path}],
        "ips": [{"interface": 0, "address": "127.0.0.1/8"},
                {"interface": 0, "address": "::1/128"}],
    }  # no empty "dns" from 1.0.0 on, as v1.9.1
    pod.run("ping", "-c1", "-W1", "127.0.0.1")


def test_add_by_proc_path_and_prev_result_passthrough(plugins, pod) -> None:
    pod.run("ip", "link", "set", "lo", "down")
    # `ip netns exec` execs sleep, so the Popen pid is the process inside the pod namespace.
    holder_proc = subprocess.Popen(["ip", "netns", "exec", pod.name, "sleep", "30"])
    holder = holder_proc.pid
    try:
        prev = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}],
                "dns": {}}
        conf = CONF | {"cniVersion": "0.4.0", "prevResult": prev}
        out = plugins.ok("loopback", "ADD", conf, netns=f"/proc/{holder}/ns/net", ifname="lo")
        assert out == {"cniVersion": "0.4.0", **{k: v for k, v in prev.items()
                                                  if k != "cniVersion"}}
        assert lo_up(pod)
    finally:
        holder_proc.kill()
        holder_proc.wait()


def test_del_sets_lo_down_and_check_notices(plugins, pod) -> None:
    plugins.ok("loopback", "ADD", CONF, netns=pod.path, ifname="lo")
    plugins.ok("loopback", "CHECK", CONF, netns=pod.path, ifname="lo")
    plugins.ok("loopback", "DEL", CONF, netns=pod.path, ifname="lo")
    assert not lo_up(pod)
    code, out, _ = plugins.exec("loopback", "CHECK", CONF, netns=pod.path, ifname="lo")
    assert code == 1 and "down" in out["msg"]


def test_del_with_missing_or_empty_netns_succeeds(plugins) -> None:
    plugins.ok("loopback", "DEL", CONF, netns="/run/netns/does-not-exist", ifname="lo")
    plugins.ok("loopback", "DEL", CONF, netns="", ifname="lo")


def test_add_with_missing_netns_is_code_4_and_creates_nothing(plugins) -> None:
    code, out, _ = plugins.exec("loopback", "ADD", CONF, netns="/run/netns/nope", ifname="lo")
    assert code == 1 and out["code"] == 4 and "CNI_NETNS" in out["msg"]
    import os
    assert not os.path.exists("/run/netns/nope")


def test_add_into_a_file_that_is_not_a_netns_is_refused(plugins, tmp_path) -> None:
    bogus = tmp_path / "ns"
    bogus.write_text("")
    code, out, _ = plugins.exec("loopback", "ADD", CONF, netns=str(bogus), ifname="lo")
    assert code == 1 and out["code"] == 4


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_prev_result_that_cannot_be_printed_changes_nothing(plugins, pod, version) -> None:
    """Found by the long fuzz: the error came after lo was already up."""
    pod.run("ip", "link", "set", "lo", "down")
    conf = CONF | {"cniVersion": version, "prevResult": {"cniVersion": "1.0.0", "ips": []}}
    code, out, err = plugins.exec("loopback", "ADD", conf, netns=pod.path, ifname="lo")
    assert code == 1 and "no valid IP addresses" in out["msg"] and "Traceback" not in err
    assert not lo_up(pod)
