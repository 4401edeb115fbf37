"""Hex digest prefixes for kernel object names and rule comments (the reference's names: veth
names aside, every name and comment it derives from a network, interface and container ID)."""

from __future__ import annotations

from hashlib import sha256, sha512


def sha512_hex(text: str, length: int) -> str:
    return sha512(text.encode()).hexdigest()[:length]


def sha256_hex(text: str, length: int) -> str:
    return sha256(text.encode()).hexdigest()[:length]
