"""What the daemon imports and warms once, so that its forked children start with it."""

from __future__ import annotations

import ctypes
import importlib
import logging

log = logging.getLogger("pycni.daemon")

HEAVY_MODULES = ("pyroute2", "pyroute2.iproute", "pydantic", "nftables", "cni.skel")
# Imported inside functions on the request path: imported here, or every child pays for it
# (bandwidth's tc/ifb/peer alone cost ~3 ms a request: module bodies, dataclass builds).
LAZY_MODULES = ("pyroute2.conntrack", "pyroute2.netlink.exceptions",
                "pyroute2.netlink.nfnetlink.nfctsocket", "pyroute2.netlink.rtnl.tcmsg",
                "traceback")
PACKAGES = ("cni.spec", "cni.host", "cni.ipam", "cni.plugins")  # every module in them, too


def preimport(extra: tuple[str, ...] = ()) -> list[str]:
    """Import what requests need, once; returns what is missing (a plugin not written yet)."""
    from cni.registry import PLUGINS

    missing = []
    for name in HEAVY_MODULES + tuple(PLUGINS.values()) + LAZY_MODULES + _modules_of(PACKAGES) \
            + extra:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(name)
            if e.name != name:
                log.warning("importing %s: %s", name, e)
        except Exception as e:  # a broken module must not stop the daemon: its requests fail
            missing.append(name)
            log.warning("importing %s failed: %s: %s", name, type(e).__name__, e)
    try:
        ctypes.CDLL("libnftables.so.1")  # dlopen once; each child makes its own context
    except OSError:
        pass
    from cni.host import nsfd

    nsfd.libc()  # loaded once, before the forks
    return missing


def _modules_of(packages: tuple[str, ...]) -> tuple[str, ...]:
    import pkgutil

    names = []
    for package in packages:
        module = importlib.import_module(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(module.__path__)]
    return tuple(names)


def warm_up() -> None:
    """Touch what every request touches: skel, and a netlink socket (read-only, own netns)."""
    from cni import skel
    from cni.host import netns
    from cni.registry import PLUGINS

    for plugin in PLUGINS:
        skel.run(plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    try:
        with netns.iproute() as ipr:
            index = ipr.link_lookup(ifname="lo")
            ipr.get_links(*index)
            list(ipr.get_addr(index=index[0]))
    except Exception as e:  # warming is an optimisation only
        log.debug("warm-up: %s", e)
