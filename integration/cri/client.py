"""CRIClient: the calls kubelet makes to a CRI runtime to run a pod and tear it down.

    client = CRIClient("/run/containerd/containerd.sock")
    pod = client.run_pod("web", port_mappings=[PortMap(8080, 80)],
                         annotations={"kubernetes.io/ingress-bandwidth": "1M"})
    client.create_start(pod, "httpd", "localhost/pycni-busybox:test",
                        ["/bin/httpd", "-f", "-p", "80", "-h", "/www"])
    ip, more = client.pod_ip(pod.id)
    client.stop_remove(pod.id)

No pytest here: scripts (the VM scenario) use it as is. CLI:
    python -m integration.cri.client --socket SOCK version
    python -m integration.cri.client --socket SOCK run NAME --port 8080:80 \
        --annotation kubernetes.io/ingress-bandwidth=1M --image IMG -- CMD...   # prints JSON
    python -m integration.cri.client --socket SOCK ip POD_ID
    python -m integration.cri.client --socket SOCK rm POD_ID [--container ID]...
(`run` also takes --log-dir, --cgroup-parent and --wait-image REF, for an image just imported;
the module needs grpcio and grpcio-tools.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from . import stubs

pb, pb_grpc = stubs.load()
PROTOCOLS = {"tcp": pb.TCP, "udp": pb.UDP, "sctp": pb.SCTP}


@dataclass(frozen=True)
class PortMap:
    """A hostPort, as kubelet puts it in PodSandboxConfig.port_mappings."""

    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: str = ""


@dataclass(frozen=True)
class Mount:
    """A volume as kubelet passes it to CreateContainer (a hostPath: its path on the node)."""

    container_path: str
    host_path: str
    readonly: bool = False
    host_to_container: bool = False  # mountPropagation: HostToContainer


@dataclass
class Pod:
    """A running sandbox: its id and the config it was made with (CreateContainer resends it)."""

    id: str
    config: Any  # runtime_v1_pb2.PodSandboxConfig
    containers: list[str] = field(default_factory=list)


class CRIClient:
    def __init__(self, socket_path: str, timeout: float = 180.0) -> None:
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = pb_grpc.RuntimeServiceStub(self.channel)
        self.images = pb_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CRIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- runtime and images -----------------------------------------------------------------

    def version(self) -> dict[str, str]:
        r = self.runtime.Version(pb.VersionRequest(version="v1"), timeout=self.timeout)
        return {"runtime_name": r.runtime_name, "runtime_version": r.runtime_version,
                "runtime_api_version": r.runtime_api_version}

    def wait_ready(self, timeout: float = 60.0) -> dict[str, str]:
        """Version once the CRI service answers (it starts after containerd's socket)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.version()
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def has_image(self, ref: str) -> bool:
        r = self.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
                                    timeout=self.timeout)
        return bool(r.image.id)

    def wait_image(self, ref: str, timeout: float = 60.0) -> None:
        """CRI learns of an image imported with ctr from containerd's events, a bit later."""
        deadline = time.monotonic() + timeout
        while not self.has_image(ref):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRI does not see image {ref}")
            time.sleep(0.2)

    def update_runtime_config(self, pod_cidr: str) -> None:
        """UpdateRuntimeConfig, as kubelet sends the node's podCIDRs (comma-separated for
        dual-stack) once the node has them: containerd renders its CNI conf_template with them."""
        self.runtime.UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
            runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=pod_cidr))),
            timeout=self.timeout)

    def network_ready(self) -> bool:
        """Status: the runtime's NetworkReady condition (false until it has a CNI config)."""
        r = self.runtime.Status(pb.StatusRequest(), timeout=self.timeout)
        return any(c.type == "NetworkReady" and c.status for c in r.status.conditions)

    # ---- pods ---------------------------------------------------------------------------------

    @staticmethod
    def pod_config(name: str, *, namespace: str = "default", uid: str | None = None,
                   port_mappings: Sequence[PortMap] = (), annotations: dict[str, str] | None =
                   None, labels: dict[str, str] | None = None, log_directory: str = "",
                   cgroup_parent: str = "", dns_servers: Sequence[str] = (),
                   host_network: bool = False, host_pid: bool = False,
                   privileged: bool = False) -> Any:
        """A PodSandboxConfig as kubelet fills it for a pod with its own network namespace, or
        (host_network, host_pid) the node's, privileged if any of its containers is."""
        uid = uid or str(uuid.uuid4())
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            hostname="" if host_network else name,  # kubelet's: the node's UTS namespace
            log_directory=log_directory,
            dns_config=pb.DNSConfig(servers=list(dns_servers)),
            port_mappings=[pb.PortMapping(protocol=PROTOCOLS[p.protocol.lower()],
                                          container_port=p.container_port,
                                          host_port=p.host_port, host_ip=p.host_ip)
                           for p in port_mappings],
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid, **(labels or {})},
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    privileged=privileged,
                    namespace_options=pb.NamespaceOption(
                        network=pb.NODE if host_network else pb.POD,
                        pid=pb.NODE if host_pid else pb.CONTAINER, ipc=pb.POD))))

    def run_pod(self, name: str, **kw: Any) -> Pod:
        """RunPodSandbox: the runtime makes the netns and runs the CNI ADD chain in it."""
        config = self.pod_config(name, **kw)
        r = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config),
                                       timeout=self.timeout)
        return Pod(r.pod_sandbox_id, config)

    def pod_status(self, pod_id: str, verbose: bool = False) -> Any:
        return self.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=verbose),
            timeout=self.timeout)

    def pod_ip(self, pod_id: str) -> tuple[str, list[str]]:
        """(network.ip, additional_ips): what kubelet reports as the pod's IPs."""
        net = self.pod_status(pod_id).status.network
        return net.ip, [a.ip for a in net.additional_ips]

    def pod_ids(self) -> list[str]:
        r = self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=self.timeout)
        return [p.id for p in r.items]

    def stop_remove(self, pod_id: str, containers: Sequence[str] = ()) -> None:
        """kubelet's order: each container stopped and removed, then the sandbox (StopPodSandbox
        runs the CNI DEL chain; RemovePodSandbox forgets it)."""
        for cid in containers:
            self.stop_remove_container(cid)
        self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id),
                                    timeout=self.timeout)
        self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                                      timeout=self.timeout)

    # ---- containers ---------------------------------------------------------------------------

    def stop_remove_container(self, container_id: str) -> None:
        """StopContainer (no grace period) + RemoveContainer."""
        self.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=0),
                                   timeout=self.timeout)
        self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id),
                                     timeout=self.timeout)

    def create_start(self, pod: Pod, name: str, image: str, command: Sequence[str],
                     args: Sequence[str] = (), *, env: dict[str, str] | None = None,
                     mounts: Sequence[Mount] = (), privileged: bool = False) -> str:
        """CreateContainer + StartContainer in the pod; returns the container id."""
        log_path = f"{name}/0.log" if pod.config.log_directory else ""
        if log_path:  # kubelet makes the container's log dir (CRI-O's conmon does not)
            os.makedirs(os.path.join(pod.config.log_directory, name), exist_ok=True)
        config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name, attempt=0),
                                    image=pb.ImageSpec(image=image, user_specified_image=image),
                                    command=list(command), args=list(args), log_path=log_path,
                                    labels={"io.kubernetes.container.name": name},
                                    envs=[pb.KeyValue(key=k, value=v)
                                          for k, v in (env or {}).items()],
                                    mounts=[pb.Mount(container_path=m.container_path,
                                                     host_path=m.host_path,
                                                     readonly=m.readonly,
                                                     propagation=pb.PROPAGATION_HOST_TO_CONTAINER
                                                     if m.host_to_container
                                                     else pb.PROPAGATION_PRIVATE)
                                            for m in mounts],
                                    # kubelet repeats the pod's namespace options (CRI-O
                                    # refuses a pod-level PID namespace the pod lacks)
                                    linux=pb.LinuxContainerConfig(
                                        security_context=pb.LinuxContainerSecurityContext(
                                            privileged=privileged,
                                            namespace_options=pod.config.linux.security_context
                                            .namespace_options)))
        r = self.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=config,
                                      sandbox_config=pod.config), timeout=self.timeout)
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=r.container_id),
                                    timeout=self.timeout)
        pod.containers.append(r.container_id)
        return r.container_id

    def container_state(self, container_id: str) -> tuple[str, int, str]:
        """(state name, exit code, reason) of a container."""
        s = self.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id),
                                         timeout=self.timeout).status
        return pb.ContainerState.Name(s.state), s.exit_code, s.reason

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 30) -> \
            tuple[int, str]:
        """ExecSync (what kubelet runs an exec probe with): exit code, stdout + stderr."""
        r = self.runtime.ExecSync(pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd),
                                                     timeout=timeout),
                                  timeout=self.timeout + timeout)
        return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")


# ---- CLI --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.cri.client",
                                     description="kubelet's pod calls to a CRI socket")
    parser.add_argument("--socket", required=True, help="the runtime's gRPC unix socket")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version")
    run = sub.add_parser("run", help="RunPodSandbox (+ a container); prints id, ip as JSON")
    run.add_argument("name")
    run.add_argument("--port", action="append", default=[], metavar="HOST:CONTAINER[/PROTO]")
    run.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--log-dir", default="")
    run.add_argument("--cgroup-parent", default="",
                     help="kubelet's pod cgroup (default: the runtime's, /k8s.io for containerd)")
    run.add_argument("--image", help="also CreateContainer + StartContainer with this image, "
                     "running the command after `--`")
    run.add_argument("--wait-image", action="append", default=[], metavar="REF",
                     help="first wait until the runtime sees REF (an image just imported)")
    ip = sub.add_parser("ip", help="PodSandboxStatus: the pod's IPs")
    ip.add_argument("pod")
    rm = sub.add_parser("rm", help="StopPodSandbox + RemovePodSandbox")
    rm.add_argument("pod")
    rm.add_argument("--container", action="append", default=[], metavar="ID",
                    help="first stop and remove this container of the pod, as kubelet does "
                    "(CRI-O's StopPodSandbox gives a container that ignores SIGTERM minutes)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # argparse mishandles `--` after a subcommand's options: split the container command off
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    with CRIClient(args.socket) as client:
        if args.cmd == "version":
            out: Any = client.version()
        elif args.cmd == "run":
            for ref in args.wait_image:
                client.wait_image(ref)
            ports = []
            for spec in args.port:
                pair, _, proto = spec.partition("/")
                host, _, ctr = pair.partition(":")
                ports.append(PortMap(int(host), int(ctr or host), proto or "tcp"))
            annotations = dict(a.split("=", 1) for a in args.annotation)
            pod = client.run_pod(args.name, port_mappings=ports, annotations=annotations,
                                 log_directory=args.log_dir, cgroup_parent=args.cgroup_parent)
            if args.image:
                client.create_start(pod, args.name, args.image, command)
            addr, more = client.pod_ip(pod.id)
            out = {"pod": pod.id, "containers": pod.containers, "ip": addr,
                   "additional_ips": more}
        elif args.cmd == "ip":
            addr, more = client.pod_ip(args.pod)
            out = {"ip": addr, "additional_ips": more}
        else:
            client.stop_remove(args.pod, args.container)
            out = {"removed": args.pod}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
