"""Hex digests for kernel object names and rule comments, without OpenSSL.

hashlib loads OpenSSL (_hashlib, ~2.5 ms of an exec) for every digest it makes; the
interpreter's own SHA-2 modules give the same bytes. Stdlib only.
"""

from __future__ import annotations

try:
    from _sha256 import sha256
    from _sha512 import sha512
except ImportError:  # Python 3.12+ merged them into _sha2; other builds may lack both
    try:
        from _sha2 import sha256, sha512  # type: ignore[import-not-found, no-redef]
    except ImportError:
        from hashlib import sha256, sha512  # type: ignore[assignment]


def sha512_hex(text: str, length: int) -> str:
    return sha512(text.encode()).hexdigest()[:length]


def sha256_hex(text: str, length: int) -> str:
    return sha256(text.encode()).hexdigest()[:length]
