"""deploy/pycni.yaml against the Kubernetes API schemas of the versions README names
(`kubernetes-validate --strict`: no API server runs here), and what the DaemonSet must carry for
the daemon to serve the node (the node's network and PID namespaces, privileged, the host paths,
the install into them first). The pod itself runs in integration/test_daemonset.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "pycni.yaml"
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
# README's install section: "checked against the API schemas of Kubernetes 1.30, 1.31 and 1.33"
README_VERSIONS = re.compile(r"API schemas of\s+Kubernetes\s+((?:1\.\d+(?:,\s+|\s+and\s+)?)+)")


def versions() -> list[str]:
    found = README_VERSIONS.search((ROOT / "README.md").read_text())
    assert found, "README names no Kubernetes versions for deploy/pycni.yaml"
    return re.findall(r"1\.\d+", found.group(1))


def documents(path: Path = MANIFEST) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def validate(path: Path, version: str) -> subprocess.CompletedProcess:
    if not VALIDATE.exists():
        pytest.fail(f"no {VALIDATE}: make setup installs the dev extras (kubernetes-validate)")
    return subprocess.run([str(VALIDATE), "--strict", "--kubernetes-version", version, str(path)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("version", versions())
def test_manifest_is_valid_against_the_api_schema(version) -> None:
    proc = validate(MANIFEST, version)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for kind in ("namespace/pycni-system", "configmap/pycni-config", "daemonset/pycni"):
        assert f"passed for resource {kind} against version {version}" in proc.stdout, \
            proc.stdout


def test_the_validator_refuses_an_unknown_field(tmp_path) -> None:
    """--strict is what catches a misspelt key: the same manifest with `hostPid` fails."""
    bad = tmp_path / "pycni.yaml"
    text = MANIFEST.read_text()
    assert "hostPID: true" in text
    bad.write_text(text.replace("hostPID: true", "hostPid: true"))
    proc = validate(bad, versions()[0])
    assert proc.returncode != 0, proc.stdout
    assert "hostPid" in proc.stdout + proc.stderr


def test_daemonset_runs_install_then_the_daemon_on_the_nodes_paths() -> None:
    docs = documents()
    ds = docs["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]
    update = ds["spec"]["updateStrategy"]
    assert update["type"] == "RollingUpdate"
    assert update["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths.values()) == {"/opt/cni/bin", "/etc/cni/net.d", "/run/pycni",
                                        "/var/lib/cni", "/run/netns", "/etc/containerd"}
    [init] = spec["initContainers"]
    [daemon] = spec["containers"]
    for c in (init, daemon):
        assert c["securityContext"]["privileged"] is True
        assert c["image"] == daemon["image"]
    argv = init["command"] + init["args"]
    assert argv[:3] == ["/opt/pycni/bin/pycni", "install", "--forwarder"]
    mounts = {m["mountPath"]: host_paths.get(m["name"]) for m in init["volumeMounts"]}
    assert argv[argv.index("--bin-dir") + 1] in mounts
    assert mounts[argv[argv.index("--bin-dir") + 1]] == "/opt/cni/bin"
    assert mounts[argv[argv.index("--conf-dir") + 1]] == "/etc/cni/net.d"
    # --take-over: the rolling update's new daemon takes the socket path from the old one
    assert daemon["command"] + daemon["args"] == ["/opt/pycni/bin/pycni", "daemon", "--socket",
                                                  "/run/pycni/pycni.sock", "--take-over"]
    daemon_mounts = {m["mountPath"]: host_paths.get(m["name"]) for m in daemon["volumeMounts"]}
    assert daemon_mounts["/run/pycni"] == "/run/pycni"  # the socket the forwarder dials
    assert "/run/pycni/pycni.sock" in " ".join(daemon["readinessProbe"]["exec"]["command"])


def test_init_container_installs_the_containerd_template_where_the_runtime_reads_it() -> None:
    """The node's pod CIDR through containerd's conf_template: the template goes into the node's
    conf dir under a name no runtime loads as a config (libcni's ConfFiles and CRI-O's ocicni
    take .conf, .conflist, .json), its cluster CIDR is the ConfigMap's (install's
    --cluster-cidr from the env), and the node's containerd config is mounted read-only so
    install knows whether containerd renders it; the manifest's comments give the key to set."""
    from cni.install import cluster

    docs = documents()
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    args = init["args"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    template = Path(args[args.index("--containerd-template") + 1])
    assert template.suffix not in (".conf", ".conflist", ".json")
    assert str(template.parent) == args[args.index("--conf-dir") + 1]
    node_template = Path(host_paths[mounts[str(template.parent)]["name"]]) / template.name
    assert "--cluster-cidr" not in args
    [env] = [e for e in init["env"] if e["name"] == "PYCNI_CLUSTER_CIDR"]
    ref = env["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == docs["ConfigMap"]["metadata"]["name"]
    cidr = docs["ConfigMap"]["data"][ref["key"]]
    assert cluster.cluster_networks([cidr]) == [cidr]  # valid as written
    config = mounts[args[args.index("--containerd-config") + 1]]
    assert config["readOnly"] is True and host_paths[config["name"]] == "/etc/containerd"
    head = MANIFEST.read_text().split("\napiVersion:", 1)[0]
    for plugin in cluster.CRI_PLUGINS:  # containerd 1.6/1.7, 2.x
        assert re.search(rf"{re.escape(plugin)}.*\.cni\]\s*#\s+conf_template = "
                         rf'"{re.escape(str(node_template))}"', head), plugin


def test_configmap_conflist_is_the_shipped_one_for_cri() -> None:
    """The ConfigMap's conflist is conf/10-pycni.conflist at 1.0.0 without loopback (the CRI
    runtime adds its own): the one the CRI tests run."""
    conf = json.loads(documents()["ConfigMap"]["data"]["10-pycni.conflist"])
    shipped = json.loads((ROOT / "conf" / "10-pycni.conflist").read_text())
    shipped["cniVersion"] = "1.0.0"
    shipped["plugins"] = [p for p in shipped["plugins"] if p["type"] != "loopback"]
    assert conf == shipped


def test_readme_names_versions_the_validator_has() -> None:
    import kubernetes_validate

    have = {p.name.split("-")[0].lstrip("v").rsplit(".", 1)[0]
            for p in (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema")
            .iterdir()}
    assert set(versions()) <= have, (versions(), sorted(have))
