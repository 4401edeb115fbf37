"""Running a network configuration list (spec section 3; libcni's CNIConfig).

ADD runs the plugins in order, each one's result becoming the next one's prevResult, and caches
the final result only once the whole chain succeeded. CHECK runs in order and DEL in reverse, both
with the cached result as prevResult. GC DELs every cached attachment of the network that is not
in the valid set, then sends GC to each plugin, collecting all errors. STATUS stops at the first.

Versions: every plugin gets the list's cniVersion, as with libcni. Only when the list offers
`cniVersions` does the runtime ask each plugin (VERSION) and give it the highest offered version
it speaks (spec 1.1: "Runtimes MAY consider the set of supported plugin versions"), so one list
can chain plugins of different spec generations; prevResult is converted to each one's version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from cni.runtime import invoke
from cni.runtime.cache import DEFAULT_CACHE_DIR, CachedAttachment, ResultCache, go_json
from cni.runtime.conflist import NetworkConfigList
from cni.spec import names
from cni.spec import result as results
from cni.spec.errors import CNIError, Code
from cni.spec.version import SUPPORTED, at_least

Result = dict[str, Any]
VALID_ATTACHMENTS_KEY = "cni.dev/valid-attachments"
GC_PARALLEL = 4  # stale attachments DELed at once by gc


@dataclass
class RuntimeConf:
    """One attachment's parameters (libcni RuntimeConf)."""

    container_id: str
    netns: str
    ifname: str
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class AddResult:
    """The final result of an ADD chain, canonical, with the version its plugin printed."""

    result: Result
    version: str

    def printable(self) -> Result:
        return results.from_current(self.result, self.version)


class MultiError(CNIError):
    """Several errors (GC goes on after a failure); the code is the first error's."""

    def __init__(self, errors: list[CNIError]) -> None:
        super().__init__(errors[0].code, "\n".join(str(e) for e in errors))
        self.errors = errors


# ---- request building -------------------------------------------------------------------------

def runtime_config(plugin: dict[str, Any], capability_args: dict[str, Any]) -> dict[str, Any]:
    """The capability args whose capability this plugin declares true (libcni semantics)."""
    caps = plugin.get("capabilities")
    if not isinstance(caps, dict):
        return {}
    return {cap: capability_args[cap] for cap, on in caps.items()
            if on is True and cap in capability_args}


def build_request(plugin: dict[str, Any], name: str, cni_version: str,
                  prev_result: Result | None = None,
                  capability_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """One plugin's stdin: its config object plus name, cniVersion, prevResult, runtimeConfig.

    Like libcni, `capabilities` stays in (plugins tolerate it) and a runtimeConfig already in
    the config is replaced only when the runtime has capability args for this plugin.
    """
    request = dict(plugin)
    request["name"] = name
    request["cniVersion"] = cni_version
    if prev_result is not None:
        request["prevResult"] = results.from_current(prev_result, cni_version)
    if capability_args:
        rc = runtime_config(plugin, capability_args)
        if rc:
            request["runtimeConfig"] = rc
    return request


def request_bytes(request: dict[str, Any]) -> bytes:
    """The stdin bytes as libcni's InjectConf marshals them: a Go map (sorted keys) whose
    prevResult is a result struct (fields in spec order)."""
    parts = []
    for key in sorted(request):
        value = go_json(request[key], sort_keys=key != "prevResult")
        parts.append(go_json(key) + b":" + value)
    return b"{" + b",".join(parts) + b"}"


def describe(plugin: dict[str, Any]) -> str:
    """libcni's pluginDescription: `type="bridge"`, plus the plugin's own name if it has one."""
    out = f"type={json.dumps(plugin.get('type', ''))}"
    if isinstance(plugin.get("name"), str) and plugin["name"]:
        out += f" name={json.dumps(plugin['name'])}"
    return out


def validate_attachment(network: str, rt: RuntimeConf) -> None:
    """libcni's checks before an ADD: container ID, network name, interface name."""
    names.check_container_id(rt.container_id)
    names.check_network_name(network)
    names.check_ifname(rt.ifname)


def parse_valid_attachments(data: Any) -> list[tuple[str, str]]:
    """`[{"containerID": ..., "ifname": ...}]` (libcni GCAttachment JSON) -> pairs."""
    if not isinstance(data, list):
        raise CNIError(Code.INVALID_CONFIG, "valid attachments must be a JSON list")
    pairs = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str) \
                or not isinstance(item.get("ifname"), str):
            raise CNIError(Code.INVALID_CONFIG, f"invalid attachment {json.dumps(item)}: "
                           'want {"containerID": ..., "ifname": ...}')
        pairs.append((item["containerID"], item["ifname"]))
    return pairs


# ---- the runtime ------------------------------------------------------------------------------

class Runtime:
    """Runs conflists: plugins from `path` (CNI_PATH), result cache under `cache_dir`."""

    def __init__(self, path: Iterable[str], cache_dir: str = DEFAULT_CACHE_DIR,
                 stderr: IO[str] | None = None) -> None:
        self.path = [p for p in path if p]
        self.cache = ResultCache(cache_dir)
        self.stderr = stderr
        self._versions: dict[str, dict[str, Any]] = {}

    # -- plugins

    def find(self, plugin_type: str) -> str:
        return invoke.find_in_path(plugin_type, self.path)

    def version_info(self, plugin_type: str) -> dict[str, Any]:
        exe = self.find(plugin_type)
        if exe not in self._versions:
            self._versions[exe] = invoke.version_info(exe, stderr=self.stderr)
        return self._versions[exe]

    def plugin_versions(self, conf: NetworkConfigList) -> list[str]:
        """The version each plugin of the list is spoken to in (see the module docstring)."""
        if not conf.cni_versions:
            return [conf.cni_version] * len(conf.plugins)
        offered = conf.offered_versions
        chosen = []
        for plugin in conf.plugins:
            speaks = set(self.version_info(plugin.get("type", ""))["supportedVersions"])
            pick = next((v for v in offered if v in speaks and v in SUPPORTED), None)
            if pick is None:
                raise CNIError(Code.INCOMPATIBLE_VERSION,
                               f"plugin {describe(plugin)} supports none of the network's "
                               f"versions [{', '.join(offered)}]",
                               f"plugin supports [{', '.join(sorted(speaks))}]")
            chosen.append(pick)
        return chosen

    def _exec(self, plugin: dict[str, Any], request: dict[str, Any],
              args: invoke.Args) -> bytes:
        exe = self.find(plugin.get("type", ""))
        return invoke.exec_plugin(exe, request_bytes(request), args.env(), stderr=self.stderr)

    def _args(self, command: str, rt: RuntimeConf | None = None) -> invoke.Args:
        if rt is None:
            return invoke.Args(command, path=self.path)
        return invoke.Args(command, rt.container_id, rt.netns, rt.ifname, list(rt.cni_args),
                           self.path)

    # -- cache

    def cached_result(self, conf: NetworkConfigList, rt: RuntimeConf) -> Result | None:
        """The cached ADD result, canonical, or None; an unreadable cache is an error."""
        try:
            raw = self.cache.read_result(conf.name, rt.container_id, rt.ifname)
            if raw is None:
                return None
            version = raw.get("cniVersion") or conf.cni_version or "0.1.0"
            return results.to_current(raw, version)
        except (ValueError, CNIError) as e:
            raise CNIError(getattr(e, "code", Code.DECODING_FAILURE),
                           f'failed to get network "{conf.name}" cached result: {e}') from None

    # -- operations

    def add(self, conf: NetworkConfigList, rt: RuntimeConf) -> AddResult | None:
        versions = self.plugin_versions(conf)
        final: AddResult | None = None
        for plugin, version in zip(conf.plugins, versions, strict=True):
            try:
                self.find(plugin.get("type", ""))
                validate_attachment(conf.name, rt)
                request = build_request(plugin, conf.name, version,
                                        final.result if final else None, rt.capability_args)
                out = self._exec(plugin, request, self._args("ADD", rt))
                final = AddResult(*invoke.decode_result(out, version))
            except CNIError as e:
                raise _wrap(e, f"plugin {describe(plugin)} failed (add)") from None
        try:
            self.cache.write(CachedAttachment(
                container_id=rt.container_id, network=conf.name, ifname=rt.ifname,
                config=conf.raw, netns=rt.netns, cni_args=list(rt.cni_args),
                capability_args=rt.capability_args,
                result=final.printable() if final else None))
        except OSError as e:
            # As libcni: the ADD is reported failed; the runtime's DEL cleans the attachment.
            raise CNIError(Code.IO_FAILURE, f'failed to set network "{conf.name}" cached '
                           f"result: {e.strerror or e}") from None
        return final

    def check(self, conf: NetworkConfigList, rt: RuntimeConf) -> None:
        if not at_least(conf.cni_version or "0.1.0", "0.4.0"):
            raise CNIError(Code.INCOMPATIBLE_VERSION, f'configuration version '
                           f'"{conf.cni_version}" does not support the CHECK command')
        if conf.disable_check:
            return
        cached = self.cached_result(conf, rt)
        for plugin, version in zip(conf.plugins, self.plugin_versions(conf), strict=True):
            request = build_request(plugin, conf.name, version, cached, rt.capability_args)
            try:
                self._exec(plugin, request, self._args("CHECK", rt))
            except CNIError as e:
                raise _wrap(e, f"plugin {describe(plugin)} failed (check)") from None

    def delete(self, conf: NetworkConfigList, rt: RuntimeConf) -> None:
        cached = None
        if at_least(conf.cni_version or "0.1.0", "0.4.0"):
            try:
                cached = self.cached_result(conf, rt)
            except CNIError:
                # An unreadable cache must not block DEL (libcni drops it and goes on).
                self.cache.remove(conf.name, rt.container_id, rt.ifname)
        pairs = list(zip(conf.plugins, self.plugin_versions(conf), strict=True))
        for plugin, version in reversed(pairs):
            prev = cached if at_least(version or "0.1.0", "0.4.0") else None
            request = build_request(plugin, conf.name, version, prev, rt.capability_args)
            try:
                self._exec(plugin, request, self._args("DEL", rt))
            except CNIError as e:
                raise _wrap(e, f"plugin {describe(plugin)} failed (delete)") from None
        self.cache.remove(conf.name, rt.container_id, rt.ifname)

    def gc(self, conf: NetworkConfigList,
           valid: list[tuple[str, str]] | None = None) -> None:
        """DEL stale cached attachments, then GC every plugin (>= 1.1.0); all errors reported.

        `valid` None means no list was given (cnitool's gc): every cached attachment is stale
        and plugins get no `cni.dev/valid-attachments` key.
        """
        if conf.disable_gc:
            return
        keep = set(valid or [])
        stale = [RuntimeConf(att.container_id, att.netns, att.ifname, att.cni_args,
                             att.capability_args) for att in self.cache.attachments()
                 if att.network == conf.name and (att.container_id, att.ifname) not in keep]

        def delete(rt: RuntimeConf) -> CNIError | None:
            try:
                self.delete(conf, rt)
            except CNIError as e:
                return _wrap(e, f"failed to delete stale attachment {rt.container_id} "
                                f"{rt.ifname}")
            return None

        # A few at a time, as a runtime DELs pods: each attachment is its own (the plugins
        # lock what they share), and a node's GC after an outage can have many to remove.
        with ThreadPoolExecutor(max(1, min(GC_PARALLEL, len(stale)))) as pool:
            errors = [e for e in pool.map(delete, stale) if e is not None]
        try:
            versions = self.plugin_versions(conf)
        except CNIError as e:
            raise MultiError([*errors, e]) from None
        for plugin, version in zip(conf.plugins, versions, strict=True):
            if not at_least(version or "0.1.0", "1.1.0"):
                continue
            request = build_request(plugin, conf.name, version)
            if valid is not None:
                request[VALID_ATTACHMENTS_KEY] = [{"containerID": c, "ifname": i}
                                                  for c, i in valid]
            try:
                self._exec(plugin, request, self._args("GC"))
            except CNIError as e:
                errors.append(_wrap(e, f"failed to GC plugin {plugin.get('type', '')}"))
        if errors:
            raise MultiError(errors)

    def status(self, conf: NetworkConfigList) -> None:
        """STATUS each plugin (>= 1.1.0); the first error is returned as is, code and all."""
        for plugin, version in zip(conf.plugins, self.plugin_versions(conf), strict=True):
            if not at_least(version or "0.1.0", "1.1.0"):
                continue
            self._exec(plugin, build_request(plugin, conf.name, version), self._args("STATUS"))


def _wrap(e: CNIError, context: str) -> CNIError:
    """Prefix the message like libcni's fmt.Errorf("...: %w"), keeping the plugin's code."""
    return CNIError(e.code, f"{context}: {e.msg}", e.details)
