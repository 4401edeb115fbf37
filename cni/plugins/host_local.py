"""host-local: IP addresses from configured ranges, reserved in a store on the host's disk.

Reads like the reference's cmdAdd / cmdDel / cmdCheck, plus GC and STATUS (spec 1.1.0), which the
reference lacks. No verb touches a network namespace, so CNI_NETNS may be any value.
"""

from __future__ import annotations

import os

from cni.ipam import config as ipam_config
from cni.ipam.allocator import Address, Allocator, parse_ip
from cni.ipam.store import Store, StoreError, reservations
from cni.skel import Request, valid_attachments
from cni.spec import names
from cni.spec.errors import CNIError, Code
from cni.spec.result import Result


def _load(req: Request) -> ipam_config.IPAMConfig:
    return ipam_config.load(req.config, req.version, req.args)


def add(req: Request) -> Result:
    _validate(req)
    conf = _load(req)
    dns = ipam_config.parse_resolv_conf(conf.resolv_conf) if conf.resolv_conf else {}
    with Store(conf.data_dir, conf.name) as store:
        ips = _allocate(store, conf, req.container_id, req.ifname)
    return {"cniVersion": req.version, "interfaces": [], "ips": ips,
            "routes": conf.routes, "dns": dns}


def _allocate(store: Store, conf: ipam_config.IPAMConfig, cid: str,
              ifname: str) -> list[dict[str, str]]:
    """One IP per range set; on any failure release everything taken for (cid, ifname)."""
    remaining: list[Address] = list(conf.requested)
    owned = _owned(store, conf, cid, ifname)
    ips: list[dict[str, str]] = []
    try:
        for idx, ranges in enumerate(conf.ranges):
            requested = next((ip for ip in remaining if ranges.range_for(ip) is not None), None)
            if requested is not None:
                remaining.remove(requested)
            try:
                ips.append(Allocator(ranges, store, idx).get(cid, ifname, requested, owned))
            except CNIError as e:
                raise CNIError(e.code, f"failed to allocate for range {idx}: {e.msg}",
                               e.details) from None
        if remaining:
            raise CNIError(Code.INVALID_CONFIG, "failed to allocate all requested IPs: "
                           + " ".join(str(ip) for ip in remaining))
    except CNIError:
        if ips:
            store.release(cid, ifname)
        raise
    return ips


def _owned(store: Store, conf: ipam_config.IPAMConfig, cid: str, ifname: str) -> list[Address]:
    """What the attachment already holds, for the duplicate check (only sets allocating anew
    need it: a requested IP is refused by its file existing)."""
    if len(conf.requested) >= len(conf.ranges):
        return []
    return [ip for ip in map(parse_ip, store.owned_by(cid, ifname)) if ip is not None]


def delete(req: Request) -> None:
    """Release the attachment's addresses. A config ADD refuses is still deletable (libcni stops
    a DEL chain at the first error): the store is found by the network name and dataDir alone,
    and the reservations by the container ID and ifname."""
    _validate(req)
    try:
        conf = _load(req)
    except CNIError as e:
        store_at = ipam_config.store_for_del(req.config)
        if store_at is None:
            req.log(f"DEL: no store to release from ({e.msg})")
            return
        req.log(f"DEL: releasing by container ID and ifname; the config is refused: {e.msg}")
        try:
            with Store(*store_at) as store:
                store.release(req.container_id, req.ifname)
        except StoreError as err:  # a dataDir ADD could not have used either
            req.log(f"DEL: store {store_at[0]} unusable: {err.msg}")
        return
    known = [str(ip) for ip in _prev_ips(req, conf)]
    with Store(conf.data_dir, conf.name) as store:
        if not store.release_known(req.container_id, req.ifname, known):
            store.release(req.container_id, req.ifname)


def check(req: Request) -> None:
    """The attachment holds an address (the reference's rule), and every address of ours that the
    previous result lists is still reserved for it."""
    _validate(req)
    conf = _load(req)
    prev = _prev_ips(req, conf)
    with Store(conf.data_dir, conf.name) as store:
        if store.holds(req.container_id, req.ifname, [str(ip) for ip in prev]):
            return  # every address of the previous result is the attachment's: no scan
        held = store.find(req.container_id, req.ifname)
    if not held:
        raise CNIError(Code.INTERNAL,
                       f"host-local: Failed to find address added by container {req.container_id}")
    held_ips = {parse_ip(name) for name in held}
    for ip in prev:
        if ip not in held_ips:
            raise CNIError(Code.INTERNAL, f"host-local: address {ip} of the previous result is "
                           f"not reserved for {req.container_id}/{req.ifname}")


def _prev_ips(req: Request, conf: ipam_config.IPAMConfig) -> list[Address]:
    out = []
    for entry in (req.prev_result or {}).get("ips", []):
        ip = parse_ip(str(entry.get("address", "")).split("/")[0])
        if ip is not None and any(s.range_for(ip) is not None for s in conf.ranges):
            out.append(ip)
    return out


def gc(req: Request) -> int:
    """Release every reservation whose attachment is not in the runtime's valid list;
    -> how many."""
    conf = _load(req)
    valid = valid_attachments(req.config)
    if valid is None:  # libcni's GC without args; releasing on a missing list loses live IPs
        req.log("GC without cni.dev/valid-attachments: no reservation released")
        return 0
    valid_ids = {cid for cid, _ in valid}
    removed = 0
    with Store(conf.data_dir, conf.name) as store:
        for name, cid, ifname in reservations(store.entries()):
            # Old id-only files carry no ifname: keep them while the container is valid.
            keep = (cid, ifname) in valid if ifname else cid in valid_ids
            if not keep:
                req.log(f"gc: releasing {name} held by {cid!r}/{ifname!r}")
                store.release_ip(name)
                removed += 1
    return removed


def status(req: Request) -> None:
    """Available when the store can be created, locked and written; error 50 says why not."""
    conf = _load(req)
    try:
        with Store(conf.data_dir, conf.name) as store:
            if not os.access(store.path, os.W_OK | os.X_OK):
                raise CNIError(Code.NOT_AVAILABLE,
                               f"host-local store {store.path} is not writable")
            _probe_write(store)
    except StoreError as e:
        raise CNIError(Code.NOT_AVAILABLE, f"host-local store unusable: {e.msg}",
                       e.details) from None


def _probe_write(store: Store) -> None:
    """Create and remove a file: the only proof the store takes writes (read-only mounts)."""
    name = f".status-probe-{os.getpid()}"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=store.dir_fd)
        os.close(fd)
        os.unlink(name, dir_fd=store.dir_fd)
    except OSError as e:
        raise CNIError(Code.NOT_AVAILABLE, f"host-local store {store.path} is not writable: "
                       f"{e.strerror or e}") from None


# Container IDs and ifnames reach the store's file contents: the skel validates them, and so do
# we when called in-process by another plugin.
def _validate(req: Request) -> None:
    names.check_container_id(req.container_id)
    names.check_ifname(req.ifname)
