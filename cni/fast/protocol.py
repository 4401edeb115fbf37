"""The wire format between the shim and the daemon. Imported by both, so builtins only: the
shim would pay ~0.3 ms a request to load _struct, hence the small big-endian codec below.

One request per connection, on a unix stream socket:

    shim   -> daemon  REQUEST: MAGIC, header (!IIIBI: plugin, env, stdin lengths, fd roles, umask),
                      then plugin name, env block ("K=V\\0"...), stdin; the fds ride as
                      SCM_RIGHTS on the first bytes, in the order of the ROLE_* bits set.
    daemon -> shim    ACK (one byte) once a child has committed to running the request, then
                      REPLY: b"R", header (!iII: exit code, stdout, stderr lengths), the bytes.

The ACK is what makes fallback safe: before it, nothing ran and the shim may run the request
in-process; after it, the request may have run, so a lost reply is a CNI error (try again later),
never a second run. A REPLY without an ACK is the daemon refusing the request (not run either).
DENIED then REPLY is a refusal that is the caller's answer (peercaps.py: it may not have a plugin
run): not run, and not to be run in-process or retried (a shim from before DENIED takes it for an
ACK and relays the REPLY: the same).

A status query (status.py) is STATUS_MAGIC alone instead of a request: the daemon answers it
itself, never with a plugin run, as a REPLY (code 0, its figures as JSON on stdout), no ACK.
A handover request (handover.py) is HANDOVER_MAGIC alone: answered the same way once the daemon
has handed its socket to a successor (code 0, JSON), or could not (code 1, a CNI error).
"""

import sys


class Header:
    """Fixed big-endian integer fields, struct.Struct's pack/unpack_from/size for formats
    like "!IIIBI" (I: u32, i: s32, B: u8), without loading _struct."""

    _WIDTHS = {"I": (4, False), "i": (4, True), "B": (1, False)}

    def __init__(self, fmt: str) -> None:
        self.fields = [self._WIDTHS[c] for c in fmt.lstrip("!")]
        self.size = sum(width for width, _ in self.fields)

    def pack(self, *values: int) -> bytes:
        return b"".join(v.to_bytes(width, "big", signed=signed)
                        for v, (width, signed) in zip(values, self.fields, strict=True))

    def unpack_from(self, data: bytes, offset: int = 0) -> tuple[int, ...]:
        if len(data) - offset < self.size:
            raise ValueError(f"need {self.size} bytes at offset {offset}")
        out = []
        for width, signed in self.fields:
            out.append(int.from_bytes(data[offset:offset + width], "big", signed=signed))
            offset += width
        return tuple(out)


MAGIC = b"PYCNI\x01"
STATUS_MAGIC = b"PYCNI?"  # a status query: the whole of it (same length as MAGIC)
HANDOVER_MAGIC = b"PYCNI>"  # hand over to a successor running the installed code (handover.py)
ACK = b"A"
DENIED = b"D"
REPLY = b"R"
REQ_HEADER = Header("!IIIBI")
REPLY_HEADER = Header("!iII")
REQ_PREFIX = len(MAGIC) + REQ_HEADER.size
REPLY_PREFIX = len(REPLY) + REPLY_HEADER.size

# Which fds a request carries, in this order.
ROLE_NETNS = 1  # the container's namespace (CNI_NETNS opened by the shim)
ROLE_CALLER_NET = 2  # the network namespace the shim runs in (the "host" it acts on)
ROLE_CALLER_MNT = 4  # its mount namespace (paths: dataDir, /run/netns, /proc/sys)
ROLE_CWD = 8  # its working directory
ROLES = (ROLE_NETNS, ROLE_CALLER_NET, ROLE_CALLER_MNT, ROLE_CWD)
MAX_FDS = len(ROLES)

DEFAULT_SOCKET = "/run/pycni/pycni.sock"
SOCKET_ENV = "PYCNI_SOCKET"
# "0": the shim never runs a request in-process when no daemon takes it, it answers
# TRY_AGAIN_LATER naming the socket (tests that claim the daemon path; nodes that want to know).
FALLBACK_ENV = "PYCNI_SHIM_FALLBACK"
# The daemon refuses bigger requests; skel's own stdin limit (16 MiB) plus room for the env.
MAX_REQUEST = 17 * 1024 * 1024


def encode_env(env: dict[bytes, bytes]) -> bytes:
    return b"".join(k + b"=" + v + b"\0" for k, v in env.items())


def decode_env(block: bytes) -> dict[str, str]:
    """The env as os.environ would show it (fs encoding, surrogateescape: os.fsdecode's, without
    its per-call overhead, ~0.1 ms a request in the daemon and again in its child)."""
    import sys

    encoding = sys.getfilesystemencoding()
    env: dict[str, str] = {}
    if encoding == "utf-8":
        # The block decoded at once, then split: the same, since in UTF-8 the bytes of NUL and
        # "=" are never part of another character, and surrogateescape makes neither of them.
        for item in block.decode(encoding, "surrogateescape").split("\0"):
            if item:
                key, _, value = item.partition("=")
                env[key] = value
        return env
    for item in block.split(b"\0"):
        if item:
            key, _, value = item.partition(b"=")
            env[key.decode(encoding, "surrogateescape")] = value.decode(encoding,
                                                                        "surrogateescape")
    return env


def env_values(block: bytes, names: tuple[str, ...]) -> dict[str, str]:
    """decode_env(block)'s entries for `names` (ASCII), without decoding the rest of the block
    (the daemon's parent reads four): each name's last item, "NAME=value" or a bare "NAME"."""
    padded = b"\0" + block + b"\0"
    out: dict[str, str] = {}
    for name in names:
        keys = _ENV_KEYS.get(name)
        if keys is None:
            key = b"\0" + name.encode("ascii")
            keys = _ENV_KEYS[name] = (key + b"=", key + b"\0")
        at = padded.rfind(keys[0])
        if padded.rfind(keys[1]) > at:
            out[name] = ""  # a bare name after the last NAME=...: as decode_env's partition
        elif at >= 0:
            start = at + len(keys[0])
            out[name] = padded[start:padded.index(b"\0", start)].decode(
                _FS_ENCODING, "surrogateescape")
    return out


# env_values' searches by name (a few names: the parent's), and the encoding os.environ's
# entries decode with (fixed at the interpreter's start)
_ENV_KEYS: dict[str, tuple[bytes, bytes]] = {}
_FS_ENCODING = sys.getfilesystemencoding()


def encode_request(plugin: str, env: bytes, stdin: bytes, roles: int, umask: int) -> bytes:
    name = plugin.encode()
    return b"".join((MAGIC, REQ_HEADER.pack(len(name), len(env), len(stdin), roles, umask),
                     name, env, stdin))


def request_size(prefix: bytes) -> int:
    """Total request length from its first REQ_PREFIX bytes; ValueError if not a request."""
    if prefix[:len(MAGIC)] != MAGIC:
        raise ValueError("not a pycni request")
    plugin_len, env_len, stdin_len, _, _ = REQ_HEADER.unpack_from(prefix, len(MAGIC))
    return REQ_PREFIX + plugin_len + env_len + stdin_len


def decode_request(data: bytes) -> tuple[str, bytes, bytes, int, int]:
    """-> (plugin, env block, stdin, roles, umask) of a complete request."""
    plugin_len, env_len, stdin_len, roles, umask = REQ_HEADER.unpack_from(data, len(MAGIC))
    at = REQ_PREFIX
    plugin = data[at:at + plugin_len].decode("utf-8", "surrogateescape")
    at += plugin_len
    env = data[at:at + env_len]
    at += env_len
    return plugin, env, data[at:at + stdin_len], roles, umask


def encode_reply(code: int, stdout: bytes, stderr: bytes) -> bytes:
    return b"".join((REPLY, REPLY_HEADER.pack(code, len(stdout), len(stderr)), stdout, stderr))


def reply_sizes(prefix: bytes) -> tuple[int, int, int]:
    """(code, stdout length, stderr length) from a reply's first REPLY_PREFIX bytes."""
    if prefix[:1] != REPLY:
        raise ValueError("not a pycni reply")
    return REPLY_HEADER.unpack_from(prefix, 1)


# --- errors the shim or the daemon report themselves (rare paths: heavier imports are fine) -----

TRY_AGAIN_LATER = 11
IO_FAILURE = 5
INTERNAL = 999


def error_reply(code: int, msg: str, stdin: bytes) -> bytes:
    """A CNI error as skel prints it: JSON on stdout in the config's cniVersion."""
    from cni.spec.errors import CNIError

    return CNIError(code, msg).to_json(config_version(stdin)).encode()


def config_version(stdin: bytes) -> str:
    """The version skel would print an error in (the config's, as skel decodes it)."""
    import json

    from cni.spec import version as versions

    try:
        config = json.loads(stdin)
    except ValueError:
        return versions.CURRENT
    if not isinstance(config, dict):
        return versions.CURRENT
    value = config.get("cniVersion") or versions.DEFAULT_IF_MISSING
    return value if isinstance(value, str) else versions.CURRENT
