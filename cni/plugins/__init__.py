"""The plugins, by the name a runtime execs them under.

Each plugin module defines `add`, `check`, `delete` (and optionally `gc`, `status`), each taking
a `cni.skel.Request`; `add` returns a canonical result (cni.spec.result). Modules are imported only
when a verb needs them, so VERSION never pays for their imports.
"""

MODULES: dict[str, str] = {
    "loopback": "cni.plugins.loopback",
    "host-local": "cni.plugins.host_local",
    "bridge": "cni.plugins.bridge",
    "portmap": "cni.plugins.portmap",
    "bandwidth": "cni.plugins.bandwidth",
}

# What each plugin supports: all spec versions (VERSION answers from this without imports).
SUPPORTED_VERSIONS: dict[str, tuple[str, ...]] = {}
