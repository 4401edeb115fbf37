"""tuning's config: the reference's TuningConf and where each setting may come from, validated
before anything changes.

Sources, later ones winning as in the reference's parseConf: the config's own keys (`sysctl`,
`mac`, `promisc`, `mtu`, `allmulti`, `txQLen`, `dataDir`), CNI_ARGS `MAC=` (with the
reference's `IgnoreUnknown`), runtimeConfig `mac` (capability `mac`), then the config's
`args.cni` (`sysctl` merged key by key; `mac`, `promisc`, `mtu`, `allmulti`, `txQLen`).

sysctl keys, as the reference's getSysctlFilename: dots become slashes, the first `IFNAME`
becomes CNI_IFNAME, the path is cleaned under /proc/sys and must stay under /proc/sys/net/ (the
plugin writes it inside the pod's network namespace, where /proc/sys/net is that namespace's
own). With /etc/cni/tuning/allowlist.conf present, ADD takes only keys one of its lines (RE2, as
Go's regexp, unanchored) matches: cni.plugins.tuning_allowlist. A key given twice in `sysctl`
is refused.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from typing import Annotated, Any, NamedTuple

from cni.plugins.tuning_backup import DEFAULT_DATA_DIR
from cni.skel import Request
from cni.spec import keys, names
from cni.spec.config import Field, Model, PluginConf, StrictBool, StrictInt, StrictStr, parse
from cni.spec.errors import CNIError, invalid_config

SYSCTL_ROOT = "/proc/sys"
NET_ROOT = "/proc/sys/net/"
_HEX = "[0-9a-fA-F]"
# Go's net.ParseMAC forms of a 6-byte address: colons, hyphens, or three dotted groups of four.
_MAC = re.compile(rf"^{_HEX}{{2}}(:{_HEX}{{2}}){{5}}$|^{_HEX}{{2}}(-{_HEX}{{2}}){{5}}$"
                  rf"|^{_HEX}{{4}}\.{_HEX}{{4}}\.{_HEX}{{4}}$")

Mtu = Annotated[StrictInt, Field(ge=0, lt=2**31)]  # 0: not set (the reference's int zero)
TxQLen = Annotated[StrictInt, Field(ge=0, lt=2**32)]  # the kernel's u32


class CniArgs(Model):
    """`args.cni`: the reference's IPAMArgs (its other keys belong to other plugins)."""

    sysctl: dict[str, StrictStr] | None = None
    mac: StrictStr | None = None
    promisc: StrictBool | None = None
    mtu: Mtu | None = None
    allmulti: StrictBool | None = None
    txQLen: TxQLen | None = None


class TuningConf(PluginConf):
    dataDir: StrictStr | None = None
    sysctl: dict[str, StrictStr] | None = None
    mac: StrictStr | None = None
    promisc: StrictBool | None = None
    mtu: Mtu | None = None
    txQLen: TxQLen | None = None
    allmulti: StrictBool | None = None


class Sysctl(NamedTuple):
    key: str  # as written in the config
    value: str
    path: str  # the file under /proc/sys/net/


class Settings(NamedTuple):
    """What to do, resolved from every source; `origin` names the key each setting came from
    (for messages): e.g. {"mtu": "args.cni.mtu"}."""

    data_dir: str
    sysctls: list[Sysctl]
    mac: str | None
    promisc: bool
    mtu: int | None
    allmulti: bool | None
    txqlen: int | None
    origin: dict[str, str]

    def touches_link(self) -> bool:
        return bool(self.mac or self.promisc or self.mtu or self.allmulti is not None
                    or self.txqlen is not None)


def load(req: Request) -> Settings:
    """The settings for ADD and CHECK; code 7 (4 for CNI_ARGS) naming the key and value of the
    first bad one."""
    refuse_duplicate_sysctls(req.stdin)
    conf = parse(TuningConf, req.config)
    origin = {"mac": "mac", "promisc": "promisc", "mtu": "mtu", "allmulti": "allmulti",
              "txqlen": "txQLen"}
    sysctl = dict(conf.sysctl or {})
    sysctl_origin = dict.fromkeys(sysctl, "sysctl")
    mac, mtu = conf.mac or None, conf.mtu or None
    promisc, allmulti, txqlen = bool(conf.promisc), conf.allmulti, conf.txQLen

    arg_mac = names.known_args(req.args, ("MAC",)).get("MAC")
    if arg_mac:
        mac, origin["mac"] = arg_mac, "CNI_ARGS MAC"
    runtime = req.runtime_config
    rc_mac = runtime.get("mac")
    if rc_mac is not None and not isinstance(rc_mac, str):
        raise invalid_config(f"runtimeConfig.{runtime.written('mac')}", rc_mac,
                             "must be a string")
    if rc_mac:
        mac, origin["mac"] = rc_mac, "runtimeConfig.mac"

    cni = _cni_args(conf.args)
    if cni is not None:
        for key, value in (cni.sysctl or {}).items():
            sysctl[key] = value
            sysctl_origin[key] = "args.cni.sysctl"
        if cni.mac is not None:
            mac, origin["mac"] = cni.mac or None, "args.cni.mac"
        if cni.promisc is not None:
            promisc, origin["promisc"] = cni.promisc, "args.cni.promisc"
        if cni.mtu is not None:
            mtu, origin["mtu"] = cni.mtu or None, "args.cni.mtu"
        if cni.allmulti is not None:
            allmulti, origin["allmulti"] = cni.allmulti, "args.cni.allmulti"
        if cni.txQLen is not None:
            txqlen, origin["txqlen"] = cni.txQLen, "args.cni.txQLen"

    if mac is not None:
        mac = parse_mac(origin["mac"], mac)
    return Settings(
        data_dir=data_dir_of(conf.dataDir),
        sysctls=[Sysctl(k, v, sysctl_path(f"{sysctl_origin[k]}.{k}", k, v, req.ifname))
                 for k, v in sysctl.items()],
        mac=mac, promisc=promisc, mtu=mtu, allmulti=allmulti, txqlen=txqlen, origin=origin)


def _cni_args(args: dict[str, Any] | None) -> CniArgs | None:
    if not args:
        return None
    cni = keys.get(args, "cni")
    if cni is None:
        return None
    return parse(CniArgs, cni, "args.cni")


def data_dir_of(value: str | None) -> str:
    if not value:
        return DEFAULT_DATA_DIR
    if not os.path.isabs(value) or "\0" in value:
        raise invalid_config("dataDir", value, "must be an absolute path")
    return value


def data_dir_for_del(config: dict[str, Any]) -> str:
    """DEL's dataDir: the config's if ADD could have used it, else the default (DEL never
    fails over a config value)."""
    value = keys.get(config, "dataDir")
    try:
        return data_dir_of(value if isinstance(value, str) else None)
    except CNIError:
        return data_dir_of(None)


def parse_mac(key: str, value: str) -> str:
    """A unicast 6-byte MAC in Go's ParseMAC notations -> lower case with colons."""
    if not _MAC.match(value):
        raise invalid_config(key, value, "not a MAC address (6 bytes: aa:bb:cc:dd:ee:ff)")
    digits = re.sub("[^0-9a-fA-F]", "", value).lower()
    first = int(digits[:2], 16)
    if first & 1 or int(digits, 16) == 0:
        raise invalid_config(key, value, "not a unicast MAC address")
    return ":".join(digits[i:i + 2] for i in range(0, 12, 2))


def sysctl_path(where: str, key: str, value: str, ifname: str) -> str:
    """The reference's getSysctlFilename, refusing (7) a key outside /proc/sys/net/."""
    if "\0" in key or "\0" in value:
        raise invalid_config(where, value, "NUL in a sysctl key or value")
    rel = key.replace(".", "/").replace("IFNAME", ifname, 1)
    path = posixpath.normpath(f"{SYSCTL_ROOT}/{rel}")  # Go's filepath.Join: joined, cleaned
    if not path.startswith(NET_ROOT):
        raise invalid_config(where, value, f"not a network sysctl: {path} is outside "
                             f"{NET_ROOT} (keys are per pod network namespace only)")
    return path


class _Pairs(list):
    """A JSON object as its list of (key, value) pairs, duplicates kept."""


def refuse_duplicate_sysctls(stdin: bytes) -> None:
    """The reference refuses a key given twice in the top-level `sysctl` object (Python's JSON
    decoder would keep the last silently)."""
    if b"sysctl" not in stdin.lower():
        return
    try:
        top = json.loads(stdin, object_pairs_hook=_Pairs)
    except ValueError:
        return  # skel decoded it already; nothing more to find here
    if not isinstance(top, _Pairs):
        return
    seen: set[str] = set()
    for name, value in top:
        if keys.fold(name) != "sysctl" or not isinstance(value, _Pairs):
            continue
        for key, item in value:
            if key in seen:
                raise invalid_config(f"sysctl.{key}", _plain(item),
                                     "duplicated sysctl keys are not allowed")
            seen.add(key)


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, _Pairs) else value
