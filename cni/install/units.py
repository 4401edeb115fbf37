"""The daemon's systemd units: where they go, and systemctl."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cni.install.errors import InstallError

SYSTEMD_DIR = Path("/etc/systemd/system")


def systemd_dir(requested: Path | None, enabled: bool = True) -> Path | None:
    """Where the units go: the dir asked for, else /etc/systemd/system on a systemd host (as
    sd_booted() tells: /run/systemd/system is a directory); None when opted out (--no-systemd,
    PYCNI_SYSTEMD=0) or systemd is not running."""
    if not enabled or os.environ.get("PYCNI_SYSTEMD", "") == "0":
        return None
    if requested is not None:
        return requested.absolute()
    return SYSTEMD_DIR if Path("/run/systemd/system").is_dir() else None


def systemctl(*args: str, check: bool = True) -> None:
    try:
        proc = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    except OSError as e:
        if check:
            raise InstallError(f"systemctl {' '.join(args)}: {e}") from None
        return
    if proc.returncode != 0 and check:
        raise InstallError(f"systemctl {' '.join(args)} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
