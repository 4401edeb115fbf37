"""A plugin of one's own, as a third party ships it: examples/pycni-static-ipam (IPAM from a file
of reservations, entry point `static-file`) built into its wheel and installed beside pycni's in
a fresh venv, `pycni install` into scratch dirs (the name linked, listed in the manifest,
answering VERSION from the table install baked in), then a bridge network whose ipam.type is
`static-file` through cnitool, with the venv's daemon (its counts show it served the example)
and without one (in-process), and `pycni uninstall`: nothing left."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import wheels
from clients import PycniDaemon, cleanup, leftovers, need, wait_for
from test_wheel import user_env

ROOT = wheels.ROOT
EXAMPLE = ROOT / "examples" / "pycni-static-ipam"
# libcni v1.3.0's cnitool from ../shared (test_wheel's), found from a worktree (../../shared) too
CNITOOL = next((d / "shared" / "reference" / "bin" / "cnitool" for d in ROOT.parents
                if (d / "shared" / "reference" / "bin" / "cnitool").is_file()),
               ROOT.parent / "shared" / "reference" / "bin" / "cnitool")
NETWORK = "static-net"
SUBNET = "10.89.0.0/16"
GATEWAY = "10.89.0.1"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> wheels.Venv:
    return wheels.example_venv(tmp_path_factory, EXAMPLE, "pycni_static_ipam-0.1.0-")


def netns_and_cid(tag: str) -> tuple[str, str]:
    """cnitool's container ID for a netns path (its own rule)."""
    netns = f"/var/run/netns/pycni-static-{tag}"
    return netns, "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


@contextmanager
def installed_node(node_netns, tmp_path: Path, venv: wheels.Venv,
                   conflist: dict) -> Iterator[tuple]:
    """`pycni install` of the venv into scratch dirs with this conflist, a node whose CNI dirs
    they are; `pycni uninstall` after: nothing left."""
    need("nsenter", "unshare")
    assert CNITOOL.is_file(), f"{CNITOOL} missing (shared/reference/bin provides it)"
    from clients import Node

    bin_dir, conf_dir, state = tmp_path / "bin", tmp_path / "net.d", tmp_path / "var-lib-cni"
    for d in (bin_dir, conf_dir):
        d.mkdir()
    path = tmp_path / f"30-{conflist['name']}.conflist"
    path.write_text(json.dumps(conflist))
    out = venv.run(venv.pycni, "install", "--bin-dir", bin_dir, "--conf-dir", conf_dir,
                   "--conflist", path, "--no-systemd", cwd=tmp_path, env=user_env())
    assert "skipped" not in out, out
    n = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(n.stop):
        yield n, bin_dir, tmp_path
    venv.run(venv.pycni, "uninstall", "--bin-dir", bin_dir, cwd=tmp_path, env=user_env())
    assert list(bin_dir.iterdir()) == [] and list(conf_dir.iterdir()) == []


@pytest.fixture
def node(node_netns, tmp_path, venv) -> Iterator[tuple]:
    reservations = tmp_path / "reservations.json"
    reservations.write_text(json.dumps({"reservations": [
        {"containerID": netns_and_cid(tag)[1], "address": f"10.89.7.{n}/16", "gateway": GATEWAY}
        for n, tag in ((7, "d"), (8, "p"))]}))
    reservations.chmod(0o644)
    with installed_node(node_netns, tmp_path, venv, {
            "cniVersion": "1.0.0", "name": NETWORK, "plugins": [
                {"type": "bridge", "bridge": "cni-static0", "isGateway": True,
                 "ipam": {"type": "static-file", "file": str(reservations),
                          "routes": [{"dst": "0.0.0.0/0"}]}}]}) as it:
        yield it


def test_install_links_the_example_and_answers_its_version(venv, tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    venv.run(venv.pycni, "install", "--bin-dir", bin_dir, "--conf-dir", tmp_path / "net.d",
             "--no-systemd", cwd=tmp_path, env=user_env())
    manifest = json.loads((bin_dir / ".pycni-install.json").read_text())
    assert manifest["plugins"] == {"static-file": "pycni_static_ipam"}
    assert (bin_dir / "static-file").readlink() == Path("pycni-plugin")
    proc = subprocess.run([str(bin_dir / "static-file")], input=b'{"cniVersion":"0.4.0"}',
                          env={"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"},
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"cniVersion": "0.4.0", "supportedVersions": [
        "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    doctor = json.loads(venv.run(venv.pycni, "doctor", "--json", "--bin-dir", bin_dir,
                                 cwd=tmp_path, env=user_env()) or "[]")
    found = {f["what"]: f for f in doctor}
    assert found["plugin static-file"]["status"] == "ok", found.get("plugin static-file")
    venv.run(venv.pycni, "uninstall", "--bin-dir", bin_dir, cwd=tmp_path, env=user_env())
    assert not bin_dir.exists()


def chain(n, tag: str, env: dict[str, str]) -> None:
    """cnitool add: the pod's eth0 has the reserved address, the gateway answers; check; del."""
    netns, cid = netns_and_cid(tag)
    env = {"CNI_PATH": "/opt/cni/bin", "NETCONFPATH": "/etc/cni/net.d", **env}
    n.run("ip", "netns", "add", netns.rpartition("/")[2])
    try:
        result = json.loads(n.run(str(CNITOOL), "add", NETWORK, netns, env=env).stdout)
        want = f"10.89.7.{7 if tag == 'd' else 8}/16"
        assert [ip["address"] for ip in result["ips"]] == [want], result
        pod = json.loads(n.run("ip", "-n", netns.rpartition("/")[2], "-j", "addr", "show",
                               "dev", "eth0").stdout)
        assert want in [f"{a['local']}/{a['prefixlen']}" for a in pod[0]["addr_info"]]
        assert ipaddress.ip_interface(want).network == ipaddress.ip_network(SUBNET)
        n.run("ip", "netns", "exec", netns.rpartition("/")[2], "ping", "-c1", "-W3", GATEWAY)
        n.run(str(CNITOOL), "check", NETWORK, netns, env=env)
        n.run(str(CNITOOL), "del", NETWORK, netns, env=env)
    finally:
        n.run("ip", "netns", "del", netns.rpartition("/")[2], check=False)
    host_links = lambda *a: json.loads(n.run("ip", "-j", *a).stdout)  # noqa: E731
    assert leftovers(host_links, n.state_dir, NETWORK, [cid]) == []


def test_chain_through_the_daemon(node, venv) -> None:
    """The venv's daemon found the example's entry point at start and serves it: bridge's
    IPAM runs it in-process in bridge's child (3 requests: add, check, del); the example exec'd
    directly, as a runtime or another vendor's main plugin would, is a request of its own."""
    n, bin_dir, work = node
    daemon = PycniDaemon(n, work / "daemon", pycni=venv.pycni)
    with cleanup(daemon.stop):
        from cni.fast import status

        figures = status.query(str(daemon.socket), timeout=30)
        assert "static-file" in figures["plugins"]["served"], figures
        assert figures["plugins"]["refused"] == {}
        before = figures
        chain(n, "d", daemon.env)
        _netns, cid = netns_and_cid("d")
        ns = "pycni-static-x"
        n.run("ip", "netns", "add", ns)
        try:
            env = {**daemon.env, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
                   "CNI_NETNS": f"/var/run/netns/{ns}", "CNI_IFNAME": "eth0",
                   "CNI_PATH": str(bin_dir)}
            stdin = json.dumps({"cniVersion": "1.0.0", "name": NETWORK,
                                "ipam": {"type": "static-file",
                                         "file": str(work / "reservations.json")}})
            proc = n.run(str(bin_dir / "static-file"), input=stdin, env=env)
            assert json.loads(proc.stdout)["ips"][0]["address"] == "10.89.7.7/16"
            n.run(str(bin_dir / "static-file"), input=stdin, env={**env, "CNI_COMMAND": "DEL"})
        finally:
            n.run("ip", "netns", "del", ns, check=False)
        # a request is counted once its child is reaped, which may follow its reply
        after = wait_for("the daemon to count 5 requests", lambda: (
            figures := status.query(str(daemon.socket), timeout=30))["answered"]
            - before["answered"] >= 5 and figures, timeout=30)
        assert after["answered"] - before["answered"] == 3 + 2
        grew = {k: v - before["by_plugin"].get(k, 0) for k, v in after["by_plugin"].items()}
        assert {k: v for k, v in grew.items() if v} == {"bridge": 3, "static-file": 2}, after


def test_chain_in_process(node) -> None:
    """No daemon: the installed executables run bridge, and bridge the example, in-process."""
    n, _bin, work = node
    chain(n, "p", {"PYCNI_SOCKET": str(work / "no-daemon.sock")})
