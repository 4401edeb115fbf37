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
from clients import PycniDaemon, cleanup, leftovers, need
from test_plugin_example import CNITOOL, netns_and_cid
from test_wheel import user_env

EXAMPLE = wheels.ROOT / "examples" / "pycni-sysctl-chained"
NETWORK = "sysctl-net"
KEY = "net.ipv4.conf.IFNAME.accept_local"  # 0 in a new namespace; bridge leaves it alone
PROC = "/proc/sys/net/ipv4/conf/eth0/accept_local"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> wheels.Venv:
    dist = tmp_path_factory.mktemp("dist")
    _, pycni_wheel = wheels.build(dist / "pycni")
    src = dist / "example-src"  # a copy: setuptools leaves build/ and egg-info in the source
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    example_wheel = wheels.build_wheel(dist / "example", src)
    assert example_wheel.name.startswith("pycni_sysctl_chained-0.1.0-")
    v = wheels.make_venv(tmp_path_factory.mktemp("chained-venv") / "venv", pycni_wheel)
    v.install(example_wheel)
    return v


@pytest.fixture
def node(node_netns, tmp_path, venv) -> Iterator[tuple]:
    need("nsenter", "unshare")
    assert CNITOOL.is_file(), f"{CNITOOL} missing (shared/reference/bin provides it)"
    from clients import Node

    bin_dir, conf_dir, state = tmp_path / "bin", tmp_path / "net.d", tmp_path / "var-lib-cni"
    for d in (bin_dir, conf_dir):
        d.mkdir()
    conflist = tmp_path / "40-sysctl.conflist"
    conflist.write_text(json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "plugins": [
        {"type": "bridge", "bridge": "cni-sysctl0", "isGateway": True,
         "ipam": {"type": "host-local", "subnet": "10.91.0.0/24"}},
        {"type": "sysctl-chained", "key": KEY, "value": "1"}]}))
    out = venv.run(venv.pycni, "install", "--bin-dir", bin_dir, "--conf-dir", conf_dir,
                   "--conflist", conflist, "--no-systemd", cwd=tmp_path, env=user_env())
    assert "skipped" not in out, out
    n = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(n.stop):
        yield n, bin_dir, tmp_path
    venv.run(venv.pycni, "uninstall", "--bin-dir", bin_dir, cwd=tmp_path, env=user_env())
    assert list(bin_dir.iterdir()) == [] and list(conf_dir.iterdir()) == []


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
        stdin = json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "type": "sysctl-chained",
                            "key": KEY, "value": "1", "prevResult": result})
        proc = n.run(str(bin_dir / "sysctl-chained"), input=stdin, check=False,
                     env={**env, "CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid,
                          "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir)})
        err = json.loads(proc.stdout)
        assert proc.returncode == 1 and err["code"] == 999, err
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
