"""The invoking side of CNI (what libcni is in Go): conflists, plugin exec, chains, result cache.

It execs plugins (never imports cni.plugins) and imports nothing heavy: no pydantic, no pyroute2.
"""

from cni.runtime.cache import DEFAULT_CACHE_DIR, CachedAttachment, ResultCache
from cni.runtime.chain import AddResult, MultiError, Runtime, RuntimeConf, build_request
from cni.runtime.conflist import DEFAULT_NETCONFPATH, NetworkConfigList, load

__all__ = [
    "DEFAULT_CACHE_DIR", "DEFAULT_NETCONFPATH", "AddResult", "CachedAttachment", "MultiError",
    "NetworkConfigList", "ResultCache", "Runtime", "RuntimeConf", "build_request", "load",
]
