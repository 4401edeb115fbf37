"""static-file: an IPAM plugin giving each container the address the reservations file names.

Written against pycni's public plugin interface (cni.api) only: the config model, the request,
CNI errors, the key matching Go does. pycni's skel does the rest: version gates, the result in
the config's version, the error JSON, CNI_ARGS.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from typing import Any

from cni.api import (
    CNIError,
    Code,
    ConfigModel,
    Field,
    Request,
    Result,
    StrictStr,
    get_key,
    invalid_config,
    parse_config,
)

SUPPORTED_FROM = "0.3.0"  # results carry "interface" indexes: not the 0.1.0/0.2.0 shapes


class IPAMConf(ConfigModel):
    type: StrictStr
    file: StrictStr
    routes: list[dict[str, Any]] = Field(default_factory=list)


class NetConf(ConfigModel):
    ipam: IPAMConf


def _conf(req: Request) -> IPAMConf:
    return parse_config(NetConf, req.config).ipam


def _reservations(path: str) -> list[dict[str, Any]]:
    """The file's entries. It decides addresses: one that anyone but root could write is
    refused (error 7 naming it), as is one that is no JSON object with a list."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise CNIError(Code.IO_FAILURE, f"ipam.file {path!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise invalid_config("ipam.file", path,
                                 "must be a regular file owned by root, not group/other writable")
        try:
            data = json.loads(f.read(1 << 20))
        except ValueError as e:
            raise invalid_config("ipam.file", path, f"not JSON: {e}") from None
    entries = get_key(data, "reservations") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise invalid_config("ipam.file", path, 'needs {"reservations": [...]}')
    return [e for e in entries if isinstance(e, dict)]


def _mac(req: Request) -> str | None:
    mac = req.runtime_config.get("mac") or req.arg("MAC")
    return mac.lower() if isinstance(mac, str) else None


def _find(req: Request, conf: IPAMConf) -> dict[str, Any]:
    mac = _mac(req)
    for entry in _reservations(conf.file):
        cid, emac = get_key(entry, "containerID"), get_key(entry, "mac")
        if cid == req.container_id or (mac and isinstance(emac, str) and emac.lower() == mac):
            return entry
    raise CNIError(Code.INVALID_CONFIG, f"no reservation in {conf.file} for container "
                   f"{req.container_id}" + (f" or MAC {mac}" if mac else ""))


def _ip(entry: dict[str, Any], path: str) -> dict[str, Any]:
    address, gateway = get_key(entry, "address"), get_key(entry, "gateway")
    try:
        iface = ipaddress.ip_interface(address)
        gw = ipaddress.ip_address(gateway) if gateway is not None else None
    except (TypeError, ValueError):
        raise invalid_config("ipam.file", path, f"bad reservation {json.dumps(entry)}") from None
    ip: dict[str, Any] = {"address": str(iface)}
    if gw is not None:
        ip["gateway"] = str(gw)
    return ip


def add(req: Request) -> Result:
    conf = _conf(req)
    entry = _find(req, conf)
    return {"cniVersion": req.version, "interfaces": [], "ips": [_ip(entry, conf.file)],
            "routes": conf.routes, "dns": {}}


def check(req: Request) -> None:
    conf = _conf(req)
    _ip(_find(req, conf), conf.file)


def delete(req: Request) -> None:
    """Nothing was taken: the file is the allocation. Never fails over the config."""


def status(req: Request) -> None:
    _reservations(_conf(req).file)
