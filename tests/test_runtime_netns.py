"""pycni against real plugins and real namespaces: our loopback, and the reference Go plugins
(/usr/lib/cni: loopback, bridge, host-local) that nobody here wrote. Everything runs inside a
throwaway "host" namespace; conflists, the cache and host-local's store live in tmp dirs.

No cnitool binary is packaged for Debian (only libcni's Go source), so interoperability with
cnitool is covered by the byte-level cache tests in test_runtime.py, written from libcni's source.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
from cnitest import BIN, REFERENCE_BIN, REFERENCE_PLUGINS, ROOT, VENV_PY, Netns
from rootskips import skip_unless
from test_runtime import Fakes

pytestmark = pytest.mark.root

needs_reference = skip_unless((REFERENCE_BIN / "bridge").exists(), REFERENCE_PLUGINS)


class Pycni:
    """`python -m cni.cli` run inside the host namespace with cnitool's environment."""

    def __init__(self, host: Netns, tmp: Path, cni_path: str) -> None:
        self.host = host
        self.netconf = tmp / "net.d"
        self.cache = tmp / "cache"
        self.netconf.mkdir(exist_ok=True)
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "NETCONFPATH": str(self.netconf), "CNI_PATH": cni_path,
                    "PYCNI_CACHE_DIR": str(self.cache)}

    def conflist(self, name: str, body: dict) -> None:
        (self.netconf / f"10-{name}.conflist").write_text(json.dumps({"name": name, **body}))

    def __call__(self, *args: str, ok: bool = True, **env: str):
        proc = self.host.run(str(VENV_PY), "-m", "cni.cli", *args, check=False, cwd=ROOT,
                             env={**self.env, **env})
        if ok:
            assert proc.returncode == 0, f"pycni {args} failed: {proc.stderr}"
        return proc

    def cached(self) -> list[str]:
        results = self.cache / "results"
        return sorted(p.name for p in results.iterdir()) if results.exists() else []


def cid(netns: str) -> str:
    import hashlib

    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def ipv4(ns: Netns, ifname: str) -> list[str]:
    return [a for a in ns.addresses(ifname) if ":" not in a]


def lo_up(ns: Netns) -> bool:
    return "UP" in ns.links()["lo"]["flags"]


def test_pycni_add_then_del_loopback(host: Netns, pod: Netns, tmp_path: Path) -> None:
    pycni = Pycni(host, tmp_path, str(BIN))
    pycni.conflist("lo", {"cniVersion": "1.1.0", "plugins": [{"type": "loopback"}]})
    pod.run("ip", "link", "set", "lo", "down")
    result = json.loads(pycni("add", "lo", pod.path).stdout)
    assert result["interfaces"] == [{"name": "lo", "mac": "00:00:00:00:00:00",
                                     "sandbox": pod.path}]
    assert lo_up(pod)
    assert pycni.cached() == [f"lo-{cid(pod.path)}-eth0"]
    cached = json.loads((pycni.cache / "results" / pycni.cached()[0]).read_text())
    assert (cached["netns"], cached["result"]["interfaces"][0]["name"]) == (pod.path, "lo")
    pycni("check", "lo", pod.path)
    pycni("del", "lo", pod.path)
    assert not lo_up(pod)
    assert pycni.cached() == []


def test_add_failing_half_way_runs_nothing_after_and_caches_nothing(
        host: Netns, pod: Netns, tmp_path: Path) -> None:
    (tmp_path / "fakes").mkdir()
    fakes = Fakes(tmp_path / "fakes")
    fakes.plugin("fails", ADD={"stdout": '{"code": 11, "msg": "try later"}', "exit": 1})
    fakes.plugin("after")
    pycni = Pycni(host, tmp_path, f"{fakes.bin}:{BIN}")
    pycni.conflist("half", {"cniVersion": "1.1.0", "plugins": [
        {"type": "loopback"}, {"type": "fails"}, {"type": "after"}]})
    pod.run("ip", "link", "set", "lo", "down")
    proc = pycni("add", "half", pod.path, ok=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == 'plugin type="fails" failed (add): try later'
    assert lo_up(pod)  # the first plugin ran ...
    assert [c["plugin"] for c in fakes.calls()] == ["fails"]  # ... the third never did
    assert pycni.cached() == []


def reference_net(pycni: Pycni, tmp_path: Path, name: str = "refnet",
                  **list_keys: object) -> tuple[str, Path]:
    bridge = f"pbr{secrets.token_hex(3)}"
    data_dir = tmp_path / "ipam"
    body = {"cniVersion": "1.0.0", **list_keys, "plugins": [
        {"type": "loopback"},
        {"type": "bridge", "bridge": bridge, "isGateway": True,
         "ipam": {"type": "host-local", "subnet": "10.99.7.0/24", "dataDir": str(data_dir)}}]}
    pycni.conflist(name, body)
    return bridge, data_dir / name


def reserved(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name[0].isdigit()) \
        if store.exists() else []


@needs_reference
def test_reference_go_chain_through_pycni(host: Netns, pod: Netns, tmp_path: Path) -> None:
    pycni = Pycni(host, tmp_path, str(REFERENCE_BIN))
    bridge, store = reference_net(pycni, tmp_path)
    result = json.loads(pycni("add", "refnet", pod.path).stdout)
    address = result["ips"][0]["address"]
    assert address.startswith("10.99.7.") and result["cniVersion"] == "1.0.0"
    assert ipv4(pod, "eth0") == [address]
    assert ipv4(host, bridge) == ["10.99.7.1/24"]
    assert reserved(store) == [address.split("/")[0]]
    cache_name = f"refnet-{cid(pod.path)}-eth0"
    assert pycni.cached() == [cache_name]
    pycni("check", "refnet", pod.path)  # the Go plugins check against the cached prevResult

    pycni("del", "refnet", pod.path)
    assert "eth0" not in pod.links()
    assert reserved(store) == []
    assert pycni.cached() == []


@needs_reference
def test_gc_dels_the_cached_attachments_not_in_the_valid_list(
        host: Netns, netns_factory, tmp_path: Path) -> None:
    pods = [netns_factory("pycni-pod") for _ in range(2)]
    pycni = Pycni(host, tmp_path, str(REFERENCE_BIN))
    _, store = reference_net(pycni, tmp_path)
    for pod in pods:
        pycni("add", "refnet", pod.path)
    assert len(reserved(store)) == 2

    keep = json.dumps([{"containerID": cid(pods[0].path), "ifname": "eth0"}])
    pycni("gc", "refnet", "--valid-attachments", keep)
    assert "eth0" in pods[0].links() and "eth0" not in pods[1].links()
    assert pycni.cached() == [f"refnet-{cid(pods[0].path)}-eth0"]
    assert len(reserved(store)) == 1

    pycni("gc", "refnet", "--valid-attachments", "[]")
    assert "eth0" not in pods[0].links()
    assert pycni.cached() == [] and reserved(store) == []


@needs_reference
def test_one_list_chains_our_1_1_plugin_and_the_reference_1_0_bridge(
        host: Netns, pod: Netns, tmp_path: Path) -> None:
    # Our loopback speaks 1.1.0, the reference bridge at most 1.0.0: with cniVersions the
    # runtime gives each the highest version it speaks and converts prevResult between them.
    ours = tmp_path / "ours"  # only our loopback: bridge must resolve to the reference's
    ours.mkdir()
    (ours / "loopback").symlink_to(BIN / "loopback")
    pycni = Pycni(host, tmp_path, f"{ours}:{REFERENCE_BIN}")
    _, store = reference_net(pycni, tmp_path, cniVersions=["1.0.0", "1.1.0"])
    body = json.loads((pycni.netconf / "10-refnet.conflist").read_text())
    body["cniVersion"] = "1.1.0"
    pycni.conflist("refnet", body)
    result = json.loads(pycni("add", "refnet", pod.path).stdout)
    assert result["cniVersion"] == "1.0.0"  # the last plugin's result
    assert ipv4(pod, "eth0") == [result["ips"][0]["address"]]
    assert lo_up(pod)
    pycni("check", "refnet", pod.path)
    pycni("gc", "refnet", "--valid-attachments", "[]")  # DEL, then GC to loopback only
    assert "eth0" not in pod.links() and not lo_up(pod)
    assert pycni.cached() == [] and reserved(store) == []
