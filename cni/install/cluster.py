"""The node's conflist on a cluster (`pycni install --pod-cidr ... --cluster-cidr ...`): the
shipped 10-pycni.conflist with host-local ranges from the node's pod CIDRs and bridge
nonMasqueradeCIDRs from the cluster's, for a runtime without a template of its own (CRI-O).
For containerd, `--cluster-cidr ... --containerd-template PATH` writes the shipped
conf/pycni-containerd.conflist.tmpl with the cluster CIDRs in place of its placeholders
(containerd fills in the node's pod CIDRs itself). containerd renders it only while no CNI config
is loaded, so a conflist beside it is a fallback written only where the node's containerd config
sets no conf_template (conf_template_of; the DaemonSet, deploy/pycni.yaml).

The rules, each refusal naming the value:
- a CIDR is an IPv4 or IPv6 network with its prefix length written out and no host bits set;
- at most one pod CIDR and one cluster CIDR per family (dual-stack: one of each);
- a cluster CIDR needs a pod CIDR of its family (the bridge refuses, error 7, a
  nonMasqueradeCIDRs entry of a family the pod has no address of), and `--cluster-cidr` alone
  has no node subnet to write: refused;
- with cluster CIDRs, each pod CIDR needs one of its family and must lie inside it (a pod CIDR
  outside its cluster's is a typo that would masquerade pod-to-pod traffic);
- pod CIDRs alone are fine: a node routed to no other (everything off the node masqueraded).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from pathlib import Path

from cni.install import trust
from cni.install.errors import InstallError
from cni.spec import cidr
from cni.spec.cidr import Network


def _network(option: str, value: str) -> Network:
    try:
        return cidr.network(value)
    except ValueError as e:
        raise InstallError(f"{option} {value!r}: {e}") from None


def _by_family(option: str, values: Sequence[str]) -> dict[int, Network]:
    out: dict[int, Network] = {}
    for value in values:
        net = _network(option, value)
        if net.version in out:
            raise InstallError(f"{option} {value!r}: a second IPv{net.version} one (after "
                               f"{out[net.version]}); give one per family")
        out[net.version] = net
    return out


def cluster_networks(cluster_cidrs: Sequence[str]) -> list[str]:
    """The cluster CIDRs alone (the containerd template's), checked and normalized."""
    return [str(n) for _, n in sorted(_by_family("--cluster-cidr", cluster_cidrs).items())]


def networks(pod_cidrs: Sequence[str], cluster_cidrs: Sequence[str]
             ) -> tuple[list[str], list[str]]:
    """The pod and cluster CIDRs, checked as the module says, normalized, IPv4 first."""
    pods = _by_family("--pod-cidr", pod_cidrs)
    clusters = _by_family("--cluster-cidr", cluster_cidrs)
    if clusters and not pods:
        raise InstallError("--cluster-cidr needs --pod-cidr: the node's own pod CIDR is what "
                           "its conflist hands out")
    for version, cluster in clusters.items():
        if version not in pods:
            raise InstallError(f"--cluster-cidr {str(cluster)!r}: no --pod-cidr of IPv{version}"
                               " (the pods would have no address it could apply to)")
    for version, pod in pods.items():
        cluster = clusters.get(version)
        if clusters and cluster is None:
            raise InstallError(f"--pod-cidr {str(pod)!r}: no --cluster-cidr of IPv{version}")
        if cluster is not None and not pod.subnet_of(cluster):  # type: ignore[arg-type]
            raise InstallError(f"--pod-cidr {str(pod)!r}: not inside --cluster-cidr "
                               f"{str(cluster)!r}")
    return ([str(pods[v]) for v in sorted(pods)], [str(clusters[v]) for v in sorted(clusters)])


TEMPLATE = "pycni-containerd.conflist.tmpl"
_KEEP_LINE = '"nonMasqueradeCIDRs": ['


def render_template(raw: bytes, cluster_cidrs: Sequence[str]) -> bytes:
    """The shipped containerd template with these cluster CIDRs (at most one per family): each
    written when the node has a pod CIDR of its family (containerd's .Routes names the node's
    families, IPv4 first), so a single-stack node never gets one of the other family."""
    clusters = {n.version: f'"{n}"' for n in _by_family("--cluster-cidr", cluster_cidrs).values()}
    if not clusters:
        raise InstallError("--containerd-template needs --cluster-cidr")
    if len(clusters) == 2:
        keep = ('{{range $i, $route := .Routes}}{{if $i}}, {{end}}{{if eq $route "::/0"}}'
                f'{clusters[6]}{{{{else}}}}{clusters[4]}{{{{end}}}}{{{{end}}}}')
    else:
        (version, cidr), = clusters.items()
        route = "0.0.0.0/0" if version == 4 else "::/0"
        keep = f'{{{{range .Routes}}}}{{{{if eq . "{route}"}}}}{cidr}{{{{end}}}}{{{{end}}}}'
    text = raw.decode()
    if text.startswith("{{- /*") and "*/ -}}" in text:  # the placeholders' note: done here
        text = ("{{- /* pycni install --containerd-template: containerd's CNI conf_template "
                "(docs/kubernetes.md) */ -}}" + text.split("*/ -}}", 1)[1])
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.lstrip().startswith(_KEEP_LINE)]
    if len(at) != 1:
        raise InstallError(f"the shipped {TEMPLATE} has no single {_KEEP_LINE!r} line")
    indent = lines[at[0]][:len(lines[at[0]]) - len(lines[at[0]].lstrip())]
    lines[at[0]] = f"{indent}{_KEEP_LINE}{keep}],\n"
    return "".join(lines).encode()


def render(raw: bytes, pod_cidrs: Sequence[str], cluster_cidrs: Sequence[str]) -> bytes:
    """The shipped conflist `raw` for this node: its bridge's host-local ranges the pod CIDRs
    (one range set per family), its nonMasqueradeCIDRs the cluster CIDRs (none: the key is
    left out)."""
    pods, clusters = networks(pod_cidrs, cluster_cidrs)
    conf = json.loads(raw)
    bridge = next((p for p in conf.get("plugins", []) if p.get("type") == "bridge"), None)
    if bridge is None or not isinstance(bridge.get("ipam"), dict):
        raise InstallError("the shipped conflist has no bridge with ipam to fill in")
    bridge["ipam"]["ranges"] = [[{"subnet": pod}] for pod in pods]
    if clusters:
        bridge["nonMasqueradeCIDRs"] = clusters
    return json.dumps(conf, indent=2).encode() + b"\n"


# containerd's CRI plugin, whose `cni` table holds conf_template: 1.6 and 1.7 (config version 2),
# 2.x (version 3; 2.x also reads a version 2 config, migrating the first name to the second)
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")


def conf_template_of(config_dir: Path) -> str | None:
    """The CRI conf_template the node's containerd config sets (config_dir's config.toml, then
    its conf.d/*.toml drop-ins in name order, a later one overriding), or None. Root reads only
    root's files (trust.read_file); one that is not TOML is refused, naming it."""
    if not config_dir.is_dir():
        raise InstallError(f"--containerd-config {str(config_dir)!r}: not a directory "
                           "(containerd's config dir, /etc/containerd)")
    drop_ins = config_dir / "conf.d"
    found = None
    for path in [config_dir / "config.toml",
                 *(sorted(drop_ins.glob("*.toml")) if drop_ins.is_dir() else [])]:
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            config = tomllib.loads(trust.read_file(path, "containerd config").decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise InstallError(f"containerd config {str(path)!r}: not TOML: {e}") from None
        plugins = config.get("plugins")
        for name in CRI_PLUGINS:
            cni = plugins.get(name, {}).get("cni") if isinstance(plugins, dict) else None
            value = cni.get("conf_template") if isinstance(cni, dict) else None
            if isinstance(value, str):
                found = value or None  # "" is containerd's default: no template
    return found
