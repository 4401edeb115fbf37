"""pyroute2's submodules without its package __init__, which imports every pyroute2 API (NDB
and sqlite, IPDB, ethtool, wireguard, ...): ~100 ms of the ~110 ms a plugin exec without the
daemon spent importing pyroute2, and RSS the daemon's every fork copies the page tables of.
We use IPRoute's request layer, the message classes, conntrack and NetlinkError only.

install() registers the package bare (its spec and __path__, its __init__ not run), so that
`import pyroute2.iproute.linux` loads that chain and nothing else. A name only the package's
__init__ defines (`from pyroute2 import NDB`) still works: the first such lookup runs the real
__init__ on the same module object. Import pyroute2 only from submodules (`pyroute2.netlink.
exceptions`, not `pyroute2`), and only in modules that call install() at import.

`pyroute2.netlink` is registered bare the same way: its __init__ (the message base classes,
~4 ms with the logging it imports) is not needed for NetlinkError alone, which the plugins'
common verbs catch while they send their requests with rtnl.py.
"""

import sys

PACKAGES = ("pyroute2", "pyroute2.netlink")  # parent first: the child is found on its __path__


def install() -> None:
    """Idempotent; a no-op for a package already imported (fully or bare)."""
    for name in PACKAGES:
        if name in sys.modules:
            continue
        if not _register_bare(name):
            return  # not installed: the import that follows fails as it would have


def _register_bare(name: str) -> bool:
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return False
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(attr: str) -> object:  # noqa: N807 - a module's attribute hook (PEP 562)
        if attr.startswith("__") and attr not in ("__version__", "__all__"):
            raise AttributeError(attr)
        if not attr.startswith("__"):
            try:  # `from pyroute2 import config` asks for a submodule
                return importlib.import_module(f"{name}.{attr}")
            except ModuleNotFoundError as e:
                if e.name != f"{name}.{attr}":
                    raise
        del package.__getattr__  # the real __init__ defines the rest, once
        loader.exec_module(package)
        try:
            return package.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)  # what the import system would have set
    return True
