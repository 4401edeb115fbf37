"""JSON keys matched as the reference's Go structs match them: case-insensitively.

Go's encoding/json maps an object key to a struct field by exact name first, else by Unicode
case folding, so the reference plugins read `{"HostPort": 8080}` as `hostPort`. containerd's CRI
relies on that: its capability structs carry no JSON tags, and it sends portMappings and
bandwidth with capitalised keys. Every place that reads a config key by name goes through here:
the config models (cni.spec.config.Model folds before validating), the common keys in skel, the
capability args in runtimeConfig, and the entries the plugins parse by hand.

Rules: an exact-case key wins over a differently cased duplicate; among differently cased
duplicates the last one wins (Go assigns each in document order). Keys that match no known name
are kept as they are. Errors keep naming the key as the user wrote it (`Keys.written`).
Stdlib only: skel imports this before VERSION is answered.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

# Capability args a runtime may put in runtimeConfig (the CNI conventions document's table, plus
# the CRI's pod annotations): the names the plugins look up there.
CAPABILITIES = ("portMappings", "bandwidth", "ips", "mac", "ipRanges", "dns", "aliases",
                "cgroupPath", "infinibandGUID", "deviceID", "io.kubernetes.cri.pod-annotations")


def fold(name: str) -> str:
    """A folded form such that fold(a) == fold(b) exactly when Go's EqualFold(a, b): simple
    one-to-one case folding (so 'ß' stays itself, while the long s and Kelvin sign fold)."""
    if name.isascii():
        return name.lower()
    out = []
    for c in name:
        low = c.lower()
        out.append("s" if c == "\u017f" else low if len(low) == 1 else c)
    return "".join(out)


class Keys(dict[str, Any]):
    """A JSON object with its known keys renamed to their canonical spelling. `written(key)`
    gives the spelling the input used, for error messages."""

    def __init__(self, raw: Mapping[str, Any], known: Iterable[str]) -> None:
        super().__init__()
        names, canonical = _canonical(known)
        self.spelled: dict[str, str] = {}
        exact: set[str] = set()
        for key, value in raw.items():
            if not isinstance(key, str):  # JSON keys are strings; a caller's dict may not be
                self[key] = value
                continue
            name = key if key in names else canonical.get(fold(key))
            if name is None:
                self[key] = value
                continue
            if name == key:
                exact.add(name)
                self.spelled.pop(name, None)
                self[name] = value
                continue
            if name in exact:
                continue  # the exact spelling wins
            self[name] = value
            self.spelled[name] = key

    def written(self, key: str) -> str:
        return self.spelled.get(key, key)


def _canonical(known: Iterable[str]) -> tuple[frozenset[str], dict[str, str]]:
    """The names in `known`, and each by its folded form: worked out once per set of names (a
    config's keys are matched against the same few sets, request after request)."""
    return _canonical_of(tuple(known))


@functools.lru_cache(maxsize=256)  # distinct sets of known names: the callers' constants, models
def _canonical_of(names: tuple[str, ...]) -> tuple[frozenset[str], dict[str, str]]:
    return frozenset(names), {fold(k): k for k in frozenset(names)}


def match(raw: Mapping[str, Any], known: Iterable[str]) -> Keys:
    """`raw` with the keys in `known` found however they are cased (see the module doc)."""
    return Keys(raw, known)


def is_one_of(key: Any, known: Iterable[str]) -> bool:
    """Whether the config key `key` is one of `known`, however cased (a caller's dict may have
    keys that are not strings: never one)."""
    if not isinstance(key, str):
        return False
    names, canonical = _canonical(known)
    return key in names or fold(key) in canonical


def get(raw: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """One key, however cased: the exact spelling if present, else the last folded match."""
    if key in raw:
        return raw[key]
    folded = fold(key)
    found = default
    for k, value in raw.items():
        if isinstance(k, str) and fold(k) == folded:
            found = value
    return found


def written_path(data: Any, path: Iterable[Any]) -> list[Any]:
    """A key path through the canonical (folded) view, spelled as `data` spells it: how a
    validation error names the key the user wrote."""
    out: list[Any] = []
    for part in path:
        if isinstance(data, Mapping) and isinstance(part, str):
            spelling = _spelling(data, part)
            out.append(spelling)
            data = data.get(part if isinstance(data, Keys) else spelling)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            out.append(part)
            data = data[part]
        else:
            out.append(part)
            data = None
    return out


def _spelling(data: Mapping[str, Any], key: str) -> str:
    if key in data:
        return data.written(key) if isinstance(data, Keys) else key
    folded = fold(key)
    return next((k for k in reversed(list(data)) if isinstance(k, str) and fold(k) == folded),
                key)
