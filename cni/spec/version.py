"""CNI spec versions: the ones we speak, comparison and negotiation."""

from __future__ import annotations

import functools

from cni.spec.errors import CNIError, Code

SUPPORTED: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT = "1.1.0"
# An empty cniVersion means 0.1.0, as in the reference's config decoder.
DEFAULT_IF_MISSING = "0.1.0"


def parse(version: str) -> tuple[int, int, int]:
    """'1.0.0' -> (1, 0, 0); anything that is not three dot-separated numbers is code 1."""
    return _parsed(version) if type(version) is str else _parsed.__wrapped__(version)


@functools.lru_cache(maxsize=64)  # each request asks a few times of the same few versions
def _parsed(version: str) -> tuple[int, int, int]:
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise CNIError(Code.INCOMPATIBLE_VERSION, f'invalid version "{version}"')
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def require_supported(version: str, supported: tuple[str, ...] = SUPPORTED) -> str:
    """Refuses a config version the plugin does not speak, with the reference's message and
    details (Go's %q of the list: quoted, space-separated)."""
    if version not in supported:
        listed = " ".join(f'"{v}"' for v in supported)
        raise CNIError(Code.INCOMPATIBLE_VERSION, "incompatible CNI versions",
                       f'config is "{version}", plugin supports [{listed}]')
    return version
