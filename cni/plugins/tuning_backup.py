"""tuning's record of what its ADD changed on a link, for DEL to put back: the reference's file.

One file per attachment, `<dataDir>/<containerID>_<ifname>.json` (dataDir defaults to
/run/cni/tuning), JSON as Go's json.MarshalIndent(v, "", " ") prints the reference's
configToRestore: the link's values before the ADD, only for the settings the ADD changed, keys in
the order mac, promisc, mtu, allmulti, txQLen. Same name, same bytes: the reference's DEL restores
from a file our ADD wrote and ours from one its ADD wrote (a binary swap under live pods).

Root writes here, so the directory must be root's alone (a planted symlink or file would be
followed or trusted): dataDir is walked from / without following a link, every component root's
and closed to group and others (a root-owned sticky dir such as /tmp passes as an ancestor),
missing ones made 0700 whatever the umask (cni.host.safedir); a dataDir that fails is refused
and nothing is written. The file is made, renamed and unlinked relative to the dir's fd, written
beside its final name and renamed into place (a crash leaves the old file or the new one, never
half of one).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from cni.host import safedir
from cni.host.safedir import UnsafeDir

DEFAULT_DATA_DIR = "/run/cni/tuning"


class Backup(NamedTuple):
    """The link's values before the ADD; None: the ADD did not touch that setting."""

    mac: str | None = None
    promisc: bool | None = None
    mtu: int | None = None
    allmulti: bool | None = None
    txqlen: int | None = None

    def to_json(self) -> str:
        """The reference's bytes: omitempty drops an empty mac and a zero mtu, as Go does."""
        body: dict[str, Any] = {}
        if self.mac:
            body["mac"] = self.mac
        if self.promisc is not None:
            body["promisc"] = self.promisc
        if self.mtu:
            body["mtu"] = self.mtu
        if self.allmulti is not None:
            body["allmulti"] = self.allmulti
        if self.txqlen is not None:
            body["txQLen"] = self.txqlen
        return json.dumps(body, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Backup | None:
        """As Go's decoder reads configToRestore (keys however cased, the last of a key wins);
        None for a file it could not decode (the reference then restores nothing)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        found: dict[str, Any] = {}
        for key, value in data.items():
            folded = key.lower()
            if folded in ("mac", "promisc", "mtu", "allmulti", "txqlen"):
                found[folded] = value
        mac, mtu, txqlen = found.get("mac"), found.get("mtu"), found.get("txqlen")
        promisc, allmulti = found.get("promisc"), found.get("allmulti")
        if mac is not None and not isinstance(mac, str):
            return None
        for number in (mtu, txqlen):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
                return None
        for flag in (promisc, allmulti):
            if flag is not None and not isinstance(flag, bool):
                return None
        return cls(mac or None, promisc, mtu or None, allmulti, txqlen)


def path(data_dir: str, container_id: str, ifname: str) -> str:
    """skel has refused a container ID or ifname that could leave the directory ('/', '..')."""
    return os.path.join(data_dir, _name(container_id, ifname))


def _name(container_id: str, ifname: str) -> str:
    return f"{container_id}_{ifname}.json"


def save(data_dir: str, container_id: str, ifname: str, backup: Backup) -> None:
    """Write the file (replacing one there); OSError or UnsafeDir if it cannot."""
    write_raw(data_dir, container_id, ifname, backup.to_json())


def read_raw(data_dir: str, container_id: str, ifname: str) -> str | None:
    """The file's text, None if there is none (or it is not ours to trust: cni.host.safedir)."""
    try:
        dir_fd = safedir.open_dir(data_dir, create=False)
    except (OSError, UnsafeDir):
        return None
    try:
        fd = os.open(_name(container_id, ifname), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    with open(fd, encoding="utf-8", errors="replace") as f:
        return f.read()


def write_raw(data_dir: str, container_id: str, ifname: str, text: str) -> None:
    """Write the file's text beside it and rename it into place, in the dir walked and opened
    (missing components made 0700)."""
    final = _name(container_id, ifname)
    tmp = f".{final}.tmp{os.getpid()}"
    dir_fd = safedir.open_dir(data_dir, create=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        try:
            with open(fd, "w") as f:
                f.write(text)
            os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink(dir_fd, tmp)
            raise
    finally:
        os.close(dir_fd)


def remove(data_dir: str, container_id: str, ifname: str) -> None:
    """Unlink the file; nothing if the dir is missing or not ours to trust."""
    try:
        dir_fd = safedir.open_dir(data_dir, create=False)
    except (OSError, UnsafeDir):
        return
    try:
        _unlink(dir_fd, _name(container_id, ifname))
    finally:
        os.close(dir_fd)


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
