"""What pycni can leave behind on a node, listed, so every reliability test can demand nothing.

A leak is anything a pod attachment owns that outlives its DEL or GC: a host-local reservation,
a host-side veth, a `bwp*` ifb, a qdisc that shapes something, an nft rule tagged with a comment
(every per-container rule carries one; the static jump rules do not), or a result-cache file.
The throwaway host namespace only ever holds what the test and the plugins made, so the checks
can be strict: any commented rule, any veth, any non-default qdisc counts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cnitest import Netns

# What the kernel attaches on its own; anything else was put there by bandwidth (or a leak).
DEFAULT_QDISCS = frozenset({"noqueue", "pfifo_fast", "fq_codel", "mq", "noop", "pfifo"})


@dataclass
class Leaks:
    reservations: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    ifbs: list[str] = field(default_factory=list)
    qdiscs: list[str] = field(default_factory=list)
    nft_rules: list[str] = field(default_factory=list)
    cache_files: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def total(self) -> int:
        return sum(len(getattr(self, f.name)) for f in fields(self))

    def __str__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name)]
        return "leaks: " + ("; ".join(parts) if parts else "none")


def reservations(data_dir: Path | None) -> list[str]:
    """host-local's per-IP files (`<dataDir>/<net>/<ip>`), with their owner, as 'net/ip=owner'."""
    found: list[str] = []
    if data_dir is None or not data_dir.is_dir():
        return found
    for net in sorted(data_dir.iterdir()):
        if not net.is_dir() or net.is_symlink():
            continue
        for entry in sorted(net.iterdir()):
            if entry.name == "lock" or entry.name.startswith("last_reserved_ip."):
                continue
            try:
                owner = entry.read_bytes().decode("utf-8", "replace").replace("\r\n", "/")
            except OSError as e:
                owner = f"<{e.strerror}>"
            found.append(f"{net.name}/{entry.name}={owner}")
    return found


def cache_files(cache_dir: Path | None) -> list[str]:
    """Every file under the runtime's cache dir (results/ and any half-written temp file)."""
    if cache_dir is None or not cache_dir.exists():
        return []
    return sorted(str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*")
                  if not p.is_dir() or p.is_symlink())


def _kind(link: dict[str, Any]) -> str:
    return link.get("linkinfo", {}).get("info_kind", "")


def links(host: Netns) -> list[dict[str, Any]]:
    return host.ip("-d", "link", "show")


def qdiscs(host: Netns) -> list[dict[str, Any]]:
    out = host.run("tc", "-j", "qdisc", "show").stdout
    return json.loads(out) if out.strip() else []


def commented_rules(ruleset: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for obj in ruleset.get("nftables", []):
        rule = obj.get("rule")
        if rule and rule.get("comment"):
            yield rule


def find(host: Netns, data_dir: Path | None = None, cache_dir: Path | None = None, *,
         ignore_links: Iterable[str] = ()) -> Leaks:
    """Everything attachment-owned that is still present in `host`, the store and the cache."""
    ignore = set(ignore_links)
    leaks = Leaks(reservations=reservations(data_dir), cache_files=cache_files(cache_dir))
    for link in links(host):
        name = link["ifname"]
        if name in ignore:
            continue
        if _kind(link) == "veth":
            leaks.veths.append(name)
        elif _kind(link) == "ifb" and name.startswith("bwp"):
            leaks.ifbs.append(name)
    for q in qdiscs(host):
        if q.get("dev") in ignore or q.get("kind") in DEFAULT_QDISCS:
            continue
        leaks.qdiscs.append(f"{q.get('dev')}:{q.get('kind')}:{q.get('handle')}")
    for rule in commented_rules(host.nft_ruleset()):
        leaks.nft_rules.append(
            f"{rule['family']} {rule['table']} {rule['chain']}: {rule['comment']}")
    return leaks


def assert_none(host: Netns, data_dir: Path | None = None, cache_dir: Path | None = None, *,
                ignore_links: Iterable[str] = (), context: str = "") -> None:
    leaks = find(host, data_dir, cache_dir, ignore_links=ignore_links)
    assert leaks.empty(), f"{context}: {leaks}" if context else str(leaks)


@dataclass(frozen=True)
class HostSnapshot:
    """The host-visible state an erroring plugin must leave exactly as it found it."""

    links: tuple[tuple[str, str], ...]
    addresses: tuple[str, ...]
    nft: str
    files: tuple[tuple[str, str], ...]

    def diff(self, other: HostSnapshot) -> list[str]:
        out = []
        for name in ("links", "addresses", "files"):
            before, after = set(getattr(self, name)), set(getattr(other, name))
            out += [f"{name} -{x}" for x in sorted(before - after, key=str)]
            out += [f"{name} +{x}" for x in sorted(after - before, key=str)]
        if self.nft != other.nft:
            out.append("nft ruleset changed")
        return out


def _tree(roots: Iterable[Path]) -> tuple[tuple[str, str], ...]:
    """(path, content or link target) for every entry under the roots."""
    entries: list[tuple[str, str]] = []
    for root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if p.is_symlink():
                entries.append((str(p), "-> " + os.readlink(p)))
            elif p.is_file():
                try:
                    entries.append((str(p), p.read_bytes().decode("utf-8", "replace")))
                except OSError:
                    entries.append((str(p), "<unreadable>"))
            else:
                entries.append((str(p), "<dir>"))
    return tuple(entries)


def _nft_without_handles(ruleset: dict[str, Any]) -> str:
    """The ruleset as text, minus what changes without a real change: handles, metainfo, and
    the order nft lists tables, chains and sets in (handle order: a chain made afresh, as
    portmap's pycni-all-recorded, moves to the end). The rules of each chain keep their order."""
    objs = [o for o in ruleset.get("nftables", []) if "metainfo" not in o]
    for o in objs:
        for v in o.values():
            if isinstance(v, dict):
                v.pop("handle", None)
    declared = sorted(json.dumps(o, sort_keys=True) for o in objs if "rule" not in o)
    chains: dict[str, list[str]] = {}
    for o in objs:
        if "rule" in o:
            r = o["rule"]
            key = f"{r.get('family')} {r.get('table')} {r.get('chain')}"
            chains.setdefault(key, []).append(json.dumps(o, sort_keys=True))
    return json.dumps([declared, sorted(chains.items())])


def snapshot(host: Netns, *dirs: Path) -> HostSnapshot:
    link_list = links(host)
    addrs = host.ip("addr", "show")
    return HostSnapshot(
        links=tuple(sorted((li["ifname"], _kind(li)) for li in link_list)),
        addresses=tuple(sorted(f"{a['ifname']} {i['local']}/{i['prefixlen']}"
                               for a in addrs for i in a.get("addr_info", []))),
        nft=_nft_without_handles(host.nft_ruleset()),
        files=_tree(dirs),
    )
