"""Which plugins pycni serves: the name a runtime execs each under, and what implements it.

One registry for every reader: skel dispatches by it, the daemon pre-imports it, install links
each name to the multi-call executable, bench measures each. Three sources, in this order:

- PLUGINS, the ones pycni ships (also declared as entry points in pyproject.toml: a test keeps
  the two equal), known without any metadata read;
- INSTALLED, the table `pycni install` bakes into the executables it writes (entry-point plugins
  found at install: name -> (target, first version)), filled by the executable before the shim
  runs: the shim answers VERSION and skel finds the module without reading package metadata;
- the `pycni.plugins` entry points of the installed distributions (docs/PLUGINS.md): read by
  discover() at daemon start, install and doctor (tens of ms: importlib.metadata walks every
  dist-info), and on the in-process path only for a name neither table knows.

A target is "module" or "module:object" (an object in the module: a class, instantiated once,
or any object with the verbs). A plugin defines `add`, `check`, `delete` (optionally `gc`,
`status`) taking a cni.skel.Request. It speaks the versions of cni.spec.version.SUPPORTED from
its SUPPORTED_FROM entry on (the reference's VersionsStartingFrom: bandwidth's results need
interfaces, which 0.1.0/0.2.0 do not carry), or all of them; a third-party plugin says so with a
module- or object-level SUPPORTED_FROM.

Imports nothing at module level, so the shim and skel read it before VERSION is answered.
"""

GROUP = "pycni.plugins"  # the entry-point group third-party packages declare plugins in

PLUGINS: dict[str, str] = {
    "loopback": "cni.plugins.loopback",
    "bridge": "cni.plugins.bridge",
    "host-local": "cni.plugins.host_local",
    "portmap": "cni.plugins.portmap",
    "bandwidth": "cni.plugins.bandwidth",
    "tuning": "cni.plugins.tuning",
    "firewall": "cni.plugins.firewall",
}
NAMES = tuple(PLUGINS)  # the built-in names
SUPPORTED_FROM: dict[str, str] = {"bandwidth": "0.3.0", "firewall": "0.4.0"}

# Filled by the installed executable (install.render_multicall): name -> (target, first version
# it speaks, "" for all). Never read from disk here: the executable carries it.
INSTALLED: dict[str, tuple[str, str]] = {}

# discover()'s findings, kept for the process (the daemon's children inherit them).
_found: dict[str, str] | None = None
REFUSED: dict[str, str] = {}  # entry points not served: name -> why (doctor, daemon status)


def supported(plugin: str, versions: tuple[str, ...]) -> tuple[str, ...]:
    """The versions of `versions` (ascending) that `plugin` speaks."""
    first = SUPPORTED_FROM.get(plugin)
    if first is None and plugin in INSTALLED:
        first = INSTALLED[plugin][1] or None
    return versions if first not in versions else versions[versions.index(first):]


def note_supported_from(plugin: str, first: object) -> None:
    """A third-party plugin's own SUPPORTED_FROM, recorded once it is imported (skel.load)."""
    if plugin not in PLUGINS and isinstance(first, str) and first:
        SUPPORTED_FROM.setdefault(plugin, first)


def target(plugin: str) -> str | None:
    """What implements `plugin` ("module" or "module:object"); None if nothing does. Reads the
    entry points only for a name neither PLUGINS nor INSTALLED knows; again if the findings are
    older than this call and lack it (a package installed since the daemon started: its child
    finds it, the next daemon start preloads it)."""
    if plugin in PLUGINS:
        return PLUGINS[plugin]
    if plugin in INSTALLED:
        return INSTALLED[plugin][0]
    fresh = _found is None
    found = discover()
    if plugin not in found and not fresh:
        found = discover(refresh=True)
    return found.get(plugin)


def plugins() -> dict[str, str]:
    """Every plugin served here: the built-ins, then the entry points found (discover())."""
    return {**PLUGINS, **discover()}


def names() -> tuple[str, ...]:
    """Every plugin name known without reading metadata anew (metrics' label set)."""
    return tuple(dict.fromkeys([*PLUGINS, *INSTALLED, *(_found or {})]))


def valid_name(name: str) -> bool:
    """A plugin name becomes a file in the bin dir: a plain file name, nothing hidden."""
    return (bool(name) and len(name) <= 255 and "/" not in name and "\0" not in name
            and not name.startswith(".") and name.isprintable() and " " not in name)


def discover(refresh: bool = False) -> dict[str, str]:
    """The entry-point plugins (GROUP) of the installed distributions: name -> target, the
    built-ins' own declarations left out. Refused, with why in REFUSED: a name that is no plain
    file name, one declaring a built-in's name for other code, one two distributions declare."""
    global _found
    if _found is not None and not refresh:
        return _found
    from importlib.metadata import entry_points

    found: dict[str, str] = {}
    by: dict[str, str] = {}
    REFUSED.clear()
    for ep in entry_points(group=GROUP):
        name, value = ep.name, ep.value.replace(" ", "")
        dist = getattr(ep.dist, "name", None) or "?"
        if name in PLUGINS:
            if value != PLUGINS[name]:
                REFUSED[name] = (f"{dist} declares {value} for the built-in {name} "
                                 f"({PLUGINS[name]}): the built-in is kept")
            continue
        if not valid_name(name):
            REFUSED[name] = f"{dist} declares a name that is not a plain file name"
            continue
        if name in found and found[name] != value:
            REFUSED[name] = f"declared by both {by[name]} ({found[name]}) and {dist} ({value})"
            continue
        if name not in REFUSED:
            found[name], by[name] = value, dist
    for name in REFUSED:
        found.pop(name, None)
    _found = found
    return found
