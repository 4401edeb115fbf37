"""What install writes, rendered from the package's data (cni/data: links to the checkout's
bin/cni-plugin and conf/, copied into the wheel): the multi-call executable for its new home, the
conflist, and the daemon's systemd units."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from cni.install import trust
from cni.install.errors import InstallError

ROOT = Path(__file__).resolve().parent.parent.parent  # the dir `cni` is in: a checkout or a site
PACKAGE = ROOT / "cni"
DATA = resources.files("cni") / "data"
SOURCE = DATA / "cni-plugin"
CONF_SRC = DATA / "conf"
MARKER = "pycni-multicall"
ROOT_TAG = "# pycni:root"
PATH_TAG = "# pycni:path"
PLUGINS_TAG = "# pycni:plugins"
SHEBANG_MAX = 255  # the kernel reads at most this much of a #! line (BINPRM_BUF_SIZE - 1)
UNITS = ("pycni.socket", "pycni.service")


def venv_python() -> Path:
    """The interpreter the executables run: a checkout's venv (it has the dependencies), else
    the one running this (a wheel's venv, pipx's). Not resolved: a venv's python is a link."""
    venv = ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


def site_dirs(python: Path) -> list[str]:
    """Where `python` finds its installed packages (purelib, platlib): the executables run it
    with -S, so they put these on sys.path themselves."""
    code = "import sysconfig as s; print(s.get_path('purelib')); print(s.get_path('platlib'))"
    try:
        proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(f"cannot run {python}: {e}") from None
    if proc.returncode != 0:
        raise InstallError(f"{python} failed to name its site dirs: {proc.stderr.strip()}")
    out: list[str] = []
    for d in proc.stdout.split():
        if not any(os.path.realpath(d) == os.path.realpath(seen) for seen in out):
            out.append(d)
    return out


def in_site(root: Path, sites: list[str]) -> bool:
    return any(os.path.realpath(d) == os.path.realpath(root) for d in sites)


def render_multicall(python: Path, root: Path, source: str | None = None,
                     sites: list[str] | None = None,
                     plugins: dict[str, tuple[str, str]] | None = None) -> bytes:
    """bin/cni-plugin rewritten for an installed copy: direct shebang, absolute root, and the
    dependencies' dirs (sites, default site_dirs(python)) after the stdlib. A checkout's root
    comes first, as in bin/; a root that is itself a site dir (a wheel) goes last with the rest,
    so nothing installed there can shadow the stdlib modules the shim imports. `plugins`
    (entrypoints.plugin_table) is baked in, for the shim to put in cni.registry.INSTALLED."""
    text = SOURCE.read_text() if source is None else source
    shebang = f"#!{python} -IS"
    if len(shebang) > SHEBANG_MAX or " " in str(python):
        raise InstallError(f"interpreter path {python} cannot go in a #! line "
                           f"(too long or has spaces): move the project to a shorter path")
    sites = site_dirs(python) if sites is None else sites
    paths = ([] if in_site(root, sites) else ["sys.path.insert(0, _root)"]) + [
        f"sys.path.append({d!r})" for d in sites]
    out = [shebang]
    saw_root = saw_path = False
    for line in text.splitlines()[1:]:
        if line.startswith("''''"):  # the sh trampoline line: the shebang now does its job
            continue
        if ROOT_TAG in line and line.lstrip().startswith("_root"):
            line = f"_root = {str(root)!r}  {ROOT_TAG}"
            saw_root = True
        elif line.endswith(PLUGINS_TAG):
            line = f"_plugins = {dict(sorted((plugins or {}).items()))!r}  {PLUGINS_TAG}"
        elif line.endswith(PATH_TAG):
            if not saw_path:
                out += [f"{p}  {PATH_TAG}" for p in paths]
            saw_path = True
            continue
        out.append(line)
    body = "\n".join(out) + "\n"
    if MARKER not in body[:1024] or not saw_root or not saw_path:
        raise InstallError(f"{SOURCE} lacks the {MARKER!r} marker or the {ROOT_TAG!r} or "
                           f"{PATH_TAG!r} lines")
    return body.encode()


def root_named(text: str) -> str | None:
    """The root an installed executable's root line names (None: not one of ours)."""
    for line in text.splitlines():
        if line.startswith("_root = ") and line.endswith(ROOT_TAG):
            try:
                value = ast.literal_eval(line[len("_root = "):-len(ROOT_TAG)].strip())
            except (ValueError, SyntaxError):
                return None
            return value if isinstance(value, str) else None
    return None


def shipped_conflists() -> list[str]:
    """The names of the conflists the package ships."""
    return sorted(p.name for p in CONF_SRC.iterdir() if p.name.endswith((".conf", ".conflist")))


def conflist_source(name: str) -> tuple[str, bytes]:
    """The file name and content of the conflist to install. A bare name is a conflist the
    package ships, never a file of the cwd (root running install in a dir a user can write
    must not pick up theirs); a file of one's own is given by a path with a /, and root reads it
    only if root owns it (trust.read_file)."""
    if "/" in name:
        return Path(name).name, trust.read_file(Path(name), "conflist")
    candidate = CONF_SRC / name
    if not candidate.is_file():
        available = ", ".join(shipped_conflists()) or "none"
        raise InstallError(f"no conflist {name!r} shipped in {CONF_SRC} (available: "
                           f"{available}); a file of your own is given by a path with a /, "
                           f"as ./{name}")
    return name, trust.read_file(Path(str(candidate)), "shipped conflist")


def render_conflist(name: str, raw: bytes, cni_version: str | None) -> bytes:
    """The conflist as it will be written; with cni_version its cniVersion is rewritten (runtimes
    built on libcni before 1.2, like containerd 1.6 and 1.7 and podman 4, refuse 1.1.0)."""
    try:
        conf = json.loads(raw)
    except ValueError as e:
        raise InstallError(f"{name}: not JSON: {e}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("name"), str):
        raise InstallError(f"{name}: not a network configuration (no name)")
    if cni_version is None:
        return raw
    conf["cniVersion"] = cni_version
    return json.dumps(conf, indent=2).encode() + b"\n"


def render_unit(name: str, python: Path) -> bytes:
    """conf/<name> for this install: the daemon is this venv's `pycni daemon`; the docs are the
    README the package carries."""
    text = (CONF_SRC / name).read_text()
    pycni = python.parent / "pycni"
    daemon = f"{pycni} daemon" if pycni.exists() else f"{python} -m cni.cli daemon"
    out = []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={daemon}"
        elif line.startswith("Documentation=file://"):
            line = f"Documentation=file://{Path(str(DATA / 'README.md')).resolve()}"
        out.append(line)
    return ("\n".join(out) + "\n").encode()
