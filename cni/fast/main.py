"""The executables' entry: read env and stdin, run the plugin, write the reply. Stdlib only.

VERSION (and the bare "about" text) are answered without importing any plugin module.
"""

from __future__ import annotations

import os
import sys


def main(argv0: str) -> int:
    plugin = os.path.basename(argv0)
    stdin = b"" if sys.stdin is None or sys.stdin.closed else _read_stdin()
    env = dict(os.environ)
    from cni import skel

    reply = skel.run(plugin, env, stdin)
    _write(sys.stdout, reply.stdout)
    _write(sys.stderr, reply.stderr)
    return reply.code


def _read_stdin() -> bytes:
    try:
        if os.isatty(0):
            return b""
        return sys.stdin.buffer.read()
    except (OSError, ValueError):
        return b""


def _write(stream, data: bytes) -> None:
    if data:
        stream.buffer.write(data)
        stream.flush()
