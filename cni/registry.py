"""The plugins pycni ships: the name a runtime execs each under, and the module implementing it.

One list for every reader: skel dispatches by it, the daemon pre-imports it, install links each
name to the multi-call executable, bench measures each. Each module defines `add`, `check`,
`delete` (and optionally `gc`, `status`) taking a `cni.skel.Request`. Imports nothing, so the
shim and skel can read it before VERSION is answered; every plugin speaks every version in
cni.spec.version.SUPPORTED.
"""

PLUGINS: dict[str, str] = {
    "loopback": "cni.plugins.loopback",
    "bridge": "cni.plugins.bridge",
    "host-local": "cni.plugins.host_local",
    "portmap": "cni.plugins.portmap",
    "bandwidth": "cni.plugins.bandwidth",
}
NAMES = tuple(PLUGINS)
