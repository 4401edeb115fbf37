"""The plugins pycni ships: the name a runtime execs each under, and the module implementing it.

One list for every reader: skel dispatches by it, the daemon pre-imports it, install links each
name to the multi-call executable, bench measures each. Each module defines `add`, `check`,
`delete` (and optionally `gc`, `status`) taking a `cni.skel.Request`. Imports nothing, so the
shim and skel can read it before VERSION is answered. A plugin speaks the versions of
cni.spec.version.SUPPORTED from its SUPPORTED_FROM entry on (the reference's
VersionsStartingFrom: bandwidth's results need interfaces, which 0.1.0/0.2.0 do not carry), or
all of them.
"""

PLUGINS: dict[str, str] = {
    "loopback": "cni.plugins.loopback",
    "bridge": "cni.plugins.bridge",
    "host-local": "cni.plugins.host_local",
    "portmap": "cni.plugins.portmap",
    "bandwidth": "cni.plugins.bandwidth",
    "firewall": "cni.plugins.firewall",
}
NAMES = tuple(PLUGINS)
SUPPORTED_FROM: dict[str, str] = {"bandwidth": "0.3.0", "firewall": "0.4.0"}


def supported(plugin: str, versions: tuple[str, ...]) -> tuple[str, ...]:
    """The versions of `versions` (ascending) that `plugin` speaks."""
    first = SUPPORTED_FROM.get(plugin)
    return versions if first is None else versions[versions.index(first):]
