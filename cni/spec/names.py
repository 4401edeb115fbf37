"""The names a request carries, and CNI_ARGS: one rule each, for the plugins (skel), the runtime
(libcni's side), IPAM and the host-local store alike.

Container IDs and network names become file names (host-local store, result cache), interface
names become kernel link names: the reference's rules (pkg/utils ValidateContainerID,
ValidateNetworkName, ValidateInterfaceName) keep them safe for both. Stdlib only.
"""

from __future__ import annotations

import json
import re

from cni.spec.errors import CNIError, Code

ID_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
MAX_IFNAME = 15  # IFNAMSIZ - 1, in bytes as the kernel counts


def valid_id(value: object) -> bool:
    """The container ID / network name rule."""
    return isinstance(value, str) and ID_RE.match(value) is not None


def check_container_id(cid: str) -> None:
    if not cid:
        raise CNIError(Code.UNKNOWN_CONTAINER, "missing containerID")
    if not valid_id(cid):
        raise CNIError(Code.INVALID_ENV, "invalid characters in containerID", cid)


def check_network_name(name: str) -> None:
    if not name:
        raise CNIError(Code.INVALID_CONFIG, "missing network name:")
    if not valid_id(name):
        raise CNIError(Code.INVALID_CONFIG, "invalid characters found in network name", name)


def ifname_problem(name: str) -> str | None:
    """Why `name` cannot be an interface name, or None. Also refuses what the kernel would
    (NUL, bytes that were not UTF-8 in the environment)."""
    if not name:
        return "interface name is empty"
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return "interface name is not valid UTF-8"
    if len(raw) > MAX_IFNAME:
        return "interface name is too long"
    if name in (".", ".."):
        return "interface name is . or .."
    if any(c in "/:\x00" or c.isspace() for c in name):  # isspace covers Unicode's Zs too
        return "interface name contains / or : or whitespace characters"
    return None


def check_ifname(name: str) -> None:
    """Code 4 as the reference's skel and libcni; details name the value as given."""
    problem = ifname_problem(name)
    if problem is not None:
        shown = name.encode("utf-8", "surrogateescape").hex() if "UTF-8" in problem else name
        raise CNIError(Code.INVALID_ENV, problem, shown)


# --- CNI_ARGS -------------------------------------------------------------------------------------

def parse_args(raw: str) -> list[tuple[str, str]]:
    """CNI_ARGS 'K1=V1;K2=V2' -> pairs; a pair without '=' is code 4, as in the reference."""
    pairs = []
    for item in raw.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise CNIError(Code.INVALID_ENV, f'CNI_ARGS: invalid pair "{item}"')
        pairs.append((key, value))
    return pairs


def known_args(pairs: list[tuple[str, str]], known: tuple[str, ...]) -> dict[str, str]:
    """The reference's types.LoadArgs into a struct with IgnoreUnknown and the `known` fields:
    a key the struct lacks is code 4 unless IgnoreUnknown is true, and IgnoreUnknown must be a
    boolean. Returns the known keys' values; a repeated key's last value wins, as there."""
    found: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in pairs:
        if key in known or key == "IgnoreUnknown":
            found[key] = value
        else:
            unknown.append(f"{key}={value}")
    ignore = found.pop("IgnoreUnknown", None)
    if ignore is not None and ignore.lower() not in ("1", "true", "0", "false"):
        raise CNIError(Code.INVALID_ENV, f'ARGS: error parsing value of pair '
                       f'"IgnoreUnknown={ignore}": boolean unmarshal error: invalid input {ignore}')
    if unknown and (ignore or "").lower() not in ("1", "true"):
        quoted = " ".join(json.dumps(item) for item in unknown)  # Go's %q of a []string
        raise CNIError(Code.INVALID_ENV, f"ARGS: unknown args [{quoted}]")
    return found
