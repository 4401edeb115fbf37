"""Small kernel files (/proc, /proc/sys) read whole through their fd: open, read to the end,
close. No io objects: open() adds six syscalls for a text stream (an isatty ioctl, lseeks),
and the daemon's spares and the verbs read such files on every request."""

from __future__ import annotations

import os


def read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 8192):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
