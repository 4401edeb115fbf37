"""A chained plugin of one's own, written from docs/PLUGINS.md: examples/pycni-sysctl-chained
(entry point `sysctl-chained`) built into its wheel, installed beside pycni's in a fresh venv,
`pycni install` into scratch dirs, then a conflist bridge (host-local) + sysctl-chained run by
cnitool in a real pod namespace, through the venv's daemon and in-process: ADD passes bridge's
result on and sets the sysctl (read back from the kernel in the pod's namespace), CHECK passes,
then fails (999, naming the key) once the sysctl is changed behind its back; DEL leaves nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import wheels
from clients import PycniDaemon, cleanup, leftovers
from test_plugin_example import CNITOOL, installed_node, netns_and_cid

EXAMPLE = wheels.ROOT / "examples" / "pycni-sysctl-chained"
NETWORK = "sysctl-net"
KEY = "net.ipv4.conf.IFNAME.accept_local"  # 0 in a new namespace; bridge leaves it alone
PROC = "/proc/sys/net/ipv4/conf/eth0/accept_local"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> wheels.Venv:
    return wheels.example_venv(tmp_path_factory, EXAMPLE, "pycni_sysctl_chained-0.1.0-")


@pytest.fixture
def node(node_netns, tmp_path, venv) -> Iterator[tuple]:
    with installed_node(node_netns, tmp_path, venv, {
            "cniVersion": "1.0.0", "name": NETWORK, "plugins": [
                {"type": "bridge", "bridge": "cni-sysctl0", "isGateway": True,
                 "ipam": {"type": "host-local", "subnet": "10.91.0.0/24"}},
                {"type": "sysctl-chained", "key": KEY, "value": "1"}]}) as it:
        yield it


def direct_check(n, bin_dir: Path, env: dict[str, str], tag: str, result: dict) -> dict:
    """CHECK exec'd as a runtime execs it; the error JSON it prints (it must fail)."""
    netns, cid = netns_and_cid(tag)
    stdin = json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "type": "sysctl-chained",
                        "key": KEY, "value": "1", "prevResult": result})
    proc = n.run(str(bin_dir / "sysctl-chained"), input=stdin, check=False,
                 env={**env, "CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid,
                      "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir)})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def chain(n, bin_dir: Path, tag: str, env: dict[str, str]) -> None:
    netns, cid = netns_and_cid(tag)
    ns = netns.rpartition("/")[2]
    env = {"CNI_PATH": "/opt/cni/bin", "NETCONFPATH": "/etc/cni/net.d", **env}
    read = lambda: n.run("ip", "netns", "exec", ns, "cat", PROC).stdout.strip()  # noqa: E731
    n.run("ip", "netns", "add", ns)
    try:
        result = json.loads(n.run(str(CNITOOL), "add", NETWORK, netns, env=env).stdout)
        # bridge's result, passed on: the pod's veth and its host-local address
        assert [i["name"] for i in result["interfaces"]][-1] == "eth0", result
        assert result["ips"][0]["address"].startswith("10.91.0."), result
        assert read() == "1"
        n.run(str(CNITOOL), "check", NETWORK, netns, env=env)
        n.run("ip", "netns", "exec", ns, "sh", "-c", f"echo 0 > {PROC}")  # behind its back
        failed = n.run(str(CNITOOL), "check", NETWORK, netns, env=env, check=False)
        assert failed.returncode != 0 and "accept_local" in failed.stdout + failed.stderr
        # the plugin's own answer, as the runtime gets it: code 999 naming key and values
        err = direct_check(n, bin_dir, env, tag, result)
        assert err["code"] == 999, err
        assert "net/ipv4/conf/eth0/accept_local is '0', configured '1'" in err["msg"], err
        n.run(str(CNITOOL), "del", NETWORK, netns, env=env)
    finally:
        n.run("ip", "netns", "del", ns, check=False)
    host_links = lambda *a: json.loads(n.run("ip", "-j", *a).stdout)  # noqa: E731
    assert leftovers(host_links, n.state_dir, NETWORK, [cid]) == []


def test_chained_example_through_the_daemon(node, venv) -> None:
    n, bin_dir, work = node
    daemon = PycniDaemon(n, work / "daemon", pycni=venv.pycni)
    with cleanup(daemon.stop):
        from cni.fast import status

        figures = status.query(str(daemon.socket), timeout=30)
        assert "sysctl-chained" in figures["plugins"]["served"], figures
        chain(n, bin_dir, "cd", daemon.env)
        counts = status.query(str(daemon.socket), timeout=30)["by_plugin"]
        assert counts.get("sysctl-chained", 0) >= 3, counts  # add, check, check


def test_chained_example_in_process(node) -> None:
    n, bin_dir, work = node
    chain(n, bin_dir, "cp", {"PYCNI_SOCKET": str(work / "no-daemon.sock")})


def test_pip_upgrade_reaches_in_process_at_once_and_a_daemon_at_its_restart(node, venv,
                                                                           tmp_path) -> None:
    """docs/PLUGINS.md's answer, run: after `pip install -U` of the plugin (same pycni), an exec
    without the daemon runs the new code at once; the running daemon serves the code it imported
    at start until it restarts. Last in this module: it leaves the venv with 0.2.0."""
    n, bin_dir, work = node
    src = tmp_path / "v2"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pyproject, module = src / "pyproject.toml", src / "pycni_sysctl_chained" / "__init__.py"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    module.write_text(module.read_text().replace('f"sysctl-chained: {key}',
                                                 'f"sysctl-chained 0.2: {key}'))
    wheel = wheels.build_wheel(tmp_path / "dist2", src)
    netns, _cid = netns_and_cid("cu")
    ns = netns.rpartition("/")[2]
    daemon = PycniDaemon(n, work / "daemon", pycni=venv.pycni)
    env = {"CNI_PATH": "/opt/cni/bin", "NETCONFPATH": "/etc/cni/net.d"}
    alone = {"PYCNI_SOCKET": str(work / "no-daemon.sock")}
    n.run("ip", "netns", "add", ns)
    try:
        with cleanup(daemon.stop):
            result = json.loads(n.run(str(CNITOOL), "add", NETWORK, netns,
                                      env={**env, **daemon.env}).stdout)
            n.run("ip", "netns", "exec", ns, "sh", "-c", f"echo 0 > {PROC}")
            venv.run(venv.python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                     wheel)
            old = direct_check(n, bin_dir, {**env, **daemon.env}, "cu", result)["msg"]
            new = direct_check(n, bin_dir, {**env, **alone}, "cu", result)["msg"]
            assert old.startswith("sysctl-chained: ") and new.startswith("sysctl-chained 0.2: ")
        restarted = PycniDaemon(n, work / "daemon2", pycni=venv.pycni)
        with cleanup(restarted.stop):
            msg = direct_check(n, bin_dir, {**env, **restarted.env}, "cu", result)["msg"]
            assert msg.startswith("sysctl-chained 0.2: "), msg
        n.run(str(CNITOOL), "del", NETWORK, netns, env={**env, **alone})
    finally:
        n.run("ip", "netns", "del", ns, check=False)
