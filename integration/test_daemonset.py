"""deploy/pycni.yaml's DaemonSet run as kubelet runs it, on a throwaway containerd node.

The pod template is translated into the CRI calls kubelet makes for it: RunPodSandbox with the
node's network and PID namespaces (hostNetwork, hostPID) and privileged; each init container
created, started and run to completion, then the main container;
volumes as kubelet mounts them (hostPath: the node's dirs, here the test node's; the ConfigMap:
kubelet's atomic-writer dir, a subPath bind-mounting the file); the readiness probe through
ExecSync. The image is `make image`'s (integration/image.py, built once, cached in build/image).

Then pods made through CRI get their network from the daemon in the DaemonSet's container: the
node's bin dir holds the forwarder (plugin names linked to it) and the conflist is the
ConfigMap's; hostPort answers, bandwidth's tbfs are there, CHECK passes, DEL leaves nothing.
The node has no pycni of its own: the Python executable install wrote names the image's
interpreter (/opt/pycni/bin/python), absent on the node, so the forwarder cannot fall back to it
and a call with the daemon gone answers error 11 (docs/DESIGN.md "The forwarder").
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clients import ROOT, need, wait_for
from crinode import (
    NODE_ADDR,
    RATE,
    CRINode,
    cri_node,
    http_get,
    imported_root,
    links_of_kind,
    run_web_pod,
    runner_check,
    shared_leftovers,
    tbf_rates,
    wait_host_port,
)

pytestmark = pytest.mark.root
MANIFEST = ROOT / "deploy" / "pycni.yaml"
CONFLIST = "10-pycni.conflist"
RENDERED = "10-containerd-net.conflist"  # where containerd renders its conf_template


def manifest() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


@pytest.fixture(scope="session")
def pycni_image() -> Path:
    """`make image`'s archive with the forwarder in it (built here if missing or stale), or
    PYCNI_IMAGE_ARCHIVE's (the VM's, built on the host: its checkout is no git tree)."""
    sys.path.insert(0, str(ROOT / "integration"))
    import image

    if given := os.environ.get("PYCNI_IMAGE_ARCHIVE"):
        return Path(given)
    need("mmdebstrap", "buildah", "go")

    if not image.FORWARDER.is_file():
        subprocess.run(["make", "-C", str(ROOT), "forwarder"], check=True, capture_output=True,
                       timeout=900)
    try:
        archive, _ = image.build()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        pytest.fail(f"make image failed: {e}")
    return archive


@pytest.fixture(scope="module")
def node_images(pause_image, oci_image, pycni_image, tmp_path_factory) -> Path:
    """The containerd nodes' images (the pause, the web pod's, pycni's) imported once for the
    module: each node's containerd starts on a copy of that root (crinode.imported_root)."""
    need("containerd", "ctr")
    return imported_root(tmp_path_factory.mktemp("node-images"),
                         [pause_image, oci_image, pycni_image])


def configmap_volume(dest: Path, data: dict[str, str]) -> Path:
    """A ConfigMap volume as kubelet's atomic writer lays it out: the files in a timestamped
    dir, `..data` linking to it, each name linking through `..data`."""
    stamp = dest / "..2026_12_06_00_00_00.000000000"
    stamp.mkdir(parents=True)
    for name, text in data.items():
        (stamp / name).write_text(text)
        (stamp / name).chmod(0o644)
        (dest / name).symlink_to(f"..data/{name}")
    (dest / "..data").symlink_to(stamp.name)
    return dest


class DaemonSetPod:
    """One DaemonSet pod on the node, started through CRI as kubelet starts it."""

    def __init__(self, n: CRINode, template: dict[str, Any], volumes: dict[str, Path],
                 log_dir: Path, image: str | None = None, name: str = "pycni-a1b2c") -> None:
        from cri.client import Mount

        self.n, self.spec, self.volumes = n, template["spec"], volumes
        self.image = image
        containers = self.spec["initContainers"] + self.spec["containers"]
        privileged = any(c.get("securityContext", {}).get("privileged") for c in containers)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.pod = n.cri.run_pod(name, namespace="pycni-system",
                                 labels=template["metadata"]["labels"],
                                 host_network=self.spec.get("hostNetwork", False),
                                 host_pid=self.spec.get("hostPID", False), privileged=privileged,
                                 log_directory=str(log_dir), cgroup_parent=n.cgroup)
        self.Mount = Mount
        for c in self.spec["initContainers"]:  # each to completion, in order
            cid = self.start(c)
            state = wait_for(f"init container {c['name']} to exit", lambda cid=cid: (
                s if (s := n.cri.container_state(cid))[0] == "CONTAINER_EXITED" else None),
                timeout=300, interval=0.5)
            assert state[1] == 0, (state, self.logs(c["name"]))
        [main] = self.spec["containers"]
        self.main = self.start(main)
        self.probe = main["readinessProbe"]["exec"]["command"]

    def mount(self, m: dict[str, Any]) -> Any:
        host = self.volumes[m["name"]]
        if "subPath" in m:  # kubelet bind-mounts what the subPath resolves to
            host = (host / m["subPath"]).resolve()
        return self.Mount(m["mountPath"], str(host), m.get("readOnly", False),
                          m.get("mountPropagation") == "HostToContainer")

    def start(self, c: dict[str, Any]) -> str:
        env = container_env(c)
        return self.n.cri.create_start(
            self.pod, c["name"], self.image or c["image"], c.get("command", []),
            c.get("args", []), env=env, mounts=[self.mount(m) for m in c["volumeMounts"]],
            privileged=c.get("securityContext", {}).get("privileged", False))

    def ready(self) -> bool:
        code, _ = self.n.cri.exec_sync(self.main, self.probe, timeout=30)
        return code == 0

    def wait_ready(self) -> None:
        wait_for("the DaemonSet pod's readiness probe", self.ready, timeout=300, interval=1)

    def logs(self, name: str) -> str:
        path = self.log_dir / name / "0.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def remove(self) -> None:
        """kubelet deleting the pod: SIGTERM, the grace period, then gone."""
        from cri.client import pb

        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        self.n.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=self.main,
                                                                 timeout=grace),
                                         timeout=grace + 60)
        self.n.cri.stop_remove(self.pod.id, self.pod.containers)


def container_env(c: dict[str, Any]) -> dict[str, str]:
    """A container's env as kubelet resolves it: a value, or a key of the manifest's ConfigMap
    (no downward API in it)."""
    data = manifest()["ConfigMap"]["data"]
    return {e["name"]: e["value"] if "value" in e else data[e["valueFrom"]["configMapKeyRef"]
                                                          ["key"]]
            for e in c.get("env", [])}


def init_arg(option: str) -> str:
    [init] = manifest()["DaemonSet"]["spec"]["template"]["spec"]["initContainers"]
    return init["args"][init["args"].index(option) + 1]


@contextlib.contextmanager
def daemonset_node(node_netns, tmp_path: Path, node_images: Path, *,
                   conf_template: bool = False) -> Iterator[
        tuple[CRINode, dict[str, Path], Path]]:
    """The node (containerd's CRI, empty CNI dirs; with conf_template, its CNI conf_template
    the file the DaemonSet installs) and the DaemonSet's volumes on it (its /etc/containerd:
    the dir of containerd's config.toml)."""
    bin_dir, conf_dir = tmp_path / "opt-cni-bin", tmp_path / "etc-cni-net.d"
    run = Path(tempfile.mkdtemp(prefix="pycni-ds-", dir="/tmp"))  # short: the socket's dir
    for d in (bin_dir, conf_dir, tmp_path / "run-netns"):
        d.mkdir()
    volumes = {"cni-bin": bin_dir, "cni-conf": conf_dir, "run-pycni": run,
               "cni-state": tmp_path / "var-lib-cni", "netns": tmp_path / "run-netns",
               "config": configmap_volume(tmp_path / "configmap",
                                          manifest()["ConfigMap"]["data"]),
               "containerd-config": tmp_path / "containerd"}  # cri_node's containerd's
    # the node's path of the template the init container writes into the node's conf dir
    template = conf_dir / Path(init_arg("--containerd-template")).name
    # the node's /run/pycni is `run`: the runtime (and so the forwarder) is told where
    env = {"PYCNI_SOCKET": str(run / "pycni.sock")}
    try:
        with cri_node(node_netns, tmp_path, bin_dir=bin_dir, conf_dir=conf_dir, images=[],
                      seed=node_images, daemon=False, env=env,
                      conf_template=template if conf_template else None) as n:
            # a node's /run/netns is a shared mount (`ip netns` makes it so): what the
            # manifest's HostToContainer propagation needs (the runtime refuses otherwise)
            netns = str(volumes["netns"])
            n.node.run("mount", "--bind", netns, netns)
            n.node.run("mount", "--make-shared", netns)
            yield n, volumes, run
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_daemonset_pod_gives_cri_pods_their_network(node_netns, node_images,
                                                    tmp_path) -> None:
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc")
    docs = manifest()
    template = docs["DaemonSet"]["spec"]["template"]
    import image

    assert template["spec"]["containers"][0]["image"] == image.IMAGE
    conf = json.loads(docs["ConfigMap"]["data"][CONFLIST])
    with daemonset_node(node_netns, tmp_path, node_images) as (
            n, volumes, run):
        n.cri.wait_image(image.IMAGE)
        ds = DaemonSetPod(n, template, volumes, tmp_path / "ds-logs")
        # the init container's install: the forwarder and the plugin names in the node's bin
        # dir, the ConfigMap's conflist in its conf dir
        bin_dir = volumes["cni-bin"]
        forwarder = bin_dir / "pycni-forwarder"
        assert forwarder.is_file() and os.access(forwarder, os.X_OK)
        assert forwarder.read_bytes() == image.FORWARDER.read_bytes()
        for plugin in ("bridge", "host-local", "portmap", "bandwidth", "loopback"):
            assert os.readlink(bin_dir / plugin) == "pycni-forwarder", plugin
        assert json.loads((volumes["cni-conf"] / CONFLIST).read_text()) == conf
        ds.wait_ready()
        assert (run / "pycni.sock").is_socket()

        pod, ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        wait_host_port(n, ips)
        veths = links_of_kind(node_netns, "veth")
        assert tbf_rates(node_netns, veths[0]["ifname"]) == [RATE // 8]
        ifbs = [i for i in links_of_kind(node_netns, "ifb") if i["ifname"].startswith("bwp")]
        assert [tbf_rates(node_netns, i["ifname"]) for i in ifbs] == [[RATE // 8]]
        check = runner_check(n, conf["name"], pod.id, bin_dir=bin_dir,
                             conf_dir=volumes["cni-conf"],
                             env={"PYCNI_SOCKET": str(run / "pycni.sock")})
        assert check.returncode == 0, check.stdout + check.stderr
        # the daemon in the DaemonSet's container served them: its own count
        code, out = n.cri.exec_sync(ds.main, ["/opt/pycni/bin/python", "-c",
                                              "import json; from cni.fast import status; "
                                              "print(json.dumps(status.query("
                                              "'/run/pycni/pycni.sock')))"])
        assert code == 0, out
        assert json.loads(out)["answered"] >= 3, out  # ADD (3 plugins), CHECK...

        n.cri.stop_remove(pod.id, pod.containers)
        assert shared_leftovers(n, conf["name"], pod.id) == []
        assert http_get(n.node, NODE_ADDR, 8080) == ""
        ds.remove()


POD_CIDR = "10.244.7.0/24"  # the node's podCIDR, as kube-controller-manager allocates it


def test_containerd_conf_template_gives_pods_the_nodes_own_pod_cidr(
        node_netns, node_images, tmp_path) -> None:
    """A containerd node whose conf_template is the file the DaemonSet installs: kubelet's
    UpdateRuntimeConfig with the node's podCIDR makes containerd render it (no conflist of the
    ConfigMap's in the way), and a CRI pod gets its address in that CIDR from the daemon in the
    DaemonSet's container, the cluster CIDR of the ConfigMap left unmasqueraded."""
    import grpc

    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc")
    docs = manifest()
    template = docs["DaemonSet"]["spec"]["template"]
    cluster_cidr = docs["ConfigMap"]["data"]["cluster-cidr"]
    assert ipaddress.ip_network(POD_CIDR).subnet_of(ipaddress.ip_network(cluster_cidr))
    with daemonset_node(node_netns, tmp_path, node_images,
                        conf_template=True) as (n, volumes, run):
        conf_dir = volumes["cni-conf"]
        node_template = conf_dir / Path(init_arg("--containerd-template")).name
        config = volumes["containerd-config"] / "config.toml"  # what containerd runs on
        assert f'conf_template = "{node_template}"' in config.read_text()
        # kubelet, once the node has its podCIDR: before the DaemonSet pod, containerd cannot
        # read the template and refuses; kubelet tries again at each node status update
        with pytest.raises(grpc.RpcError) as refused:
            n.cri.update_runtime_config(POD_CIDR)
        assert str(node_template) in str(refused.value.details()), refused.value
        ds = DaemonSetPod(n, template, volumes, tmp_path / "ds-logs")
        assert node_template.is_file()
        assert not (conf_dir / CONFLIST).exists()  # it would keep containerd from rendering
        assert "containerd's conf_template is" in ds.logs("install"), ds.logs("install")
        n.cri.update_runtime_config(POD_CIDR)  # kubelet's next try
        rendered = wait_for("containerd's rendered conflist", lambda: (
            json.loads(p.read_text()) if (p := conf_dir / RENDERED).exists() else None),
            timeout=60)
        bridge = next(p for p in rendered["plugins"] if p["type"] == "bridge")
        assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR}]]
        assert bridge["nonMasqueradeCIDRs"] == [cluster_cidr]
        wait_for("the runtime's NetworkReady", n.cri.network_ready, timeout=60, interval=0.5)
        ds.wait_ready()

        # run_web_pod checks each IP in the range of the chain's bridge (CRI adds loopback)
        conf = {**rendered, "plugins": [p for p in rendered["plugins"]
                                        if p["type"] != "loopback"]}
        pod, ips = run_web_pod(n, conf, tmp_path / "pod-logs")
        assert ipaddress.ip_address(ips[0]) in ipaddress.ip_network(POD_CIDR), ips
        wait_host_port(n, ips)
        code, out = n.cri.exec_sync(ds.main, ["/opt/pycni/bin/python", "-c",
                                              "import json; from cni.fast import status; "
                                              "print(json.dumps(status.query("
                                              "'/run/pycni/pycni.sock')))"])
        assert code == 0, out
        assert json.loads(out)["answered"] >= 3, out  # the ADD's three plugins, at least
        n.cri.stop_remove(pod.id, pod.containers)
        assert shared_leftovers(n, conf["name"], pod.id) == []
        ds.remove()


def web_pod_cycle(n: CRINode, conf: dict[str, Any], log_dir: Path) -> None:
    """A web pod made, answering on its hostPort, removed: nothing of it left (other pods may
    run: the test checks the whole node once they are gone)."""
    pod, ips = run_web_pod(n, conf, log_dir)
    wait_host_port(n, ips)
    n.cri.stop_remove(pod.id, pod.containers)
    assert [x for x in shared_leftovers(n, conf["name"], pod.id)
            if pod.id in x or any(f"{ip}:" in x for ip in ips)] == []


@contextlib.contextmanager
def churn(n: CRINode) -> Iterator[list[int]]:
    """Pod sandboxes made (CNI ADD) and removed (DEL) one after another on a thread until the
    block ends; yields the count made so far. Any failed call fails the test at the end."""
    made, errors = [0], []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                pod = n.cri.run_pod(f"churn-{made[0]}", cgroup_parent=n.cgroup)
                n.cri.stop_remove(pod.id)
                made[0] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"pod {made[0]}: {e}")
                return

    t = threading.Thread(target=loop)
    t.start()
    try:
        yield made
    finally:
        done.set()
        t.join(300)
    assert errors == [], errors


def test_rolling_update_and_a_node_without_the_daemonset_pod(node_netns, node_images,
                                                             tmp_path) -> None:
    """A new image's DaemonSet pod started while the old one serves (maxSurge 1), then the old
    one deleted: pods ADDed before keep working and DEL cleanly, calls made all along never
    fail. Then no DaemonSet pod: a call answers 11; the pod back, calls work again."""
    need("containerd", "ctr", "runc", "nsenter", "unshare", "curl", "tc")
    docs = manifest()
    template = docs["DaemonSet"]["spec"]["template"]
    conf = json.loads(docs["ConfigMap"]["data"][CONFLIST])
    import image

    new_ref = f"{image.IMAGE}-next"
    with daemonset_node(node_netns, tmp_path, node_images) as (
            n, volumes, run):
        n.ctrd.ctr("images", "tag", image.IMAGE, new_ref)  # the new version's image
        n.cri.wait_image(new_ref)
        old = DaemonSetPod(n, template, volumes, tmp_path / "old-logs", name="pycni-old")
        old.wait_ready()
        live, live_ips = run_web_pod(n, conf, tmp_path / "live-logs")

        with churn(n) as made:  # pods ADDed and DELeted all through the update
            wait_for("a pod made before the update", lambda: made[0] >= 1, timeout=120)
            new = DaemonSetPod(n, template, volumes, tmp_path / "new-logs", image=new_ref,
                               name="pycni-new")
            new.wait_ready()
            web_pod_cycle(n, conf, tmp_path / "during")  # both pods up: the new daemon serves
            at_ready = made[0]
            old.remove()
            wait_for("pods made after the old pod went", lambda: made[0] >= at_ready + 2,
                     timeout=300)
        wait_host_port(n, live_ips)  # the live pod kept its network
        web_pod_cycle(n, conf, tmp_path / "after")
        n.cri.stop_remove(live.id, live.containers)  # DEL of a pod the old daemon ADDed
        assert shared_leftovers(n, conf["name"], live.id) == []  # nothing of any pod left

        # no DaemonSet pod on the node: the forwarder answers 11 (try again), nothing made
        new.remove()
        assert not (run / "pycni.sock").exists()
        proc = n.node.run(str(volumes["cni-bin"] / "bridge"), check=False,
                          input=json.dumps({**conf["plugins"][0], "name": conf["name"],
                                            "cniVersion": conf["cniVersion"]}),
                          env={"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "gone1",
                               "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
                               "CNI_PATH": str(volumes["cni-bin"]),
                               "PYCNI_SOCKET": str(run / "pycni.sock")})
        assert proc.returncode != 0
        assert json.loads(proc.stdout)["code"] == 11, proc.stdout
        assert "/opt/pycni/bin/python" in proc.stdout, proc.stdout  # why no fallback
        assert shared_leftovers(n, conf["name"], "gone1") == []

        back = DaemonSetPod(n, template, volumes, tmp_path / "back-logs", name="pycni-back")
        back.wait_ready()
        web_pod_cycle(n, conf, tmp_path / "back")
        back.remove()


def pod_of_template(template: dict[str, Any], name: str) -> dict[str, Any]:
    """The DaemonSet's pod template as a Pod: Debian 12's podman 4.3 plays Pods and
    Deployments, not DaemonSets (`podman kube play --help`: "Supported kinds are Pods,
    Deployments and PersistentVolumeClaims")."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": name, "namespace": "pycni-system"},
            "spec": template["spec"]}


def test_podman_kube_play_of_the_pod_template(node_netns, pause_image, pycni_image,
                                              tmp_path) -> None:
    """`podman kube play` of the template (hostPaths on the node's dirs: its mount namespace
    has the test's own /opt/cni/bin, /etc/cni/net.d, /var/lib/cni, and /run/pycni, /run/netns
    are the test run's tmpfs): the install lands, the daemon in the container serves an
    ADD, CHECK and DEL of a netns through the forwarder, nothing left."""
    from clients import PAUSE_IMAGE, VENV_PY, Node, Podman, cleanup, leftovers
    from cnitest import delete_netns, new_netns

    need("podman", "nsenter", "unshare")
    docs = manifest()
    conf = json.loads(docs["ConfigMap"]["data"][CONFLIST])
    bin_dir, conf_dir, state = (tmp_path / "opt-cni-bin", tmp_path / "etc-cni-net.d",
                                tmp_path / "var-lib-cni")
    for d in (bin_dir, conf_dir):
        d.mkdir()
    pod_yaml = pod_of_template(docs["DaemonSet"]["spec"]["template"], "pycni-node-agent")
    # podman 4.3 mounts a ConfigMap volume as a directory even with a subPath (install then
    # reads a directory: "Is a directory"): the volume becomes the hostPath of the file the
    # subPath names, which is what kubelet bind-mounts for it
    conflist = tmp_path / "configmap" / CONFLIST
    conflist.parent.mkdir()
    conflist.write_text(docs["ConfigMap"]["data"][CONFLIST])
    volumes = pod_yaml["spec"]["volumes"]
    [config] = [v for v in volumes if "configMap" in v]
    volumes[volumes.index(config)] = {"name": config["name"],
                                      "hostPath": {"path": str(conflist), "type": "File"}}
    # the node's /etc/containerd (no containerd config: the ConfigMap's conflist), never the
    # machine's; the ConfigMap for the env the install's args name
    [ctrd] = [v for v in volumes if v["name"] == "containerd-config"]
    ctrd["hostPath"]["path"] = str(tmp_path / "etc-containerd")
    configmap = tmp_path / "configmap.yaml"
    configmap.write_text(yaml.safe_dump(docs["ConfigMap"]))
    for c in pod_yaml["spec"]["initContainers"]:
        for m in c["volumeMounts"]:
            if m["name"] == config["name"]:
                assert m.pop("subPath") == CONFLIST
    # podman's "once" init containers are removed after their run, and 4.3 tries that while
    # the container is still marked running ("cannot remove container ... as it is running"):
    # "always" keeps them (run at every pod start, as kubelet runs them)
    pod_yaml["metadata"]["annotations"] = {"io.podman.annotations.init.container.type":
                                           "always"}
    kube = tmp_path / "pycni-pod.yaml"
    kube.write_text(yaml.safe_dump(pod_yaml))
    pod = new_netns("pycni-kpod")  # before the node: its mount namespace gets the bind mount
    node = Node(node_netns.name, bin_dir=bin_dir, conf_dir=conf_dir, state_dir=state)
    with cleanup(lambda: delete_netns(pod), node.stop):
        podman = Podman(node, tmp_path / "podman", bin_dir, conf_dir)
        # the pod's infra container: our offline pause image (podman would build its own
        # from catatonit, which Debian's podman does not depend on)
        podman.conf.write_text(podman.conf.read_text().replace(
            "[engine]\n", f'[engine]\ninfra_image = "{PAUSE_IMAGE}"\n'))
        with cleanup(podman.stop):
            for archive in (pause_image, pycni_image):
                podman.run("load", "-q", "-i", str(archive), timeout=600)
            played = podman.run("kube", "play", "--configmap", str(configmap), str(kube),
                                check=False, timeout=600)
            if played.returncode != 0:
                logs = [podman.run("logs", cid, check=False).stderr
                        for cid in podman.run("ps", "-aq", check=False).stdout.split()]
                pytest.fail(f"podman kube play: {played.stderr}{played.stdout}\n{logs}")
            forwarder = bin_dir / "pycni-forwarder"
            assert forwarder.read_bytes() == __import__("image").FORWARDER.read_bytes()
            assert os.readlink(bin_dir / "bridge") == "pycni-forwarder"
            assert json.loads((conf_dir / CONFLIST).read_text()) == conf
            def answered() -> int | None:  # the daemon's own count, on the node's socket
                out = node.run(str(VENV_PY), "-c", "import json; from cni.fast import status; "
                               "print(json.dumps(status.query('/run/pycni/pycni.sock')))",
                               check=False, cwd=ROOT).stdout
                figures = json.loads(out or "null")
                return None if figures is None else figures["answered"]

            env = {"NETCONFPATH": str(conf_dir), "CNI_PATH": str(bin_dir),
                   "CNI_CONTAINERID": "kubeplay1"}
            meta, spec = pod_yaml["metadata"], pod_yaml["spec"]
            daemon_ctr = f"{meta['name']}-{spec['containers'][0]['name']}"
            if not shares_host_pids(podman, node, daemon_ctr):
                # podman before 4.5 ignores hostPID in kube play (its PR #17168): the daemon's
                # PID namespace is its own, so it cannot tell who a node's caller is, and it
                # refuses every one (the reason the manifest asks for hostPID). It is up, as
                # its pod sees it (the readiness probe's query, from inside), and a call from
                # the node makes nothing.
                wait_for("the daemon in the played pod", lambda: podman.run(
                    "exec", daemon_ctr, "/opt/pycni/bin/python", "-c",
                    "from cni.fast import status; "
                    "assert status.query('/run/pycni/pycni.sock')", check=False
                ).returncode == 0, timeout=300, interval=1)
                proc = node.run(str(VENV_PY), "-m", "cni.cli", "add", conf["name"], pod.path,
                                check=False, env=env, cwd=ROOT)
                # the runner, as cnitool, prints the plugin's error on stderr
                assert proc.returncode != 0, proc.stdout
                assert "outside the daemon's pid namespace" in proc.stderr, proc.stderr
                assert leftovers(node_netns.ip, state, conf["name"], ["kubeplay1"]) == []
                podman.run("kube", "down", str(kube), check=False, timeout=300)
                return
            wait_for("the daemon in the played pod", lambda: answered() is not None,
                     timeout=300, interval=1)
            for verb in ("add", "check", "del"):
                proc = node.run(str(VENV_PY), "-m", "cni.cli", verb, conf["name"],
                                pod.path, check=False, env=env, cwd=ROOT)
                assert proc.returncode == 0, (verb, proc.stdout, proc.stderr)
            assert answered() >= 9  # three plugins, three verbs: the container's daemon ran them
            assert leftovers(node_netns.ip, state, conf["name"], ["kubeplay1"]) == []
            podman.run("kube", "down", str(kube), check=False, timeout=300)


def shares_host_pids(podman: Any, node: Any, container: str) -> bool:
    """Whether podman gave the played container the node's PID namespace (hostPID)."""
    pid = podman.run("inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    ours = node.run("readlink", "/proc/self/ns/pid").stdout.strip()
    return node.run("readlink", f"/proc/{pid}/ns/pid").stdout.strip() == ours
