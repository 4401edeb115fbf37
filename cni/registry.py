"""Which plugins pycni serves: the name a runtime execs each under, and what implements it.

One registry for every reader: skel dispatches by it, the daemon pre-imports it, install links
each name to the multi-call executable, bench measures each. Three sources, in this order:

- PLUGINS, the ones pycni ships (also declared as entry points in pyproject.toml: a test keeps
  the two equal), known without any metadata read;
- INSTALLED, the table `pycni install` bakes into the executables it writes (entry-point plugins
  found at install: name -> (target, first version)), filled by the executable before the shim
  runs: the shim answers VERSION and skel finds the module without reading package metadata;
- the `pycni.plugins` entry points of the distributions in the venv's own site dirs
  (site_dirs(); docs/PLUGINS.md): read by discover() at daemon start, install and doctor (tens
  of ms: importlib.metadata walks every dist-info), and on the in-process path only for a name
  neither table knows; never by the daemon after its start (fix()). Each is checked (its files
  root's alone) and its import tried in a child with a deadline before it is imported here:
  cni.plugload.

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
    entry points only for a name neither PLUGINS nor INSTALLED knows, never in the daemon (its
    table is fixed at start: fix())."""
    if plugin in PLUGINS:
        return PLUGINS[plugin]
    if plugin in INSTALLED:
        return INSTALLED[plugin][0]
    if FIXED:
        return None if plugin in REFUSED else (_found or {}).get(plugin)
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


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def valid_name(name: object) -> bool:
    """A plugin name becomes a file in the bin dir and reaches the daemon in requests: letters,
    digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters (the
    reference's names and any package's fit it; nothing hidden, no path, no blank)."""
    return (isinstance(name, str) and 0 < len(name) <= 64 and name[0].isascii()
            and name[0].isalnum() and NAME_CHARS.issuperset(name))


# The dirs entry points are read from and their modules imported from: the venv's own site
# dirs (install: of the interpreter the executables run; else of this one), never sys.path's
# '', cwd, PYTHONPATH or user site. Tests set SITES.
SITES: list[str] | None = None
FIXED = False  # the daemon's table is fixed at its start (fix()): nothing is read later
DISTS: dict[str, object] = {}  # name -> the importlib.metadata Distribution declaring it


def site_dirs() -> list[str]:
    """This interpreter's purelib and platlib (or SITES), each once."""
    if SITES is not None:
        return list(SITES)
    import os
    import sys
    import sysconfig

    scheme, where = None, None
    if sys.prefix == sys.base_prefix and sys.flags.no_site:  # -S: site.venv() did not run;
        here = os.path.dirname(sys.executable)  # find the venv as it would (the executables)
        for d in (here, os.path.dirname(here)):
            if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
                scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
                where = {"base": d, "platbase": d}
                break
    out: list[str] = []
    for key in ("purelib", "platlib"):
        d = sysconfig.get_path(key, scheme, where) if scheme else sysconfig.get_path(key)
        if d not in out:
            out.append(d)
    return out


def fix() -> None:
    """The daemon's table is what it found and imported at start: target() never reads package
    metadata again, a name it does not serve is refused (a package installed since: restart)."""
    global FIXED
    FIXED = True


def serves(plugin: str) -> bool:
    """Whether this process serves `plugin` without reading anything (the daemon's table)."""
    return plugin in PLUGINS or (plugin in (_found or {}) and plugin not in REFUSED)


def refusal(plugin: str) -> tuple[int, str] | None:
    """(CNI error code, message) when this process's fixed table (the daemon's) does not serve
    `plugin`: told before the daemon's child becomes the caller; None when it does."""
    if serves(plugin):
        return None
    if not valid_name(plugin):
        return 7, f"invalid plugin name {plugin!r}"
    if plugin in REFUSED:
        return 50, f"plugin {plugin} is not served: {REFUSED[plugin]}"
    return 999, (f'unknown plugin "{plugin}" (this pycni daemon serves the plugins found at its '
                 f"start: restart it to serve a package installed since)")


def discover(refresh: bool = False, sites: list[str] | None = None) -> dict[str, str]:
    """The entry-point plugins (GROUP) of the distributions in `sites` (site_dirs()): name ->
    target, the built-ins' own declarations left out. Refused, with why in REFUSED: a name that
    is no plain file name, one declaring a built-in's name for other code, one two
    distributions declare (even alike: which package's files are imported is not knowable)."""
    global _found
    if _found is not None and (not refresh or FIXED):
        return _found
    from importlib.metadata import distributions

    found: dict[str, str] = {}
    by: dict[str, str] = {}
    seen: set[str] = set()
    REFUSED.clear()
    DISTS.clear()
    for dist in distributions(path=site_dirs() if sites is None else sites):
        dname = dist.metadata["Name"] or "?"
        key = dname.lower().replace("-", "_").replace(".", "_")
        if key in seen:
            continue  # the first on the path shadows the rest, as import would
        seen.add(key)
        for ep in dist.entry_points.select(group=GROUP):
            name, value = ep.name, ep.value.replace(" ", "")
            if name in PLUGINS:
                if value != PLUGINS[name]:
                    REFUSED[name] = (f"{dname} declares {value} for the built-in {name} "
                                     f"({PLUGINS[name]}): the built-in is kept")
                continue
            if not valid_name(name):
                REFUSED[name] = (f"{dname} declares a name that is not a plain file name "
                                 f"(letters, digits, '.', '_', '-'; at most 64)")
                continue
            if name in by:
                REFUSED[name] = f"declared by both {by[name]} ({found[name]}) and {dname} ({value})"
                continue
            found[name], by[name], DISTS[name] = value, dname, dist
    for name in REFUSED:
        found.pop(name, None)
        DISTS.pop(name, None)
    _found = found
    return found
