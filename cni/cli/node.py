"""`pycni install`, `pycni uninstall`, `pycni doctor` and `pycni attachments` (loaded lazily by
cni/cli, so `pycni add` never imports this)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from cni import install as inst


@click.command()
@click.option("--bin-dir", type=click.Path(path_type=Path), default=inst.DEFAULT_BIN,
              show_default=True, help="Where the runtime looks for CNI plugins.")
@click.option("--conf-dir", type=click.Path(path_type=Path), default=inst.DEFAULT_CONF,
              show_default=True, help="Where the runtime reads conflists.")
@click.option("--conflist", default=inst.DEFAULT_CONFLIST, show_default=True,
              help="A conflist shipped in conf/ by name, or a file of your own by a path "
                   "with a / (./my.conflist; root-owned); '' writes none.")
@click.option("--cni-version", default=None, metavar="VERSION",
              help="Rewrite the conflist's cniVersion: 1.0.0 for containerd 1.6 and 1.7, "
                   "podman 4; 1.1.0 only for runtimes on libcni 1.2+ (containerd 2.0+, "
                   "CRI-O 1.33).")
@click.option("--force", is_flag=True,
              help="Replace different existing files (kept as backups uninstall restores).")
@click.option("--no-compile", is_flag=True, help="Skip compiling the package's bytecode.")
@click.option("--no-systemd", is_flag=True,
              help="Do not install or enable the daemon's systemd units (also PYCNI_SYSTEMD=0).")
@click.option("--systemd-dir", type=click.Path(path_type=Path), default=None,
              help="Install the units here and enable them even if systemd is not detected "
                   "[default: /etc/systemd/system on a systemd host, else none].")
@click.option("--pod-cidr", "pod_cidrs", multiple=True, metavar="CIDR",
              help="This node's pod CIDR (one per family): the conflist's host-local ranges.")
@click.option("--cluster-cidr", "cluster_cidrs", multiple=True, metavar="CIDR",
              envvar="PYCNI_CLUSTER_CIDR",
              help="The cluster's pod CIDR holding --pod-cidr (one per family): traffic to it "
                   "is not masqueraded (bridge nonMasqueradeCIDRs). Also PYCNI_CLUSTER_CIDR "
                   "(space-separated: a ConfigMap key in a pod's env).")
@click.option("--containerd-template", type=click.Path(path_type=Path), default=None,
              metavar="PATH", help="Write containerd's CNI conf_template here, with the "
              "--cluster-cidr values, instead of a conflist.")
@click.option("--containerd-config", type=click.Path(path_type=Path), default=None,
              metavar="DIR", help="The node's containerd config dir (config.toml, "
              "conf.d/*.toml): with --containerd-template, the conflist is written too where "
              "that config sets no CRI conf_template (a node whose containerd renders none).")
@click.option("--forwarder", "use_forwarder", is_flag=True,
              help="Link the plugin names to pycni-forwarder (a static binary, docs/DESIGN.md) "
                   "instead of the Python executable; without it, an install links them back.")
@click.option("--forwarder-binary", type=click.Path(path_type=Path), default=None,
              help="The forwarder to install [default: pycni-forwarder beside the venv's "
                   "python, else the checkout's build/forwarder/pycni-forwarder].")
def install(bin_dir: Path, conf_dir: Path, conflist: str, cni_version: str | None, force: bool,
            no_compile: bool, no_systemd: bool, systemd_dir: Path | None,
            pod_cidrs: tuple[str, ...], cluster_cidrs: tuple[str, ...],
            containerd_template: Path | None, use_forwarder: bool,
            forwarder_binary: Path | None, containerd_config: Path | None) -> None:
    """Install the plugins into BIN_DIR and a conflist into CONF_DIR; on a systemd host, also
    pycni.socket and pycni.service, with the socket enabled (the daemon starts on first use)."""
    try:
        inst.check_node_cidrs(conflist or None, conf_dir, pod_cidrs, cluster_cidrs,
                              containerd_template, containerd_config)
    except inst.InstallError as e:
        raise click.UsageError(str(e)) from None
    units = inst.systemd_dir(systemd_dir, enabled=not no_systemd)
    use_forwarder = use_forwarder or forwarder_binary is not None
    _report("install", lambda: inst.install(bin_dir, conf_dir, conflist or None, force=force,
                                            cni_version=cni_version,
                                            compile_bytecode=not no_compile, units_dir=units,
                                            pod_cidrs=pod_cidrs, cluster_cidrs=cluster_cidrs,
                                            containerd_template=containerd_template,
                                            use_forwarder=use_forwarder,
                                            forwarder_binary=forwarder_binary,
                                            containerd_config=containerd_config))


@click.command()
@click.option("--bin-dir", type=click.Path(path_type=Path), default=inst.DEFAULT_BIN,
              show_default=True, help="The bin dir given to install (its manifest is there).")
def uninstall(bin_dir: Path) -> None:
    """Remove exactly what `pycni install` wrote; restore what it replaced."""
    _report("uninstall", lambda: inst.uninstall(bin_dir))


def _report(verb: str, action: Callable[[], list[str]]) -> None:
    """Print what `action` did, line by line; its failure as one line and exit 1."""
    try:
        lines = action()
    except (inst.InstallError, OSError) as e:
        click.echo(f"pycni {verb}: {e}", err=True)
        sys.exit(1)
    for line in lines:
        click.echo(line)


@click.command()
@click.option("--bin-dir", type=click.Path(path_type=Path), default=inst.DEFAULT_BIN,
              show_default=True, help="Installed plugins to check.")
@click.option("--conf-dir", type=click.Path(path_type=Path), default=inst.DEFAULT_CONF,
              show_default=True, help="Conflists to check.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(bin_dir: Path, conf_dir: Path, as_json: bool) -> None:
    """Check what the plugins need on this host; prints each finding with its fix.

    Kernel features are probed in a throwaway network namespace, never the host's own.
    Exits 1 if anything required is missing.
    """
    from cni import doctor as doc

    findings = doc.run_all(bin_dir, conf_dir)
    click.echo(doc.render(findings, as_json=as_json))
    sys.exit(1 if any(f.status == doc.FAIL for f in findings) else 0)


@click.command()
@click.option("--network", default=None, metavar="NAME", help="Only this network's.")
@click.option("--json", "as_json", is_flag=True, help="JSON for scripts (a list, one object "
              "per attachment).")
@click.option("--conf-dir", envvar="NETCONFPATH", default="/etc/cni/net.d", show_default=True,
              help="Where the conflists are (env NETCONFPATH).")
@click.option("--cache-dir", envvar="PYCNI_CACHE_DIR", default="/var/lib/cni",
              show_default=True, help="libcni's cache dir (env PYCNI_CACHE_DIR).")
def attachments(network: str | None, as_json: bool, conf_dir: str, cache_dir: str) -> None:
    """Every attachment on this node and what it owns (cache, reservations, veth, ifb, rules),
    orphans flagged both ways; changes nothing."""
    from cni import attachments as att

    rows = att.discover(conf_dir, cache_dir, network)
    click.echo(att.to_json(rows) if as_json else att.table(rows))
