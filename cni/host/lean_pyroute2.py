"""pyroute2's submodules without its package __init__, which imports every pyroute2 API (NDB
and sqlite, IPDB, ethtool, wireguard, ...): ~100 ms of the ~110 ms a plugin exec without the
daemon spent importing pyroute2, and RSS the daemon's every fork copies the page tables of.
We use IPRoute's request layer, the message classes, conntrack and NetlinkError only.

install() registers the package bare (its spec and __path__, its __init__ not run), so that
`import pyroute2.iproute.linux` loads that chain and nothing else. A name only the package's
__init__ defines (`from pyroute2 import NDB`) still works: the first such lookup runs the real
__init__ on the same module object. Import pyroute2 only from submodules (`pyroute2.netlink.
exceptions`, not `pyroute2`), and only in modules that call install() at import.
"""

import sys

PACKAGE = "pyroute2"


def install() -> None:
    """Idempotent; a no-op once pyroute2 is imported (fully or bare)."""
    if PACKAGE in sys.modules:
        return
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        return  # not installed: the import that follows fails as it would have
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(name: str) -> object:  # noqa: N807 - a module's attribute hook (PEP 562)
        if name.startswith("__") and name not in ("__version__", "__all__"):
            raise AttributeError(name)
        if not name.startswith("__"):
            try:  # `from pyroute2 import config` asks for a submodule
                return importlib.import_module(f"{PACKAGE}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{PACKAGE}.{name}":
                    raise
        del package.__getattr__  # the real __init__ defines the rest, once
        loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[PACKAGE] = package
