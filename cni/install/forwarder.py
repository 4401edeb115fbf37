"""`pycni install --forwarder`: the plugin names linked to pycni-forwarder (forwarder/, a static
Go binary speaking the shim's protocol) instead of the Python multi-call executable, which stays
installed as the forwarder's in-process fallback. docs/DESIGN.md ("The forwarder") is the
contract the image build relies on: where the binary is found, what lands in the bin dir.

The forwarder answers VERSION from `.pycni-forwarder.json` beside it (written here, root's, mode
0644): every linked name's versions as the shim computes them (registry.supported with the
install's entry-point table), the Python executable's path and pycni's version. VERSION stays a
function of install-time data, as the Python executable's baked-in table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cni import __version__, registry
from cni.install import trust
from cni.install.errors import MULTICALL, InstallError
from cni.install.render import ROOT
from cni.spec import version as versions

FORWARDER = "pycni-forwarder"  # the binary's name in the bin dir (and beside the venv's python)
TABLE = ".pycni-forwarder.json"  # its install table (forwarder/table.go reads it)
BUILT = ROOT / "build" / "forwarder" / FORWARDER  # what `make forwarder` makes in a checkout


def find_binary(explicit: Path | None, python: Path) -> Path:
    """The binary to install: --forwarder-binary, else beside the interpreter (an image's
    venv), else a checkout's build; it must pass the trust walk (root's alone, as what it
    reads: it becomes what the runtime execs)."""
    candidates = [explicit] if explicit else [python.parent / FORWARDER, BUILT]
    for path in candidates:
        if path.exists():
            trust.walk(path, "forwarder binary")
            if not path.is_file() or not os.access(path, os.X_OK):
                raise InstallError(f"forwarder binary: {path} is not an executable file")
            return path
    raise InstallError("no forwarder binary at " + " or ".join(map(str, candidates))
                       + " (`make forwarder` builds one; --forwarder-binary names another)")


def table(bin_dir: Path, plugins: dict[str, tuple[str, str]]) -> bytes:
    """The install table: each name linked (built-ins and entry points) with its versions."""
    speaks = {}
    for name in (*registry.NAMES, *sorted(plugins)):
        first = registry.SUPPORTED_FROM.get(name) or (plugins.get(name, ("", ""))[1] or None)
        all_ = versions.SUPPORTED
        speaks[name] = list(all_ if first not in all_ else all_[all_.index(first):])
    data = {"python": str(bin_dir / MULTICALL), "version": __version__,
            "supported": list(versions.SUPPORTED), "plugins": speaks}
    return json.dumps(data, indent=2).encode() + b"\n"


def links(bin_dir: Path, names: list[str]) -> dict[str, list[str]]:
    """Which of the plugin names in bin_dir link to which executable of ours (by link text)."""
    out: dict[str, list[str]] = {MULTICALL: [], FORWARDER: []}
    for name in names:
        path = bin_dir / name
        if path.is_symlink() and (target := os.readlink(path)) in out:
            out[target].append(name)
    return out


def refuse_mixed(bin_dir: Path, names: list[str], recorded: dict[str, str]) -> None:
    """A bin dir whose plugin names link some to the forwarder and some to the Python executable
    is refused, unless that is exactly what the manifest records (an interrupted install,
    which this one completes): someone changed links by hand, and which kind this node runs
    is theirs to settle (or --force relinks them all, keeping the odd ones as backups)."""
    found = links(bin_dir, names)
    if not (found[MULTICALL] and found[FORWARDER]):
        return
    if all(recorded.get(str(bin_dir / n)) == t for t, ns in found.items() for n in ns):
        return
    raise InstallError(
        f"{bin_dir} is a mixed node: {', '.join(found[FORWARDER])} link to {FORWARDER} and "
        f"{', '.join(found[MULTICALL])} to {MULTICALL}, which no install of pycni left; "
        "relink them to one of the two (or run install with --force, which relinks them all "
        "and keeps the odd ones as backups); nothing was written")
