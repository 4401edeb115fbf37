"""The one error install and uninstall raise, and where their files go by default."""

from __future__ import annotations

from pathlib import Path

DEFAULT_BIN = Path("/opt/cni/bin")
DEFAULT_CONF = Path("/etc/cni/net.d")
DEFAULT_CONFLIST = "10-pycni.conflist"
MULTICALL = "pycni-plugin"
MANIFEST = ".pycni-install.json"
BACKUPS = ".pycni-backup"


class InstallError(Exception):
    """Install or uninstall refused; nothing (further) was changed."""
