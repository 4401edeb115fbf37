"""pycni as a user installs it: the wheel built from this checkout (`python -m build`: the sdist,
then the wheel from the sdist) in a fresh venv outside the tree, its dependencies from a local
wheelhouse, run from there only (cwd elsewhere, nothing of the checkout on sys.path):
`pycni install` into scratch dirs with the systemd units, cnitool's chain with that venv's daemon
and without one, the daemon's version as it and `pycni doctor` report it, `pycni uninstall`.
PYCNI_WHEEL_PYTHON picks the venv's interpreter (`.ci/run` runs this under 3.12 and 3.13)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import wheels
from clients import ENV, Node, PycniDaemon, cleanup, leftovers, need, wait_for

import cni

ROOT = wheels.ROOT
CNITOOL = ROOT.parent / "shared" / "reference" / "bin" / "cnitool"  # libcni v1.3.0's
NODE_IP = "192.0.2.31"
HOSTPORT = 8093
NETWORK = "pycni"  # conf/10-pycni.conflist, the one `pycni install` writes by default
PLUGINS = 4  # loopback, bridge (host-local in-process), portmap, bandwidth


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    return wheels.build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, built) -> wheels.Venv:
    return wheels.make_venv(tmp_path_factory.mktemp("wheel-venv") / "venv", built[1])


def user_env(**extra: str) -> dict[str, str]:
    """A root shell's environment: no PYTHONPATH, no checkout venv on PATH."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", **extra}


def test_the_wheel_carries_install_data_and_metadata(built) -> None:
    sdist, wheel = built
    meta = wheels.wheel_metadata(wheel)
    assert f"\nVersion: {cni.__version__}\n" in meta
    assert "\nRequires-Python: >=3.11\n" in meta
    assert "\nLicense-Expression: Apache-2.0\n" in meta and "\nLicense-File: LICENSE\n" in meta
    for minor in (11, 12, 13):
        assert f"\nClassifier: Programming Language :: Python :: 3.{minor}\n" in meta
    assert "\nProject-URL: " in meta and "\nKeywords: " in meta
    assert "\nDescription-Content-Type: text/markdown\n" in meta
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        assert z.read("cni/data/cni-plugin") == (ROOT / "bin" / "cni-plugin").read_bytes()
        for conf in (ROOT / "conf").iterdir():
            assert z.read(f"cni/data/conf/{conf.name}") == conf.read_bytes()
        assert z.read("cni/data/README.md") == (ROOT / "README.md").read_bytes()
    assert sdist.name == f"pycni-{cni.__version__}.tar.gz"


def test_installed_wheel_runs_without_the_checkout(venv, tmp_path) -> None:
    site = venv.site_packages()
    where = venv.run(venv.python, "-c", "import cni, sys; print(cni.__file__); print(sys.path)",
                     cwd=tmp_path, env=user_env())
    cni_file, path = where.splitlines()
    assert Path(cni_file) == site / "cni" / "__init__.py"
    assert str(ROOT) not in path
    asked = wheels.base_python()
    version = venv.run(asked, "-c", "import sys; print(sys.version_info[:2])", env=user_env())
    assert venv.run(venv.python, "-c", "import sys; print(sys.version_info[:2])",
                    env=user_env()) == version
    assert venv.run(venv.pycni, "--version", env=user_env()) == f"pycni {cni.__version__}\n"


def test_install_and_uninstall_from_the_wheel(venv, tmp_path) -> None:
    """`pycni install` from the venv into scratch dirs, the units too (systemctl faked, its calls
    logged), then `pycni uninstall`: nothing left."""
    site = venv.site_packages()
    bin_dir, conf_dir, units = tmp_path / "bin", tmp_path / "net.d", tmp_path / "systemd"
    tools, log = tmp_path / "tools", tmp_path / "systemctl.log"
    tools.mkdir()
    (tools / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (tools / "systemctl").chmod(0o755)
    env = user_env(PATH=f"{tools}:{user_env()['PATH']}")
    venv.run(venv.pycni, "install", "--bin-dir", bin_dir, "--conf-dir", conf_dir,
             "--systemd-dir", units, cwd=tmp_path, env=env)
    multicall = (bin_dir / "pycni-plugin").read_text().splitlines()
    assert multicall[0].startswith(f"#!{venv.path}/bin/python") and multicall[0].endswith(" -IS")
    # the package's copy install made (cni/install/copies.py: pip upgrades site-packages in place),
    # then the venv's site-packages for the dependencies
    [lib] = (bin_dir / ".pycni-lib").iterdir()
    assert lib.name.startswith(f"{cni.__version__}-")
    assert (lib / "cni" / "skel.py").read_bytes() == (site / "cni" / "skel.py").read_bytes()
    assert f"_root = {str(lib)!r}  # pycni:root" in multicall
    assert [line for line in multicall if line.startswith("sys.path")] == [
        "sys.path.insert(0, _root)  # pycni:path",
        f"sys.path.append({str(site)!r})  # pycni:path"]
    assert (conf_dir / "10-pycni.conflist").read_bytes() == \
        (ROOT / "conf" / "10-pycni.conflist").read_bytes()
    service = (units / "pycni.service").read_text().splitlines()
    assert f"ExecStart={venv.pycni} daemon" in service
    socket_unit = (units / "pycni.socket").read_text().splitlines()
    assert f"Documentation=file://{site / 'cni' / 'data' / 'README.md'}" in socket_unit
    # An installed plugin, exec'd as a runtime does: it runs the venv's package.
    proc = subprocess.run([str(bin_dir / "bridge")], input=b'{"cniVersion": "1.0.0"}',
                          env={"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"},
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cniVersion"] == "1.0.0"

    venv.run(venv.pycni, "uninstall", "--bin-dir", bin_dir, cwd=tmp_path, env=env)
    assert not bin_dir.exists() and not conf_dir.exists() and not units.exists()
    assert log.read_text().splitlines() == [
        "daemon-reload", "enable --now pycni.socket", "try-restart pycni.service",
        "disable --now pycni.socket pycni.service", "daemon-reload"]


# ---- the chain through cnitool, on a throwaway node ------------------------------------------


@pytest.fixture
def node(node_netns, tmp_path, venv) -> Iterator[tuple[Node, Path, Path]]:
    """A node whose /opt/cni/bin and /etc/cni/net.d hold what the wheel's `pycni install` wrote
    (their own /var/lib/cni); uninstall at the end must leave both empty."""
    need("nsenter", "unshare", "busybox", "curl", "tc", "nft")
    assert CNITOOL.is_file(), f"{CNITOOL} missing (shared/reference/bin provides it)"
    node_netns.run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    bin_dir, conf_dir, state = tmp_path / "bin", tmp_path / "net.d", tmp_path / "var-lib-cni"
    for d in (bin_dir, conf_dir):
        d.mkdir()
    venv.run(venv.pycni, "install", "--bin-dir", bin_dir, "--conf-dir", conf_dir,
             "--no-systemd", cwd=tmp_path, env=user_env())
    n = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(n.stop):
        yield n, state, tmp_path
    venv.run(venv.pycni, "uninstall", "--bin-dir", bin_dir, cwd=tmp_path, env=user_env())
    assert list(bin_dir.iterdir()) == [] and list(conf_dir.iterdir()) == []


def cnitool_chain(n: Node, state: Path, work: Path, tag: str, env: dict[str, str]) -> None:
    """cnitool add (hostPort, bandwidth), check, traffic to the gateway and through the
    hostPort, del; then nothing of the attachment is left on the node."""
    ns = f"pycni-wheel-{tag}"
    netns = f"/var/run/netns/{ns}"
    cid = "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]
    www = work / f"www-{tag}"
    www.mkdir()
    (www / "index.html").write_text(f"hello from the wheel {tag}\n")
    env = {"CNI_PATH": "/opt/cni/bin", "NETCONFPATH": "/etc/cni/net.d", **env,
           "CAP_ARGS": json.dumps({
               "portMappings": [{"hostPort": HOSTPORT, "containerPort": 80, "protocol": "tcp"}],
               "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 100_000,
                             "egressRate": 1_000_000, "egressBurst": 100_000}})}
    n.run("ip", "netns", "add", ns)
    srv = None
    try:
        result = json.loads(n.run(str(CNITOOL), "add", NETWORK, netns, env=env).stdout)
        addr = ipaddress.ip_interface(result["ips"][0]["address"])
        assert addr.ip in ipaddress.ip_network("10.88.0.0/16"), result
        pod = json.loads(n.run("ip", "-n", ns, "-j", "addr", "show", "dev", "eth0").stdout)
        assert str(addr) in [f"{a['local']}/{a['prefixlen']}" for a in pod[0]["addr_info"]]
        n.run(str(CNITOOL), "check", NETWORK, netns, env=env)
        n.run("ip", "netns", "exec", ns, "ping", "-c1", "-W3", result["ips"][0]["gateway"])
        qdiscs = json.loads(n.run("tc", "-j", "qdisc", "show").stdout)
        assert any(q["kind"] == "tbf" for q in qdiscs), qdiscs
        assert cid in n.run("nft", "list", "ruleset").stdout
        srv = n.popen("ip", "netns", "exec", ns, "busybox", "httpd", "-f", "-p", "80", "-h",
                      str(www))
        got = wait_for("the hostPort", lambda: subprocess.run(
            n.argv("curl", "-fsS", "--max-time", "3", f"http://{NODE_IP}:{HOSTPORT}/"),
            capture_output=True, text=True).stdout, timeout=30)
        assert got == f"hello from the wheel {tag}\n"
        n.run(str(CNITOOL), "del", NETWORK, netns, env=env)
    finally:
        if srv is not None:
            srv.kill()
            srv.wait()
        n.run("ip", "netns", "del", ns, check=False)
    host_links = lambda *a: json.loads(n.run("ip", "-j", *a).stdout)  # noqa: E731
    assert leftovers(host_links, state, NETWORK, [cid]) == []
    assert cid not in n.run("nft", "list", "ruleset").stdout


def test_cnitool_chain_through_the_wheels_daemon(node, venv) -> None:
    """Requests go to the venv's `pycni daemon` only (the shims' fallback off): its own count
    says it answered every plugin call; it reports the version it runs, not the one on disk."""
    n, state, work = node
    daemon = PycniDaemon(n, work / "daemon", pycni=venv.pycni)
    with cleanup(daemon.stop):
        cmdline = Path(f"/proc/{_daemon_figures(daemon)['pid']}/cmdline").read_bytes()
        # The console script's interpreter runs it: [venv python, venv pycni, daemon, ...].
        assert cmdline.split(b"\0")[1:3] == [bytes(venv.pycni), b"daemon"], cmdline
        assert cmdline.startswith(bytes(venv.path / "bin" / "python")), cmdline
        before = daemon.answered()
        cnitool_chain(n, state, work, "d", daemon.env)
        assert daemon.answered() - before == 3 * PLUGINS  # add, check, del
        _daemon_reports_its_running_version(n, venv, daemon)


def test_cnitool_chain_in_process(node) -> None:
    """No daemon: the installed shims run the plugins in-process from the venv."""
    n, state, work = node
    cnitool_chain(n, state, work, "p", {"PYCNI_SOCKET": str(work / "no-daemon.sock")})


def _daemon_figures(daemon: PycniDaemon) -> dict:
    from cni.fast import status

    figures = status.query(str(daemon.socket), timeout=30)
    assert figures is not None and figures["version"] == cni.__version__, figures
    return figures


def _daemon_reports_its_running_version(n: Node, venv: wheels.Venv, daemon: PycniDaemon) -> None:
    """A newer version on disk (as an upgrade leaves it before the restart): the status query
    still says the daemon's own, and `pycni doctor` says the two differ."""
    from cni.fast import status

    init = venv.site_packages() / "cni" / "__init__.py"
    original = init.read_text()
    newer = "99.0.0"
    init.write_text(original.replace(f'"{cni.__version__}"', f'"{newer}"'))
    try:
        figures = status.query(str(daemon.socket), timeout=30)
        assert figures is not None and figures["version"] == cni.__version__
        proc = n.run(str(venv.pycni), "doctor", "--json", check=False, cwd="/",
                     env={**ENV, "PYCNI_SOCKET": str(daemon.socket)})
        found = {f["what"]: f for f in json.loads(proc.stdout)}
        assert found["daemon version"]["status"] == "warn", found["daemon version"]
        assert found["daemon version"]["detail"] == (
            f"{cni.__version__}, but pycni here is {newer}")
    finally:
        init.write_text(original)
    assert os.path.getsize(init) == len(original.encode())
