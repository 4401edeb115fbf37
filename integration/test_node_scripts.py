"""The Vagrant scenario's scripts (integration/vagrant/*.sh) run on a throwaway node here, as far
as this machine allows: `pycni install --force` over a runtime's bundled plugins, `pycni doctor`,
the cnitool scenario with our libcni-built cnitool (integration/cnitool: Debian packages libcni
but no cnitool) and with `pycni` standing in for it (same arguments, environment and container
IDs), and `pycni uninstall` restoring what was there.
The crictl/containerd-CRI/CRI-O steps need those packages and run on the VM only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from clients import ROOT, VENV_PY, Node, cleanup, need
from cnitest import REFERENCE_BIN
from rootskips import have

pytestmark = pytest.mark.root
SCRIPTS = ROOT / "integration" / "vagrant"
NODE_IP = "192.0.2.30"


def snapshot(*dirs: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for d in dirs:
        for p in [d, *sorted(d.rglob("*"))]:
            body = (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else b"")
            out[str(p)] = (p.lstat().st_mode, body)
    return out


@pytest.fixture(scope="session")
def libcni_cnitool() -> Path:
    """Our cnitool over Debian's libcni (integration/cnitool), built once into build/."""
    out = ROOT / "build" / "cnitool"
    subprocess.run([str(ROOT / "integration" / "cnitool" / "build.sh"), str(out)], check=True)
    return out


@pytest.mark.parametrize("client", ["libcni-cnitool", "pycni"])
def test_node_scripts_install_cnitool_scenario_uninstall(node_netns, tmp_path, client,
                                                         request) -> None:
    need("nsenter", "unshare", "curl", "busybox", "tc", "nft")
    cnitool = (request.getfixturevalue("libcni_cnitool") if client == "libcni-cnitool"
               else VENV_PY.parent / "pycni")
    node_netns.run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    bin_dir, conf_dir, state = tmp_path / "bin", tmp_path / "net.d", tmp_path / "var-lib-cni"
    for d in (bin_dir, conf_dir):
        d.mkdir()
    # What a runtime package leaves on a node: the reference plugins and its own conflist.
    for name in ("bridge", "host-local", "macvlan"):
        if have((REFERENCE_BIN / name).exists(), f"{REFERENCE_BIN / name}"):
            shutil.copy2(REFERENCE_BIN / name, bin_dir / name)
    (conf_dir / "11-crio-ipv4-bridge.conflist").write_text('{"name": "crio"}')
    before = snapshot(bin_dir, conf_dir)
    env = {"CNITOOL": str(cnitool), "PYCNI_NODE_IP": NODE_IP}
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(node.stop):
        out = node.run("bash", str(SCRIPTS / "install-pycni.sh"), env=env).stdout
        assert "wrote /opt/cni/bin/pycni-plugin" in out
        assert "all required items present" in out  # pycni doctor, on the node
        assert "note: another conflist" not in out  # 10-pycni sorts before 11-crio
        assert (bin_dir / "bridge").is_symlink()
        proc = node.run("bash", str(SCRIPTS / "cnitool.sh"), env=env, timeout=180)
        assert "ok: cnitool" in proc.stdout, proc.stdout + proc.stderr
        node.run(str(VENV_PY.parent / "pycni"), "uninstall", "--bin-dir", "/opt/cni/bin")
    assert snapshot(bin_dir, conf_dir) == before
    assert [p.name for p in (state / "networks" / "pycni").iterdir()
            if p.name != "lock" and not p.name.startswith("last_reserved")] == []
