"""Plugin dispatch: (plugin, env, stdin, netns) -> Reply.

`run` is pure: it reads no os.environ, prints nothing, never exits. The exec'd binary and the
daemon's forked child both call it, so both paths answer byte for byte the same. Only the stdlib
is imported here; a plugin's own (heavy) module is imported after VERSION has been answered.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from cni import __version__, deleted, registry
from cni.host.errors import Busy, HostError, NamespaceError
from cni.spec import keys, names
from cni.spec import version as versions
from cni.spec.errors import CNIError, Code, invalid_config

COMMANDS = ("ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION")
# Which CNI_* variables each command requires (the reference skel's table).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "CNI_CONTAINERID": ("ADD", "CHECK", "DEL"),
    "CNI_NETNS": ("ADD", "CHECK"),
    "CNI_IFNAME": ("ADD", "CHECK", "DEL"),
    "CNI_PATH": ("ADD", "CHECK", "DEL", "GC", "STATUS"),
}
MAX_STDIN = 16 * 1024 * 1024
# GC's list of still-valid attachments: the spec's key, and the one libcni also sends (#1101).
VALID_ATTACHMENT_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")
# The keys every plugin config may carry (the reference's types.NetConf), found however cased.
COMMON_KEYS = ("cniVersion", "name", "type", "capabilities", "ipam", "dns", "args",
               "runtimeConfig", "prevResult", *VALID_ATTACHMENT_KEYS)


def _no_log(msg: str) -> None:
    pass


class Reply(NamedTuple):
    stdout: bytes
    stderr: bytes
    code: int
    removed: int = 0  # objects a GC removed (the daemon's metrics count them; never printed)

    def to_dict(self) -> dict:
        return {"stdout": self.stdout.decode("utf-8", "replace"),
                "stderr": self.stderr.decode("utf-8", "replace"), "code": self.code}


class Request(NamedTuple):
    """One plugin invocation, validated: what a plugin's verb functions receive."""

    plugin: str
    command: str
    container_id: str
    netns: str
    ifname: str
    args: list[tuple[str, str]]
    path: list[str]
    config: dict[str, Any]
    version: str
    stdin: bytes
    env: Mapping[str, str]
    netns_fd: int | None = None
    prev_result: dict | None = None
    # prevResult declared a version of the config's shape (or none): handed on unchanged, it
    # prints as it came (a 0.1.0/0.2.0 one without IP addresses too)
    prev_native: bool = False
    log: Callable[[str], None] = _no_log

    @property
    def network(self) -> str:
        return self.config.get("name", "")  # run() refused a name that is not a string

    @property
    def runtime_config(self) -> keys.Keys:
        """The capability args, their names found however cased (containerd's CRI capitalises
        the keys inside them; each plugin matches those with cni.spec.keys too)."""
        value = self.config.get("runtimeConfig")
        return keys.match(value if isinstance(value, dict) else {}, keys.CAPABILITIES)

    @property
    def netns_target(self) -> int | str:
        """What to open for the container's namespace: the fd handed over, else the path."""
        return self.netns_fd if self.netns_fd is not None else self.netns

    def arg(self, key: str) -> str | None:
        return next((v for k, v in self.args if k == key), None)


def run(plugin: str, env: Mapping[str, str], stdin: bytes, netns: int | None = None) -> Reply:
    """Run one CNI command of `plugin` and return what the executable prints and its exit code."""
    err = io.StringIO()
    version = versions.CURRENT
    try:
        command = env.get("CNI_COMMAND", "")
        if command == "":
            err.write(about(plugin))
            return Reply(b"", err.getvalue().encode(), 0)
        if command not in COMMANDS:
            raise CNIError(Code.INVALID_ENV, f"unknown CNI_COMMAND: {command}")
        if command == "VERSION":
            return Reply(version_info(plugin, stdin).encode(), b"", 0)
        if deleted.already_clean(plugin, env, time.time()):  # containerd's second DEL
            return Reply(b"", b"", 0)
        _check_env(command, env)
        config = keys.match(decode_config(stdin), COMMON_KEYS)
        version = config.get("cniVersion")
        if version is None or version == "":  # as the reference's decoder: absent means 0.1.0
            version = versions.DEFAULT_IF_MISSING
        elif not isinstance(version, str):
            version = versions.CURRENT
            raise CNIError(Code.DECODING_FAILURE, "cniVersion must be a string")
        versions.require_supported(version, versions.SUPPORTED)
        if command != "DEL":  # DEL at any version we know: a chain's DEL must not stop here
            versions.require_supported(version, speaks(plugin))
        _gate(command, version)
        _check_name(config)
        prev, prev_native = config.get("prevResult"), False
        if prev is not None:
            from cni.spec.result import declared_in_era, to_current
            prev_native = declared_in_era(prev, version)
            prev = to_current(prev, version)
        req = Request(
            plugin=plugin, command=command, container_id=env.get("CNI_CONTAINERID", ""),
            netns=env.get("CNI_NETNS", ""), ifname=env.get("CNI_IFNAME", ""),
            args=names.parse_args(env.get("CNI_ARGS", "")),
            path=[p for p in env.get("CNI_PATH", "").split(":") if p], config=config,
            version=version, stdin=stdin, env=env, netns_fd=netns, prev_result=prev,
            prev_native=prev_native,
            log=lambda msg: err.write(f"{plugin}: {msg}\n"),
        )
        _check_not_own_netns(req)
        out, removed = dispatch(req)
        return Reply(out.encode(), err.getvalue().encode(), 0, removed)
    except Exception as e:
        return _failed(e, plugin, version, err)


def _failed(e: Exception, plugin: str, version: str, err: io.StringIO) -> Reply:
    """The Reply of a request that raised `e` (run's and run_nested's)."""
    if isinstance(e, CNIError):
        return Reply(e.to_json(version).encode(), err.getvalue().encode(), 1)
    if isinstance(e, HostError):  # the kernel layer's own: its message as it is
        code = (Code.INVALID_ENV if isinstance(e, NamespaceError) else
                Code.TRY_AGAIN_LATER if isinstance(e, Busy) else Code.INTERNAL)
        return Reply(CNIError(code, str(e)).to_json(version).encode(),
                     err.getvalue().encode(), 1)
    # never a traceback on stdout: code 999 with what went wrong
    import traceback
    err.write(traceback.format_exc())
    msg = f"{plugin}: {type(e).__name__}: {e}"
    return Reply(CNIError(Code.INTERNAL, msg).to_json(version).encode(),
                 err.getvalue().encode(), 1)


def run_nested(parent: Request, plugin: str) -> Reply:
    """run(plugin, parent.env, parent.stdin, parent.netns_fd) for a plugin that `parent`'s
    plugin runs in-process with its own environment, stdin and namespace, for its own verb
    (its IPAM, cni.ipam.delegate): the same Reply, without reading the same input again. run
    has already checked, for the parent, all it checks of that input (the environment, the
    config and its version, the name, the namespace) and found it good; what depends on the
    plugin is checked here as run checks it: a DEL its marker answers (cni.deleted), the
    versions the plugin speaks. The config and prevResult are the parent's, read-only."""
    err = io.StringIO()
    version = parent.version
    try:
        if deleted.already_clean(plugin, parent.env, time.time()):
            return Reply(b"", b"", 0)
        if parent.command != "DEL":
            versions.require_supported(version, speaks(plugin))
        req = parent._replace(plugin=plugin,
                              log=lambda msg: err.write(f"{plugin}: {msg}\n"))
        out, removed = dispatch(req)
        return Reply(out.encode(), err.getvalue().encode(), 0, removed)
    except Exception as e:
        return _failed(e, plugin, version, err)


def dispatch(req: Request) -> tuple[str, int]:
    """Call the plugin's verb; ADD's result is printed in the config's version. -> (stdout,
    how many objects a GC removed: its gc's return value)."""
    module = load(req.plugin)
    verb = {"ADD": "add", "CHECK": "check", "DEL": "delete", "GC": "gc",
            "STATUS": "status"}[req.command]
    fn = getattr(module, verb, None)
    if fn is None:
        if req.command in ("GC", "STATUS"):
            return "", 0  # nothing to collect, always available
        raise CNIError(Code.INTERNAL, f"{req.plugin} has no {req.command}")
    if req.command == "ADD":
        deleted.forget(req.plugin, req.container_id, req.ifname)
    result = fn(req)
    if req.command == "DEL":
        deleted.mark(req.plugin, req.container_id, req.ifname, time.time())
    if req.command != "ADD":
        return "", result if req.command == "GC" and isinstance(result, int) else 0
    from cni.spec.result import from_current
    try:
        printed = from_current(result, req.version, passes_through(req, result))
    except Exception:
        _undo_add(module, req)  # a plugin that did not call require_printable before it acted
        raise
    return json.dumps(printed, indent=4), 0


def passes_through(req: Request, result: Any) -> bool:
    """Whether an ADD's result is the prevResult handed on unchanged (by value: an equal copy
    too), which prints as it came."""
    return req.prev_native and req.prev_result is not None and result == req.prev_result


def require_printable(result: dict | None, version: str, passthrough: bool = False) -> None:
    """Refuse, before changing anything, a result that cannot be printed in the config's version
    (one a plugin built needs an IP address at 0.1.0/0.2.0; a prevResult handed on unchanged,
    `passthrough`, prints as it came). Public (cni.api): a plugin calls it with the result it
    will return before it changes anything, as the built-ins do."""
    if result is not None:
        from cni.spec.result import from_current
        from_current(result, version, passthrough)


def _undo_add(module: Any, req: Request) -> None:
    """An ADD whose result cannot be printed in the config's version has run: skel could not
    know its result before, so the plugin's own DEL undoes it before the error is answered
    (the runtime gets the error and nothing stays made). Its failure is logged, not raised."""
    delete = getattr(module, "delete", None)
    if delete is None:
        return
    try:
        delete(req._replace(command="DEL"))
    except Exception as e:
        req.log(f"undoing the ADD (its result cannot be printed) failed: {e}")


_loaded: dict[str, Any] = {}  # plugin -> its module or object, once imported


def load(plugin: str, vetted: bool = False) -> Any:
    """The module or object implementing `plugin` (cni.registry: built-in, installed or entry
    point); a class is instantiated once. CNI error 999 if nothing does, 50 if its module is
    not there or it was refused (cni.registry.REFUSED: the daemon's finding at start, or
    cni.plugload's check before an entry-point plugin is imported here, unless `vetted`)."""
    if plugin in _loaded:
        return _loaded[plugin]
    if plugin not in registry.PLUGINS and plugin in registry.REFUSED:  # the daemon's finding
        raise CNIError(Code.NOT_AVAILABLE,
                       f"plugin {plugin} is not served: {registry.REFUSED[plugin]}")
    target = registry.target(plugin)
    if target is None:
        refused = registry.refusal(plugin)
        raise CNIError(Code.INTERNAL, refused[1] if refused and registry.FIXED
                       else f'unknown plugin "{plugin}"')
    if plugin not in registry.PLUGINS and not vetted:
        from cni import plugload
        try:
            plugload.vet_one(plugin, target)
        except plugload.Refused as e:
            raise CNIError(Code.NOT_AVAILABLE, f"plugin {plugin} is not served: {e}") from None
    import importlib
    name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            raise CNIError(Code.NOT_AVAILABLE, f"plugin {plugin} is not implemented yet") from None
        raise
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()
    registry.note_supported_from(plugin, getattr(obj, "SUPPORTED_FROM", None))
    _loaded[plugin] = obj
    return obj


def speaks(plugin: str) -> tuple[str, ...]:
    """The versions `plugin` speaks. A third-party plugin no installed table describes is
    imported first, to read its SUPPORTED_FROM (the in-process path of an uninstalled copy)."""
    if not (plugin in registry.PLUGINS or plugin in registry.INSTALLED or plugin in _loaded):
        try:
            load(plugin)
        except Exception:
            pass  # an unknown or broken plugin: its verbs report it
    return registry.supported(plugin, versions.SUPPORTED)


def about(plugin: str) -> str:
    return (f"CNI {plugin} plugin pycni {__version__}\n"
            f"CNI protocol versions supported: "
            f"{', '.join(speaks(plugin))}\n")


def version_info(plugin: str, stdin: bytes) -> str:
    """VERSION: the spec echoes the requested cniVersion; the reference answers its own."""
    asked = versions.CURRENT
    speaking = speaks(plugin)
    try:
        value = json.loads(stdin or b"{}").get("cniVersion")
        if isinstance(value, str) and value in speaking:
            asked = value
    except (ValueError, AttributeError):
        pass
    return json.dumps({"cniVersion": asked, "supportedVersions": list(speaking)})


def decode_config(stdin: bytes) -> dict[str, Any]:
    if len(stdin) > MAX_STDIN:
        raise CNIError(Code.IO_FAILURE, f"network config larger than {MAX_STDIN} bytes")
    try:
        config = json.loads(stdin)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(Code.DECODING_FAILURE, f"error parsing network config: {e}") from None
    if not isinstance(config, dict):
        raise CNIError(Code.DECODING_FAILURE, "network config must be a JSON object")
    return config


def _check_env(command: str, env: Mapping[str, str]) -> None:
    missing = [var for var, cmds in _REQUIRED.items() if command in cmds and not env.get(var)]
    if missing:
        raise CNIError(Code.INVALID_ENV, f"required env variables [{','.join(missing)}] missing")
    if command in ("ADD", "CHECK", "DEL"):
        names.check_container_id(env["CNI_CONTAINERID"])
        names.check_ifname(env["CNI_IFNAME"])


def _check_not_own_netns(req: Request) -> None:
    """ADD and DEL refuse (8) a CNI_NETNS that is the plugin's own network namespace (the
    caller's, which the daemon's child has entered), unless CNI_NETNS_OVERRIDE is 1 or true: the
    reference's skel rule. It checks after its cmdAdd/cmdDel ran; this checks before, so the
    refused request changes nothing. A netns that cannot be stat'd is the plugin's to report."""
    if req.command not in ("ADD", "DEL") or not req.netns:
        return
    if req.env.get("CNI_NETNS_OVERRIDE", "").upper() in ("1", "TRUE"):
        return
    try:
        target = os.fstat(req.netns_fd) if req.netns_fd is not None else os.stat(req.netns)
        own = os.stat("/proc/thread-self/ns/net")
    except OSError:
        return
    if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
        raise CNIError(Code.INVALID_NETNS,
                       "plugin's netns and netns from CNI_NETNS should not be the same",
                       f"CNI_NETNS={req.netns} is the plugin's own network namespace; "
                       "set CNI_NETNS_OVERRIDE=1 to allow it")


def _gate(command: str, version: str) -> None:
    if command == "CHECK" and not versions.at_least(version, "0.4.0"):
        raise CNIError(Code.INCOMPATIBLE_VERSION, "config version does not allow CHECK")
    if command in ("GC", "STATUS") and not versions.at_least(version, "1.1.0"):
        raise CNIError(Code.INCOMPATIBLE_VERSION, f"config version does not allow {command}")


def _check_name(config: dict) -> None:
    """The network name becomes a path (host-local store, cache): same rule as container IDs."""
    if "name" not in config:
        return
    name = config["name"]
    if not isinstance(name, str):  # null too: the pydantic-checked plugins refuse it the same way
        raise invalid_config("name", name, "must be a string")
    if not names.valid_id(name):
        raise CNIError(Code.INVALID_CONFIG, "invalid characters found in network name",
                       str(name))


def valid_attachments(config: Mapping[str, Any]) -> set[tuple[str, str]] | None:
    """GC's (containerID, ifname) pairs; None when the runtime sent no list (libcni omits it for
    a GC without arguments), which each plugin answers by removing nothing or refusing. Checked
    whole before a plugin removes anything: a bad list is code 7 naming the entry."""
    key = next((k for k in VALID_ATTACHMENT_KEYS if config.get(k) is not None), None)
    if key is None:
        return None
    items = config[key]
    if not isinstance(items, list):
        raise invalid_config(key, items, "must be a list of {containerID, ifname}")
    out = set()
    for i, item in enumerate(items):
        cid = keys.get(item, "containerID") if isinstance(item, dict) else None
        ifname = keys.get(item, "ifname") if isinstance(item, dict) else None
        if not isinstance(cid, str) or not isinstance(ifname, str):
            raise invalid_config(f"{key}[{i}]", item, "needs string containerID and ifname")
        out.add((cid, ifname))
    return out
