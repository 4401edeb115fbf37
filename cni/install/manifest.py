"""The record of an install, `.pycni-install.json` in the bin dir: every path install wrote (and
the file each replaced with --force, kept as a backup), the dirs it made, the units it enabled and
the package copy the executables run. Uninstall removes exactly that, restores what was replaced,
and leaves anything else (another vendor's plugin, a file an admin edited since) alone. Saved
after each file: an interrupted install can still be uninstalled."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni.install import files
from cni.install.errors import MANIFEST
from cni.install.render import ROOT


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """One path install wrote: a file (with its digest) or a symlink (with its target)."""

    path: str
    kind: str  # "file" | "symlink"
    digest: str = ""
    target: str = ""
    backup: str = ""  # where the file it replaced (with --force) was kept

    def matches_disk(self) -> bool:
        """Whether the path still holds what install wrote (else it is someone else's now)."""
        p = Path(self.path)
        if self.kind == "symlink":
            return p.is_symlink() and os.readlink(p) == self.target
        return p.is_file() and not p.is_symlink() and digest(p.read_bytes()) == self.digest


@dataclass
class Manifest:
    bin_dir: str
    root: str = str(ROOT)
    python: str = ""
    entries: list[Entry] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    systemd: bool = False  # units were installed and enabled: uninstall disables them
    lib: str = ""  # the copy of the package the executables run (copies), if installed
    plugins: dict[str, str] = field(default_factory=dict)  # entry-point plugins linked: target
    forwarder: bool = False  # the names link to pycni-forwarder (cni/install/forwarder.py)

    @classmethod
    def load(cls, bin_dir: Path) -> Manifest | None:
        path = bin_dir / MANIFEST
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return cls(bin_dir=raw["bin_dir"], root=raw.get("root", ""), python=raw.get("python", ""),
                   entries=[Entry(**e) for e in raw.get("entries", [])],
                   created_dirs=list(raw.get("created_dirs", [])),
                   systemd=bool(raw.get("systemd", False)), lib=raw.get("lib", ""),
                   plugins=dict(raw.get("plugins", {})),
                   forwarder=bool(raw.get("forwarder", False)))

    def save(self) -> None:
        data = {"bin_dir": self.bin_dir, "root": self.root, "python": self.python,
                "entries": [vars(e) for e in self.entries], "created_dirs": self.created_dirs,
                "systemd": self.systemd, "lib": self.lib, "plugins": self.plugins,
                "forwarder": self.forwarder}
        files.atomic_write(Path(self.bin_dir) / MANIFEST,
                           json.dumps(data, indent=2).encode() + b"\n", 0o644)

    def find(self, path: Path) -> Entry | None:
        return next((e for e in self.entries if e.path == str(path)), None)


@dataclass
class Planned:
    """What install is about to write at one path."""

    path: Path
    kind: str
    content: bytes = b""
    target: str = ""
    mode: int = 0o755

    def same_as_disk(self) -> bool:
        if self.kind == "symlink":
            return self.path.is_symlink() and os.readlink(self.path) == self.target
        return (self.path.is_file() and not self.path.is_symlink()
                and self.path.read_bytes() == self.content)


def describe(manifest: Manifest) -> dict[str, Any]:
    """The manifest as `pycni doctor` shows it."""
    return {"root": manifest.root, "python": manifest.python,
            "files": [e.path for e in manifest.entries], "plugins": manifest.plugins,
            "forwarder": manifest.forwarder}
