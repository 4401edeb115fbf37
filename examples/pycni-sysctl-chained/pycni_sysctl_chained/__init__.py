"""sysctl-chained: a chained plugin setting one sysctl in the pod's network namespace.

    {"type": "sysctl-chained", "key": "net.ipv4.conf.IFNAME.arp_notify", "value": "1"}

ADD writes it and passes the previous plugin's result on unchanged; CHECK reads it back and
fails if it differs; DEL does nothing (the pod's namespace, and its sysctls, go with the pod).
`IFNAME` in the key becomes CNI_IFNAME. Written against pycni's public interface (cni.api) only.
"""

from __future__ import annotations

from cni.api import (
    CNIError,
    Code,
    ConfigModel,
    Request,
    Result,
    StrictStr,
    invalid_config,
    netns_entered,
    parse_config,
    sysctl_read,
    sysctl_write,
)

SUPPORTED_FROM = "0.4.0"  # CHECK exists from 0.4.0; results are passed on, not built


class NetConf(ConfigModel):
    key: StrictStr  # the attribute is the JSON key, found however cased ("Key" too)
    value: StrictStr


def _conf(req: Request) -> tuple[str, str]:
    """The key as a slash path (so an ifname with a dot, eth0.100, stays one component) and the
    value. Only net.* keys: those are the pod namespace's own."""
    conf = parse_config(NetConf, req.config)
    parts = conf.key.split(".")
    if parts[0] != "net" or len(parts) < 2 or "" in parts or ".." in parts:
        raise invalid_config("key", conf.key, "a dotted net.* sysctl key")
    path = "/".join(req.ifname if p == "IFNAME" else p for p in parts)
    return path, conf.value


def _prev(req: Request) -> Result:
    """A chained plugin follows one that made the interface: no prevResult is a config error."""
    if req.prev_result is None:
        raise invalid_config("prevResult", None, "sysctl-chained must follow a plugin in a "
                             "conflist (it passes the previous result on)")
    return req.prev_result


def add(req: Request) -> Result:
    key, value = _conf(req)
    prev = _prev(req)
    with netns_entered(req.netns_target):
        sysctl_write(key, value)
    return prev  # already in the current version; skel prints it in the config's


def check(req: Request) -> None:
    key, value = _conf(req)
    _prev(req)
    with netns_entered(req.netns_target):
        now = sysctl_read(key)
    if now.split() != value.split():  # the kernel prints "a b" back as "a\tb"
        raise CNIError(Code.INTERNAL, f"sysctl-chained: {key} is {now!r}, configured {value!r}")


def delete(req: Request) -> None:
    return None
