"""pycni's public plugin interface: everything a plugin of one's own may use, under one name.

A third-party package declares its plugin as an entry point (group `pycni.plugins`, name = the
executable's name, value = module or module:object); `pycni install` links it, the daemon serves
it. docs/PLUGINS.md is the guide; this module is the contract: the names in __all__ are public,
kept across minor versions of API_VERSION (a name goes away, or changes meaning, only with a new
major), and tests/test_public_api.py fails when one disappears or its signature, fields or
value differ from what its API_VERSION recorded (tests/data/public_api.json). Everything else
in `cni` is internal and may change in any release.

Cheap to import: the contract (request, errors, results, versions, keys) comes at once; the
config models (pydantic), IPAM delegation and the kernel helpers (pyroute2, libnftables) load on
first use of one of their names, so a plugin that needs none of them does not pay for them on
the in-process path.
"""

from __future__ import annotations

import importlib
from typing import Any

from cni.host.errors import HostError, NamespaceError
from cni.registry import GROUP as ENTRY_POINT_GROUP
from cni.skel import Request, require_printable, valid_attachments
from cni.spec.errors import CNIError, Code, invalid_config, unsupported
from cni.spec.keys import CAPABILITIES
from cni.spec.keys import get as get_key
from cni.spec.keys import match as match_keys
from cni.spec.names import known_args
from cni.spec.result import Result, convert, from_current, to_current
from cni.spec.version import CURRENT as CURRENT_VERSION
from cni.spec.version import SUPPORTED as SUPPORTED_VERSIONS
from cni.spec.version import at_least

API_VERSION = "1.1"  # major.minor: a minor adds names, a major may remove or change one

# Loaded on first use: public name -> (module, attribute).
_LAZY: dict[str, tuple[str, str]] = {
    # config models: subclass ConfigModel (keys matched however cased, as Go does; errors 7
    # naming key and value), validate with parse_config / parse_config_lenient (DEL)
    "ConfigModel": ("cni.spec.config", "Model"),
    "PluginConf": ("cni.spec.config", "PluginConf"),
    "DNS": ("cni.spec.config", "DNS"),
    "Field": ("cni.spec.config", "Field"),
    "StrictStr": ("cni.spec.config", "StrictStr"),
    "StrictInt": ("cni.spec.config", "StrictInt"),
    "StrictBool": ("cni.spec.config", "StrictBool"),
    "parse_config": ("cni.spec.config", "parse"),
    "parse_config_lenient": ("cni.spec.config", "parse_lenient"),
    # IPAM delegation, as a main plugin does it: (req, ipam_type)
    "ipam_add": ("cni.ipam.delegate", "add"),
    "ipam_check": ("cni.ipam.delegate", "check"),
    "ipam_delete": ("cni.ipam.delegate", "delete"),
    "ipam_delete_lenient": ("cni.ipam.delegate", "delete_lenient"),
    "ipam_gc": ("cni.ipam.delegate", "gc"),
    "ipam_status": ("cni.ipam.delegate", "status"),
    # network namespaces and netlink
    "netns_entered": ("cni.host.netns", "entered"),
    "iproute": ("cni.host.netns", "iproute"),
    "Link": ("cni.host.links", "Link"),
    "get_link": ("cni.host.links", "get"),
    "set_link_up": ("cni.host.links", "set_up"),
    "delete_link": ("cni.host.links", "delete"),
    "add_address": ("cni.host.addrs", "add"),
    "has_address": ("cni.host.addrs", "has"),
    "configure_iface": ("cni.host.addrs", "configure_iface"),
    "add_route": ("cni.host.routes", "add"),
    "find_routes": ("cni.host.routes", "find"),
    # nftables (libnftables in-process)
    "NftError": ("cni.host.nft", "NftError"),
    "nft_run": ("cni.host.nft", "run"),
    "nft_check": ("cni.host.nft", "check"),
    "nft_list": ("cni.host.nft", "list_json"),
    "nft_quote": ("cni.host.nft", "quote"),
    "nft_comment": ("cni.host.nft", "comment"),
}

__all__ = [
    "API_VERSION", "ENTRY_POINT_GROUP",
    # the request a verb receives, and GC's list of attachments still valid
    "Request", "valid_attachments",
    # errors: raise CNIError(Code.X, msg, details); skel prints it as the spec's error JSON
    "CNIError", "Code", "invalid_config", "unsupported", "HostError", "NamespaceError",
    # results (the current version's shape), their conversion between versions, and the
    # check that one prints in the config's version (before changing anything; since 1.1)
    "Result", "to_current", "from_current", "convert", "require_printable",
    "SUPPORTED_VERSIONS", "CURRENT_VERSION", "at_least",
    # keys matched as Go's decoder matches them; CNI_ARGS pairs a plugin knows
    "match_keys", "get_key", "CAPABILITIES", "known_args",
    # sysctls in the current network namespace (kernel helpers, below)
    "sysctl_read", "sysctl_write",
    *_LAZY,
]


class _NoSysctl(CNIError, FileNotFoundError):
    """A key the namespace does not have: error 7 naming it, still a FileNotFoundError for a
    plugin that catches that (as in API 1.0)."""


def _no_sysctl(key: str, e: FileNotFoundError) -> _NoSysctl:
    return _NoSysctl(Code.INVALID_CONFIG, f"sysctl {key!r}: no such key in this network "
                     f"namespace ({e.filename}): a per-interface key names an interface that is "
                     "not here, or the kernel has no such setting")


def sysctl_read(key: str) -> str:
    """The value, stripped (a multi-word one as the kernel prints it: tab-separated)."""
    from cni.host import sysctl

    try:
        return sysctl.read(key)
    except FileNotFoundError as e:
        raise _no_sysctl(key, e) from None


def sysctl_write(key: str, value: str | int) -> None:
    """Write str(value); the kernel's refusal of the value is an OSError (EINVAL)."""
    from cni.host import sysctl

    try:
        sysctl.write(key, value)
    except FileNotFoundError as e:
        raise _no_sysctl(key, e) from None


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
