"""Finding and loading network configurations the way libcni does (LoadNetworkConf).

In NETCONFPATH: every `*.conflist` (sorted by name) first, the first whose `name` matches wins;
then the deprecated single-plugin `*.conf` / `*.json` files, wrapped into a one-plugin list.
Plugins in `<dir>/<network name>/*.conf` are appended unless `loadOnlyInlinedPlugins` is true.
`cniVersions`: the highest version among it and `cniVersion` that this runtime speaks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni.runtime.cache import go_json
from cni.spec.errors import CNIError, Code
from cni.spec.version import CURRENT, parse

DEFAULT_NETCONFPATH = "/etc/cni/net.d"


@dataclass
class NetworkConfigList:
    name: str
    cni_version: str
    plugins: list[dict[str, Any]]
    raw: bytes  # the file's bytes: what the result cache stores (base64) as "config"
    # cniVersions as listed plus the declared cniVersion; empty without cniVersions
    cni_versions: list[str] = field(default_factory=list)
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    source: str = ""

    @property
    def offered_versions(self) -> list[str]:
        """cniVersion and cniVersions that this runtime speaks, highest first."""
        versions = {v for v in [*self.cni_versions, self.cni_version] if _usable(v)}
        return sorted(versions, key=parse, reverse=True)


def _err(msg: str) -> CNIError:
    return CNIError(Code.INVALID_CONFIG, msg)


def _le_current(version: str) -> bool:
    return parse(version) <= parse(CURRENT)


def _usable(version: str) -> bool:
    try:
        return _le_current(version)
    except CNIError:
        return False


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise _err(f"error parsing {what}: {e}") from None
    if not isinstance(obj, dict):
        raise _err(f"error parsing {what}: not a JSON object")
    return obj


def plugin_from_bytes(data: bytes) -> dict[str, Any]:
    conf = _json_object(data, "configuration")
    if not conf.get("type") or not isinstance(conf["type"], str):
        raise _err("error parsing configuration: missing 'type'")
    return conf


def from_bytes(data: bytes, source: str = "") -> NetworkConfigList:
    """A conflist from its bytes (libcni NetworkConfFromBytes); plugins may still be empty."""
    raw = _json_object(data, "configuration list")
    if "name" not in raw:
        raise _err("error parsing configuration list: no name")
    name = raw["name"]
    if not isinstance(name, str):
        raise _err(f"error parsing configuration list: invalid name type {_go_type(name)}")
    cni_version = raw.get("cniVersion", "")
    if not isinstance(cni_version, str):
        raise _err("error parsing configuration list: invalid cniVersion type "
                   f"{_go_type(cni_version)}")

    listed: list[str] = []
    if "cniVersions" in raw:
        versions = raw["cniVersions"]
        if not isinstance(versions, list):
            raise _err("error parsing configuration list: invalid type for cniVersions: "
                       f"{_go_type(versions)}")
        for i, v in enumerate(versions):
            if not isinstance(v, str):
                raise _err("error parsing configuration list: invalid type for cniVersions "
                           f"index {i}: {_go_type(v)}")
            try:
                parse(v)
            except CNIError as e:
                raise _err(f"error parsing configuration list: invalid cniVersions entry {v} "
                           f"at index {i}: {e.msg}") from None
            listed.append(v)
        candidates = [v for v in listed if _le_current(v)]
        if cni_version:
            try:
                if _le_current(cni_version):
                    candidates.append(cni_version)
            except CNIError as e:
                raise _err(f"error parsing configuration list: invalid cniVersion {cni_version}: "
                           f"{e.msg}") from None
        if cni_version:
            listed.append(cni_version)  # still offered to plugins that lack the highest
        if candidates:
            cni_version = max(candidates, key=parse)

    conf = NetworkConfigList(
        name=name, cni_version=cni_version, plugins=[], raw=bytes(data), cni_versions=listed,
        disable_check=_read_bool(raw, "disableCheck"), disable_gc=_read_bool(raw, "disableGC"),
        load_only_inlined_plugins=_read_bool(raw, "loadOnlyInlinedPlugins"), source=source)

    if "plugins" not in raw:
        if conf.load_only_inlined_plugins:
            raise _err("error parsing configuration list: `loadOnlyInlinedPlugins` is true, "
                       "and no 'plugins' key")
        return conf
    plugins = raw["plugins"]
    if not isinstance(plugins, list):
        raise _err(f"error parsing configuration list: invalid 'plugins' type {_go_type(plugins)}")
    if not plugins:
        raise _err("error parsing configuration list: no plugins in list")
    for i, plugin in enumerate(plugins):
        try:
            conf.plugins.append(plugin_from_bytes(go_json(plugin)))
        except CNIError as e:
            raise _err(f"failed to parse plugin config {i}: {e.msg}") from None
    return conf


def from_file(path: str | os.PathLike[str]) -> NetworkConfigList:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CNIError(Code.IO_FAILURE, f"error reading {path}: {e.strerror}") from None
    conf = from_bytes(data, source=str(path))
    if not conf.load_only_inlined_plugins:
        conf.plugins += _plugins_from_dir(path.parent / conf.name)
    if not conf.plugins:
        raise _err("no plugin configs found")
    return conf


def from_single_conf(data: bytes, source: str = "") -> NetworkConfigList:
    """A deprecated single-plugin .conf, wrapped in a list as libcni's ConfListFromConf does."""
    plugin = plugin_from_bytes(data)
    name, version = plugin.get("name", ""), plugin.get("cniVersion", "")
    wrapped = {"name": name if isinstance(name, str) else "",
               "cniVersion": version if isinstance(version, str) else "",
               "plugins": [plugin]}
    conf = from_bytes(go_json(wrapped), source=source)
    return conf


def conf_files(directory: str | os.PathLike[str], extensions: tuple[str, ...]) -> list[Path]:
    """Regular files in `directory` with one of the extensions, sorted; none if it is missing."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CNIError(Code.IO_FAILURE, f"reading {directory}: {e.strerror}") from None
    found = [Path(e.path) for e in entries
             if not e.is_dir() and os.path.splitext(e.name)[1] in extensions]
    return sorted(found)


def load(directory: str | os.PathLike[str], name: str) -> NetworkConfigList:
    """The network called `name` in `directory` (libcni LoadNetworkConf), or an error."""
    lists = conf_files(directory, (".conflist",))
    for path in lists:
        conf = from_file(path)
        if conf.name == name:
            return conf
    singles = conf_files(directory, (".conf", ".json"))
    if not singles:
        if lists:
            raise not_found(directory, name)
        raise CNIError(Code.INVALID_CONFIG, f"no net configurations found in {directory}")
    for path in singles:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CNIError(Code.IO_FAILURE, f"error reading {path}: {e.strerror}") from None
        if plugin_from_bytes(data).get("name") == name:
            return from_single_conf(data, source=str(path))
    raise not_found(directory, name)


def not_found(directory: str | os.PathLike[str], name: str) -> CNIError:
    return CNIError(Code.INVALID_CONFIG, f'no net configuration with name "{name}" in {directory}')


def _plugins_from_dir(directory: Path) -> list[dict[str, Any]]:
    plugins = []
    for path in conf_files(directory, (".conf",)):
        try:
            plugins.append(plugin_from_bytes(path.read_bytes()))
        except OSError as e:
            raise CNIError(Code.IO_FAILURE, f"error reading {path}: {e.strerror}") from None
    return plugins


def _read_bool(raw: dict[str, Any], key: str) -> bool:
    """libcni accepts a bool or the strings "true" / "false" in any case."""
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise _err(f"error parsing configuration list: invalid type {_go_type(value)} for {key}")
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _err(f'error parsing configuration list: invalid value "{value.lower()}" for {key}')


def _go_type(value: Any) -> str:
    """The Go type name encoding/json would have decoded `value` into, for messages."""
    names = {bool: "bool", int: "float64", float: "float64", str: "string",
             list: "[]interface {}", dict: "map[string]interface {}"}
    return names.get(type(value), "<nil>")
