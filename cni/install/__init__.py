"""`pycni install` / `pycni uninstall`: put the plugins where a runtime finds them, and take back
exactly what was put there.

Install writes one multi-call executable (`pycni-plugin`) into the bin dir, a relative symlink to
it for each plugin name, and a conflist into the conf dir (render.py: from the package's data, so
any installed copy can install: a wheel in a venv, pipx, a checkout). The executable's first line
runs the venv interpreter directly (`#!<venv python> -IS`), its root line names the dir the `cni`
package is in (the checkout; installed from a wheel, a copy of the package made in the bin dir,
copies.py, because pip upgrades site-packages in place), and its path lines name where the
dependencies are; the marker line stays so bridge still recognises our host-local and runs it
in-process.

The jobs, one module each: trust.py (root reads and writes only what root owns: every path is
checked before the first write), lock.py (one install or uninstall at a time in a bin dir),
files.py (atomic writes: a runtime exec'ing a plugin meanwhile finds the old file or the new one),
manifest.py (what was written, so uninstall removes exactly that and restores what --force
replaced), copies.py and inuse.py (the package copies and when one may go), units.py (systemd),
upgrade.py (a running daemon of another version hands over to one running this).

On a systemd host install also writes conf/pycni.socket and conf/pycni.service into
/etc/systemd/system, the service's ExecStart being this venv's `pycni daemon`, and enables the
socket: the first plugin call starts the daemon. `--no-systemd` or PYCNI_SYSTEMD=0 opts out;
uninstall disables them. With the units, a running daemon restarts (try-restart); without, a
daemon of another version answering on the socket (PYCNI_SOCKET) hands over to one running this.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cni import __version__, registry
from cni.install import (
    cluster,
    copies,
    entrypoints,
    files,
    forwarder,
    inuse,
    lock,
    render,
    trust,
    units,
)
from cni.install.errors import (
    BACKUPS,
    DEFAULT_BIN,
    DEFAULT_CONF,
    DEFAULT_CONFLIST,
    MANIFEST,
    MULTICALL,
    InstallError,
)
from cni.install.manifest import Entry, Manifest, Planned, describe, digest
from cni.install.render import (
    CONF_SRC,
    DATA,
    MARKER,
    PACKAGE,
    ROOT,
    SOURCE,
    UNITS,
    in_site,
    render_conflist,
    render_multicall,
    render_unit,
    root_named,
    shipped_conflists,
    site_dirs,
    venv_python,
)
from cni.install.units import SYSTEMD_DIR, systemd_dir

__all__ = ["BACKUPS", "CONF_SRC", "DATA", "DEFAULT_BIN", "DEFAULT_CONF", "DEFAULT_CONFLIST",
           "MANIFEST", "MARKER", "MULTICALL", "PACKAGE", "ROOT", "SOURCE", "SYSTEMD_DIR", "UNITS",
           "Entry", "InstallError", "Manifest", "Planned", "check_node_cidrs", "compile_package",
           "describe", "install", "plan", "render_multicall", "shipped_conflists", "site_dirs",
           "systemd_dir", "uninstall", "venv_python"]


def plan(bin_dir: Path, conf_dir: Path | None, conflist: str | None,
         cni_version: str | None = None, python: Path | None = None,
         units_dir: Path | None = None, root: Path = ROOT,
         sites: list[str] | None = None,
         plugins: dict[str, tuple[str, str]] | None = None,
         pod_cidrs: Sequence[str] = (), cluster_cidrs: Sequence[str] = (),
         containerd_template: Path | None = None,
         forwarder_binary: bytes | None = None) -> list[Planned]:
    """What install writes; `plugins`, the entry-point plugins (entrypoints.plugin_table), are
    linked too; to the forwarder (with its table) when its binary is given (forwarder.py).
    With pod CIDRs the conflist is the shipped default filled in for this node; with
    containerd_template, the shipped template with the cluster CIDRs goes there too (install
    passes no conflist unless it is the fallback, cluster.py)."""
    python = python or venv_python()
    plugins = plugins or {}
    items = [Planned(bin_dir / MULTICALL, "file",
                     render_multicall(python, root, sites=sites, plugins=plugins))]
    target = MULTICALL
    if forwarder_binary is not None:
        target = forwarder.FORWARDER
        items += [Planned(bin_dir / forwarder.FORWARDER, "file", forwarder_binary),
                  Planned(bin_dir / forwarder.TABLE, "file", forwarder.table(bin_dir, plugins),
                          mode=0o644)]
    items += [Planned(bin_dir / name, "symlink", target=target)
              for name in (*registry.NAMES, *sorted(plugins))]
    if containerd_template is not None:
        _, raw = render.conflist_source(cluster.TEMPLATE)
        items.append(Planned(containerd_template, "file",
                             cluster.render_template(raw, cluster_cidrs), mode=0o644))
    if conf_dir is not None and conflist:
        name, raw = render.conflist_source(conflist)
        if pod_cidrs or (cluster_cidrs and containerd_template is None):
            raw = cluster.render(raw, pod_cidrs, cluster_cidrs)
        items.append(Planned(conf_dir / name, "file", render_conflist(name, raw, cni_version),
                             mode=0o644))
    if units_dir is not None:
        items += [Planned(units_dir / u, "file", render_unit(u, python), mode=0o644)
                  for u in UNITS]
    return items


def check_interpreter(python: Path, units_dir: Path | None) -> None:
    """The interpreter the executables (and site_dirs, and the units' daemon) run: as trust.py
    says, before install runs it."""
    trust.walk(python, "interpreter")
    if (cfg := python.parent.parent / "pyvenv.cfg").exists():  # a venv: it names the base
        trust.walk(cfg, "interpreter's venv")
    if units_dir is not None and (pycni := python.parent / "pycni").exists():
        trust.walk(pycni, "the daemon's command")


def check_trust(bin_dir: Path, conf_dir: Path | None, units_dir: Path | None,
                sites: list[str]) -> None:
    """Everything else install reads or writes through, as trust.py says; before any write."""
    for d, what in ((bin_dir, "bin dir"), (conf_dir, "conf dir"), (units_dir, "units dir")):
        if d is not None:
            trust.walk_dir_to_make(d, what)
    for sub in (copies.LIB, BACKUPS):  # what earlier installs made there
        if (bin_dir / sub).exists():
            trust.walk(bin_dir / sub, f"bin dir's {sub}")
    for d in sites:
        trust.walk_maybe_missing(d, "sys.path dir")
    trust.walk(ROOT, "the dir the cni package is in")
    trust.check_tree(PACKAGE, "the cni package")


def install(bin_dir: Path = DEFAULT_BIN, conf_dir: Path | None = DEFAULT_CONF,
            conflist: str | None = DEFAULT_CONFLIST, *, force: bool = False,
            cni_version: str | None = None, compile_bytecode: bool = True,
            units_dir: Path | None = None, pod_cidrs: Sequence[str] = (),
            cluster_cidrs: Sequence[str] = (),
            containerd_template: Path | None = None, use_forwarder: bool = False,
            forwarder_binary: Path | None = None,
            containerd_config: Path | None = None) -> list[str]:
    """Install; returns human-readable lines of what was done. Refuses (changing nothing) when a
    path it would read or write is not root's alone (trust.py), or a different file is in the
    way, unless force (which keeps the old one as a backup). With units_dir (see systemd_dir) the
    daemon's units go there and the socket is enabled. With pod (and cluster) CIDRs the
    conflist is the shipped default filled in for this node; with containerd_template the
    shipped template with the cluster CIDRs is written there, and no conflist (cluster.py), but
    with containerd_config (the node's containerd config dir) the conflist is the fallback:
    written unless that config sets a conf_template (which the conflist would pre-empt; one an
    earlier install wrote is then removed). use_forwarder: the plugin names link to
    pycni-forwarder (forwarder_binary, else found as forwarder.find_binary says)."""
    check_node_cidrs(conflist, conf_dir, pod_cidrs, cluster_cidrs, containerd_template,
                     containerd_config)
    notes, drop_conflists_in = [], None
    if containerd_template is not None:
        containerd_template = containerd_template.absolute()
        trust.walk_dir_to_make(containerd_template.parent, "containerd template dir")
        rendered_by = cluster.conf_template_of(containerd_config) if containerd_config else None
        if containerd_config is None or rendered_by is not None:
            conflist = None  # containerd renders its template only while no conflist is loaded
        if rendered_by is not None:
            drop_conflists_in = conf_dir.absolute() if conf_dir else None
            notes.append(f"containerd's conf_template is {rendered_by}: no conflist written "
                         "(containerd renders the template once kubelet sends the node's pod "
                         "CIDR)")
    bin_dir, conf_dir = bin_dir.absolute(), conf_dir.absolute() if conf_dir else None
    python = venv_python()
    check_interpreter(python, units_dir)
    sites = site_dirs(python)
    check_trust(bin_dir, conf_dir, units_dir, sites)
    # Installed from a wheel, the executables run a copy pip never changes (copies.py).
    lib = copies.path_for(bin_dir, PACKAGE, __version__) if in_site(ROOT, sites) else None
    table, skipped = entrypoints.plugin_table(sites, str(python))  # from the sites just checked
    binary = None
    if use_forwarder:
        binary = trust.read_file(forwarder.find_binary(forwarder_binary, python),
                                 "forwarder binary")
    if not force:
        _refuse_mixed(bin_dir, table)
    items = plan(bin_dir, conf_dir, conflist, cni_version, python, units_dir,
                 root=lib or ROOT, sites=sites, plugins=table, pod_cidrs=pod_cidrs,
                 cluster_cidrs=cluster_cidrs, containerd_template=containerd_template,
                 forwarder_binary=binary)
    _conflicts(bin_dir, items, force)  # refused before anything is written
    created = []
    template_dir = containerd_template.parent if containerd_template else None
    for d in filter(None, (bin_dir, conf_dir, units_dir, template_dir)):
        created += [str(p) for p in files.make_dirs(d)]
    with lock.held(bin_dir):
        done = _install_locked(bin_dir, items, _conflicts(bin_dir, items, force), created,
                               lib, python, compile_bytecode, units_dir, table,
                               drop_conflists_in)
    return [f"skipped plugin {name}: {why}" for name, why in sorted(skipped.items())] + notes \
        + done


def _refuse_mixed(bin_dir: Path, table: dict[str, tuple[str, str]]) -> None:
    old = Manifest.load(bin_dir)
    recorded = {e.path: e.target for e in old.entries if e.kind == "symlink"} if old else {}
    forwarder.refuse_mixed(bin_dir, [*registry.NAMES, *sorted(table)], recorded)


def check_node_cidrs(conflist: str | None, conf_dir: Path | None, pod_cidrs: Sequence[str],
                     cluster_cidrs: Sequence[str], containerd_template: Path | None = None,
                     containerd_config: Path | None = None) -> None:
    """Pod and cluster CIDRs fill in the shipped default conflist, so they go with neither
    another conflist (a file of one's own says its own ranges) nor none. The containerd
    template takes cluster CIDRs only (containerd fills in the pod CIDRs) and replaces the
    conflist (containerd renders it only while no conflist is loaded), unless the containerd
    config says whether it does (then the conflist is the fallback)."""
    if containerd_config is not None and containerd_template is None:
        raise InstallError(f"--containerd-config {str(containerd_config)!r} needs "
                           "--containerd-template (it says whether containerd renders it)")
    if containerd_template is not None:
        if pod_cidrs:
            raise InstallError(f"--pod-cidr {pod_cidrs[0]!r}: not with --containerd-template "
                               "(containerd fills in the node's pod CIDRs)")
        if not cluster_cidrs:
            raise InstallError("--containerd-template needs --cluster-cidr (what it fills in)")
        cluster.cluster_networks(cluster_cidrs)
        if conflist not in (None, DEFAULT_CONFLIST) and containerd_config is None:
            raise InstallError(f"--containerd-template writes no conflist: not with --conflist "
                               f"{conflist!r} (containerd renders the template only while no "
                               "conflist is loaded; with --containerd-config DIR it is the "
                               "fallback where containerd's config sets no conf_template)")
        return
    if not pod_cidrs and not cluster_cidrs:
        return
    cluster.networks(pod_cidrs, cluster_cidrs)
    if conflist != DEFAULT_CONFLIST or conf_dir is None:
        raise InstallError(f"--pod-cidr and --cluster-cidr fill in {DEFAULT_CONFLIST}: not "
                           f"with --conflist {conflist or ''!r} (put the ranges and "
                           "nonMasqueradeCIDRs in a conflist of your own instead)")


def _conflicts(bin_dir: Path, items: list[Planned], force: bool) -> list[Path]:
    old = Manifest.load(bin_dir)
    conflicts = [it.path for it in items
                 if (it.path.exists() or it.path.is_symlink()) and not it.same_as_disk()
                 and not (old and (e := old.find(it.path)) and e.matches_disk())]
    if conflicts and not force:
        raise InstallError("refusing to overwrite " + ", ".join(map(str, conflicts))
                           + " (different files are there; --force replaces them, keeping backups"
                           " that uninstall restores)")
    return conflicts


def _install_locked(bin_dir: Path, items: list[Planned], conflicts: list[Path],
                    created: list[str], lib: Path | None, python: Path, compile_bytecode: bool,
                    units_dir: Path | None, plugins: dict[str, tuple[str, str]],
                    drop_conflists_in: Path | None = None) -> list[str]:
    manifest = Manifest.load(bin_dir) or Manifest(bin_dir=str(bin_dir))
    manifest.root, manifest.python = str(ROOT), str(python)
    manifest.plugins = {name: target for name, (target, _) in plugins.items()}
    manifest.forwarder = any(it.path.name == forwarder.FORWARDER for it in items)
    manifest.created_dirs += created
    done = []
    if lib is not None:
        if copies.make(lib, PACKAGE, python):
            done.append(f"copied {PACKAGE} to {lib} (what the plugins run)")
        manifest.lib = str(lib)
        manifest.save()
    for it in items:
        entry = manifest.find(it.path)
        if entry is None and it.same_as_disk():
            done.append(f"kept {it.path} (already the same)")
            continue  # it was there before us: not ours to remove later
        backup = entry.backup if entry else ""
        if it.path in conflicts:
            kept = files.keep_backup(bin_dir, it.path)
            backup = backup or kept  # uninstall restores the oldest: what was there before us
            done.append(f"kept the previous {it.path} as {kept}")
        if it.kind == "symlink":
            files.atomic_symlink(it.path, it.target)
            new = Entry(str(it.path), "symlink", target=it.target, backup=backup)
        else:
            files.atomic_write(it.path, it.content, it.mode)
            new = Entry(str(it.path), "file", digest=digest(it.content), backup=backup)
        manifest.entries = [e for e in manifest.entries if e.path != new.path] + [new]
        done.append(f"wrote {it.path}")
        manifest.save()  # after each file: an interrupted install can still be uninstalled
    done += _unlink_dropped(manifest, {str(it.path) for it in items}, drop_conflists_in)
    manifest.save()
    if lib is not None:  # the executables in place name lib now: plugins exec'd from now run it
        done += _prune(bin_dir, manifest, inuse.now_ticks())
    if compile_bytecode:
        compile_package(python)
        done.append(f"compiled bytecode of {PACKAGE}")
    if units_dir is not None:
        manifest.systemd = True
        manifest.save()
        units.systemctl("daemon-reload")
        units.systemctl("enable", "--now", "pycni.socket")
        units.systemctl("try-restart", "pycni.service")  # a running daemon takes up the new code
        done.append("enabled pycni.socket (the first plugin call starts pycni.service)")
    else:
        done.append(_daemon_takes_up_new_code())
    return done


def _unlink_dropped(manifest: Manifest, planned: set[str],
                    conflists_in: Path | None = None) -> list[str]:
    """A plugin name an earlier install linked and this one does not (its package is gone),
    the forwarder's files when the names link to the Python executable again, or a conflist an
    earlier install wrote into conflists_in (containerd's template took over: it would pre-empt
    it): removed, as uninstall would (what was there before it restored)."""
    done = []
    ours = (MULTICALL, forwarder.FORWARDER)
    for e in [e for e in manifest.entries if e.path not in planned and (
            (e.kind == "symlink" and e.target in ours)
            or (e.kind == "file" and Path(e.path).parent == Path(manifest.bin_dir)
                and Path(e.path).name in (forwarder.FORWARDER, forwarder.TABLE))
            or (e.kind == "file" and Path(e.path).parent == conflists_in
                and Path(e.path).suffix in (".conf", ".conflist", ".json")))]:
        path = Path(e.path)
        if e.matches_disk():
            path.unlink()
            why = ("no such plugin any more" if e.kind == "symlink"
                   else "containerd renders its conf_template" if path.parent == conflists_in
                   else "the plugins run pycni-plugin now")
            done.append(f"removed {path} ({why})")
            if e.backup and Path(e.backup).exists():
                os.replace(e.backup, path)
                done.append(f"restored {path} from {e.backup}")
        elif path.parent == conflists_in and path.exists():
            done.append(f"left {path}: changed since install, not ours any more (containerd "
                        "renders no conf_template while a conflist is loaded)")
        manifest.entries.remove(e)
    return done


def named_copies(bin_dir: Path, manifest: Manifest | None) -> set[str]:
    """The copies an executable in the bin dir (or kept as a backup) or the manifest names."""
    named = {manifest.lib} if manifest and manifest.lib else set()
    backups = bin_dir / BACKUPS
    for f in [bin_dir / MULTICALL, *(sorted(backups.iterdir()) if backups.is_dir() else [])]:
        try:
            if f.is_file() and not f.is_symlink() and f.stat().st_size < 1 << 20 and \
                    (root := root_named(f.read_text(errors="replace"))):
                named.add(root)
        except OSError:
            pass
    return named


def _prune(bin_dir: Path, manifest: Manifest | None, switched: int) -> list[str]:
    """Remove the copies nothing names and no process may run (manifest None: uninstall,
    the copies dir too once empty)."""
    lib_dir = bin_dir / copies.LIB
    gone, used = copies.prune(lib_dir, named_copies(bin_dir, manifest), bin_dir, switched)
    if manifest is None:
        try:
            lib_dir.rmdir()
        except OSError:
            pass  # absent, or still holds a copy
    return [f"removed {d}" for d in gone] + [
        f"left {d}: pid {pid} may still run it (the next install removes it; or remove it "
        f"once pid {pid} is gone)"
        for d, pid in used.items()]


def _daemon_takes_up_new_code() -> str:
    """A daemon running another version hands over to one running this (upgrade.py)."""
    from cni.install import upgrade

    try:
        return upgrade.upgrade(__version__)
    except upgrade.HandoverError as e:
        raise InstallError(f"installed, but the running daemon still runs other code: {e}") \
            from None


def uninstall(bin_dir: Path = DEFAULT_BIN) -> list[str]:
    """Remove what the manifest in bin_dir records, restore backups, drop dirs install made."""
    bin_dir = bin_dir.absolute()
    if Manifest.load(bin_dir) is None:
        raise InstallError(f"no pycni install recorded in {bin_dir} ({MANIFEST} missing)")
    # The manifest says what to remove and restore where: only root's is believed.
    trust.walk(bin_dir / MANIFEST, "install manifest")
    with lock.held(bin_dir) as lock_file:
        manifest = Manifest.load(bin_dir)
        if manifest is None:  # another uninstall was first
            raise InstallError(f"no pycni install recorded in {bin_dir} ({MANIFEST} missing)")
        done = _uninstall_locked(bin_dir, manifest)
        lock_file.unlink()  # whoever waits on it takes the lock on the next file there
    for d in sorted(manifest.created_dirs, key=len, reverse=True):
        try:
            Path(d).rmdir()
            done.append(f"removed empty dir {d}")
        except OSError:
            pass  # not empty: someone else uses it now
    return done


def _uninstall_locked(bin_dir: Path, manifest: Manifest) -> list[str]:
    done = []
    if manifest.systemd:
        units.systemctl("disable", "--now", *UNITS, check=False)
        done.append("disabled and stopped " + " ".join(UNITS))
    for e in reversed(manifest.entries):
        path = Path(e.path)
        if e.matches_disk():
            path.unlink()
            done.append(f"removed {path}")
        elif path.exists() or path.is_symlink():
            done.append(f"left {path}: changed since install, not ours any more")
            continue
        if e.backup and Path(e.backup).exists():
            os.replace(e.backup, path)
            done.append(f"restored {path} from {e.backup}")
    if manifest.systemd:
        units.systemctl("daemon-reload", check=False)
    if manifest.lib:  # an executable restored from a backup may name a copy: it stays
        done += _prune(bin_dir, None, inuse.now_ticks())
    (bin_dir / MANIFEST).unlink()
    backups = bin_dir / BACKUPS
    if backups.is_dir() and not any(backups.iterdir()):
        backups.rmdir()
    return done


def compile_package(python: Path) -> None:
    """Bytecode for the cni package, so the first exec of a plugin need not compile anything."""
    if failed := copies.compile_tree(python, PACKAGE):
        raise InstallError(failed)
