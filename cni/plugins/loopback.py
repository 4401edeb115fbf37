"""loopback: bring `lo` up in the container, as the reference plugin does."""

from __future__ import annotations

from cni.host import links
from cni.host.errors import NamespaceMissing
from cni.skel import Request, require_printable
from cni.spec.errors import CNIError, Code
from cni.spec.result import Result


def add(req: Request) -> Result:
    require_printable(req.prev_result, req.version, passthrough=req.prev_native)
    addresses = links.set_loopback(req.netns_target, up=True)
    if req.prev_result is not None:
        return req.prev_result  # chained: pass the previous result through untouched
    return {
        "cniVersion": req.version,
        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": req.netns}],
        "ips": [{"interface": 0, "address": a} for a in addresses],
        "routes": [],
        "dns": {},
    }


def delete(req: Request) -> None:
    if not req.netns and req.netns_fd is None:
        return
    try:
        links.set_loopback(req.netns_target, up=False)
    except NamespaceMissing:
        pass  # the namespace is gone, and so is its lo


def check(req: Request) -> None:
    if not links.loopback_is_up(req.netns_target):
        raise CNIError(Code.INTERNAL, "loopback interface is down")


def gc(req: Request) -> None:
    """loopback keeps no state outside the pod: nothing to collect, with or without a list."""
    from cni.skel import valid_attachments

    if valid_attachments(req.config) is None:
        req.log("GC without cni.dev/valid-attachments: nothing removed (loopback keeps no state)")
