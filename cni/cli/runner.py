"""`pycni add|check|del|gc|status|version`: a cnitool-compatible runner and plugin versions.

Same environment as cnitool: NETCONFPATH (default /etc/cni/net.d), CNI_PATH, CNI_ARGS, CAP_ARGS
(JSON), CNI_IFNAME (default eth0); the container ID is "cnitool-" + the first 20 hex digits of
sha512(netns path) unless CNI_CONTAINERID is set, so pycni and cnitool name an attachment alike
and share libcni's result cache (default /var/lib/cni, `--cache-dir` / PYCNI_CACHE_DIR).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from cni.host.digest import sha512_hex
from cni.runtime.cache import DEFAULT_CACHE_DIR, go_json
from cni.runtime.chain import Runtime, RuntimeConf, parse_valid_attachments
from cni.runtime.conflist import DEFAULT_NETCONFPATH, NetworkConfigList, load
from cni.spec.errors import CNIError, Code

# ---- cnitool's environment --------------------------------------------------------------------


def fail(err: Exception) -> NoReturn:
    """cnitool's exit: the error text on stderr, status 1."""
    click.echo(str(err), err=True)
    sys.exit(1)


def container_id_for(netns: str) -> str:
    """cnitool's rule: "cnitool-" + hex(sha512(absolute netns path))[:20]."""
    return "cnitool-" + sha512_hex(netns, 20)


def abs_netns(netns: str) -> str:
    """Go's filepath.Abs: absolute and cleaned (no leading '//' kept, unlike normpath)."""
    path = os.path.abspath(netns)
    return "/" + path.lstrip("/") if path.startswith("//") else path


def parse_cni_args(text: str) -> list[tuple[str, str]]:
    """CNI_ARGS "K=V;K2=V2" as cnitool parses it: every pair needs a key and a value."""
    pairs = []
    for pair in text.split(";"):
        kv = pair.split("=")
        if len(kv) != 2 or not kv[0] or not kv[1]:
            raise CNIError(Code.INVALID_ENV, f'invalid CNI_ARGS pair "{pair}"')
        pairs.append((kv[0], kv[1]))
    return pairs


def cni_path() -> list[str]:
    return [p for p in os.environ.get("CNI_PATH", "").split(os.pathsep) if p]


def load_network(name: str) -> NetworkConfigList:
    return load(os.environ.get("NETCONFPATH") or DEFAULT_NETCONFPATH, name)


def runtime_conf(netns: str, ifname: str | None) -> RuntimeConf:
    cap_args: dict[str, Any] = {}
    if raw := os.environ.get("CAP_ARGS", ""):
        try:
            cap_args = json.loads(raw)
        except ValueError as e:
            raise CNIError(Code.DECODING_FAILURE, f"CAP_ARGS: {e}") from None
        if not isinstance(cap_args, dict):
            raise CNIError(Code.DECODING_FAILURE, "CAP_ARGS must be a JSON object")
    cni_args = parse_cni_args(raw) if (raw := os.environ.get("CNI_ARGS", "")) else []
    ifname = ifname or os.environ.get("CNI_IFNAME") or "eth0"
    netns = abs_netns(netns)
    container_id = os.environ.get("CNI_CONTAINERID") or container_id_for(netns)
    return RuntimeConf(container_id, netns, ifname, cni_args, cap_args)


def _runtime(cache_dir: str) -> Runtime:
    return Runtime(cni_path(), cache_dir=cache_dir)


def cache_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--cache-dir", envvar="PYCNI_CACHE_DIR", default=DEFAULT_CACHE_DIR,
                        show_default=True, help="libcni result cache directory.")(f)


def ifname_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-i", "--ifname", default=None,
                        help="Interface name (default: $CNI_IFNAME or eth0).")(f)


# ---- the cnitool verbs ------------------------------------------------------------------------


@click.command()
@click.argument("network")
@click.argument("netns")
@ifname_option
@cache_dir_option
def add(network: str, netns: str, ifname: str | None, cache_dir: str) -> None:
    """ADD the network's plugins to NETNS, in order; prints the result."""
    try:
        final = _runtime(cache_dir).add(load_network(network), runtime_conf(netns, ifname))
    except CNIError as e:
        fail(e)
    if final is not None:
        click.echo(go_json(final.printable(), sort_keys=False, indent=4).decode())


@click.command()
@click.argument("network")
@click.argument("netns")
@ifname_option
@cache_dir_option
def check(network: str, netns: str, ifname: str | None, cache_dir: str) -> None:
    """CHECK the attachment, plugins in order, against the cached ADD result."""
    try:
        _runtime(cache_dir).check(load_network(network), runtime_conf(netns, ifname))
    except CNIError as e:
        fail(e)


@click.command(name="del")
@click.argument("network")
@click.argument("netns")
@ifname_option
@cache_dir_option
def delete(network: str, netns: str, ifname: str | None, cache_dir: str) -> None:
    """DEL the attachment, plugins in reverse order; drops the cache entry."""
    try:
        _runtime(cache_dir).delete(load_network(network), runtime_conf(netns, ifname))
    except CNIError as e:
        fail(e)


@click.command()
@click.argument("network")
@click.argument("netns", required=False)
@click.option("--valid-attachments", "valid_json", default=None, metavar="JSON",
              help='Still-valid attachments, [{"containerID": ..., "ifname": ...}], '
                   "or @FILE, or - for stdin. Without it every cached attachment is stale.")
@cache_dir_option
def gc(network: str, netns: str | None, valid_json: str | None, cache_dir: str) -> None:
    """GC the network: DEL stale cached attachments, then GC every plugin.

    NETNS is accepted for cnitool compatibility and ignored.
    """
    try:
        valid = None
        if valid_json is not None:
            valid = parse_valid_attachments(json.loads(_read_arg(valid_json)))
        _runtime(cache_dir).gc(load_network(network), valid)
    except ValueError as e:
        fail(CNIError(Code.DECODING_FAILURE, f"--valid-attachments: {e}"))
    except (CNIError, OSError) as e:
        fail(e)


@click.command()
@click.argument("network")
@click.argument("netns", required=False)
def status(network: str, netns: str | None) -> None:
    """STATUS of every plugin of the network (NETNS is ignored)."""
    try:
        Runtime(cni_path()).status(load_network(network))
    except CNIError as e:
        fail(e)


@click.command()
@click.argument("plugins", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def version(plugins: tuple[str, ...], as_json: bool) -> None:
    """What each plugin in CNI_PATH supports (exec VERSION); or only the PLUGINS named."""
    runtime = Runtime(cni_path(), stderr=sys.stderr)
    names = list(plugins) or _plugins_in_path(runtime.path)
    report: dict[str, dict[str, Any]] = {}
    failed = False
    for name in names:
        try:
            info = runtime.version_info(name)
            report[name] = {"path": runtime.find(name), **info}
        except CNIError as e:
            report[name] = {"error": str(e)}
            failed = True
    if as_json:
        click.echo(json.dumps(report, indent=4))
    else:
        width = max((len(n) for n in report), default=0)
        for name, info in report.items():
            shown = (f"error: {info['error']}" if "error" in info
                     else ", ".join(info["supportedVersions"]) + f"  ({info['path']})")
            click.echo(f"{name:<{width}}  {shown}")
    if failed and plugins:
        sys.exit(1)


def _read_arg(value: str) -> str:
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        with open(value[1:]) as f:
            return f.read()
    return value


def _plugins_in_path(paths: list[str]) -> list[str]:
    """Executable files in CNI_PATH, the first of each name winning, as exec would pick."""
    seen: dict[str, None] = {}
    for directory in paths:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_file() and os.access(entry.path, os.X_OK):
                seen.setdefault(entry.name, None)
    return list(seen)
