"""libcni's result cache, byte for byte: `<cacheDir>/results/<net>-<containerID>-<ifname>`.

cnitool, containerd and CRI-O (all libcni) and pycni read and write the same files, so either side
can CHECK / DEL / GC an attachment the other made. The JSON is what Go's encoding/json prints for
libcni's `cachedInfo` struct: compact, struct fields in declaration order, maps with sorted keys,
`[]byte` as standard base64, `<`, `>` and `&` escaped.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CACHE_DIR = "/var/lib/cni"
KIND = "cniCacheV1"

_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
               "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _go_numbers(obj: Any) -> Any:
    """Go decodes JSON numbers to float64 and prints integral ones without a fraction."""
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 1e21:
        return int(obj)
    if isinstance(obj, dict):
        return {k: _go_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_go_numbers(v) for v in obj]
    return obj


def go_json(obj: Any, *, sort_keys: bool = True, indent: int | None = None) -> bytes:
    """JSON as Go's json.Marshal (sort_keys: a map) or MarshalIndent prints it."""
    text = json.dumps(_go_numbers(obj), ensure_ascii=False, sort_keys=sort_keys, indent=indent,
                      separators=(",", ": ") if indent is not None else (",", ":"))
    # These characters only ever occur inside JSON strings, so replacing them is safe.
    for char, escaped in _GO_ESCAPES.items():
        text = text.replace(char, escaped)
    return text.encode()


@dataclass
class CachedAttachment:
    """One cache file: what libcni calls cachedInfo / NetworkAttachment."""

    container_id: str
    network: str
    ifname: str
    config: bytes
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        info: dict[str, Any] = {
            "kind": KIND,
            "containerId": self.container_id,
            "config": base64.b64encode(self.config).decode(),
            "ifName": self.ifname,
            "networkName": self.network,
        }
        # omitempty fields, in struct order
        if self.netns:
            info["netns"] = self.netns
        if self.cni_args:
            info["cniArgs"] = [[k, v] for k, v in self.cni_args]
        if self.capability_args:
            info["capabilityArgs"] = self.capability_args
        if self.result:
            info["result"] = self.result
        # Struct order at the top; maps (capabilityArgs, result) sorted like Go maps.
        return b"{" + b",".join(
            go_json(k) + b":" + go_json(v) for k, v in info.items()) + b"}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CachedAttachment:
        raw_config = data.get("config") or ""
        return cls(
            container_id=data.get("containerId") or "",
            network=data.get("networkName") or "",
            ifname=data.get("ifName") or "",
            config=base64.b64decode(raw_config) if raw_config else b"",
            netns=data.get("netns") or "",
            cni_args=[(str(k), str(v)) for k, v in data.get("cniArgs") or []],
            capability_args=data.get("capabilityArgs") or {},
            result=data.get("result") or None,
        )


class ResultCache:
    """The cache directory (default /var/lib/cni); files live under its `results/`."""

    def __init__(self, cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR) -> None:
        self.dir = Path(cache_dir)

    @property
    def results_dir(self) -> Path:
        return self.dir / "results"

    def path(self, network: str, container_id: str, ifname: str) -> Path:
        if not network or not container_id or not ifname:
            raise ValueError(
                f"cache file path requires network name ({network!r}), container ID "
                f"({container_id!r}), and interface name ({ifname!r})")
        return self.results_dir / f"{network}-{container_id}-{ifname}"

    def write(self, att: CachedAttachment) -> Path:
        target = self.path(att.network, att.container_id, att.ifname)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a file; 0600 like libcni's WriteFile.
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, att.to_bytes())
        finally:
            os.close(fd)
        os.replace(tmp, target)
        return target

    def read_raw(self, network: str, container_id: str, ifname: str) -> bytes | None:
        try:
            return self.path(network, container_id, ifname).read_bytes()
        except (OSError, ValueError):
            return None

    def read(self, network: str, container_id: str, ifname: str) -> CachedAttachment | None:
        """The cached attachment, or None when there is none or it is not a cniCacheV1 file."""
        raw = self.read_raw(network, container_id, ifname)
        if raw is None:
            return None
        data = _loads(raw)
        if data is None or data.get("kind") != KIND:
            return None
        return CachedAttachment.from_json(data)

    def read_result(self, network: str, container_id: str,
                    ifname: str) -> dict[str, Any] | None:
        """The cached result JSON; a pre-cniCacheV1 file is the result itself (libcni legacy)."""
        raw = self.read_raw(network, container_id, ifname)
        if raw is None:
            return None
        data = _loads(raw)
        if data is None:
            raise ValueError(f"failed to unmarshal cached network {network!r} result")
        if data.get("kind") != KIND:
            return data
        return data.get("result") or None

    def remove(self, network: str, container_id: str, ifname: str) -> None:
        try:
            self.path(network, container_id, ifname).unlink()
        except (FileNotFoundError, ValueError):
            pass

    def attachments(self, container_id: str = "") -> list[CachedAttachment]:
        """All cniCacheV1 attachments, sorted by file name, like libcni's GetCachedAttachments."""
        try:
            names = sorted(os.listdir(self.results_dir))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if container_id:
                pos = name.find(f"-{container_id}-")
                if pos <= 0 or pos + len(container_id) + 2 >= len(name):
                    continue
            try:
                data = _loads((self.results_dir / name).read_bytes())
            except OSError:
                continue
            if data is None or data.get("kind") != KIND:
                continue
            att = CachedAttachment.from_json(data)
            if container_id and att.container_id != container_id:
                continue
            if not att.ifname or not att.network:
                continue
            found.append(att)
        return found


def _loads(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
