"""Which host veth got a tbf from bandwidth's ADD, one small file per attachment, so DEL removes
that tbf without reading the config, and never a tbf bandwidth did not make.

The ingress tbf sits on a link bandwidth does not own (the main plugin's host veth) and a qdisc
carries no name or mark to tell whose it is: the ifb has its alias (cni.host.ifb), the tbf has
this record. DEL used to decide from the config's ingress limits, so a config it could not parse
(a changed or refused one) left the tbf on a host veth that stays; the reference's DEL never
removes it (it removes only the ifb).

The file is RECORD_DIR/<sha512(network, containerID, ifname)>, JSON: those three names, the host
veth's name and ifindex at ADD and the node's netns inode (a record is trusted in that netns only,
for a link of that index and name). It is written before the tbf is made (a kill in between
leaves a record of a tbf that is not there: DEL then finds no tbf on that link) and removed by
the ADD's undo, by DEL and by GC: bandwidth's GC of the record's network when its (containerID,
ifname) is not valid, and the GC of any network when its host veth is gone from this netns (the
tbf went with it; so the records of a network that no longer exists, whose GC never runs, go
too). /run is a tmpfs: after a reboot the veths are gone too.

A record is written in place, in one write(2) of its JSON (no temporary file, no fsync: /run is
a tmpfs, and the reference keeps no file at all). A writer killed mid-write leaves a strict
prefix of that JSON object, which lacks its closing brace and never parses: a record that might
be torn is never trusted (read as no record, by DEL and GC alike; the attachment's DEL, which
follows a failed ADD, removes it).
ADD and DEL touch that one file only, never the directory (its size grows with the pods).

Earlier versions wrote `<name>.tmp<pid>` and renamed it: a writer killed in between left that
file. It is never read as a record, and any GC removes it once its writer is dead (no process
has that pid; sweep_temporary).
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from cni.host.digest import sha512_hex

RECORD_DIR = "/run/pycni/bandwidth"
NAME_LENGTH = 40  # hex digits of the digest: a record's file name
_TMP = ".tmp"


class Shaped(NamedTuple):
    network: str
    container_id: str
    ifname: str
    veth: str
    index: int
    node: int  # the inode of the node's network namespace at ADD (a veth index is per netns)

    def here(self) -> bool:
        """Whether this record was made in the network namespace we run in."""
        return self.node == node_netns()


def node_netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def _path(network: str, container_id: str, ifname: str) -> str:
    # A digest: the file name is never built from the request's strings.
    return os.path.join(RECORD_DIR, _name(network, container_id, ifname))


def _name(network: str, container_id: str, ifname: str) -> str:
    return sha512_hex(f"{network}\0{container_id}\0{ifname}", NAME_LENGTH)


def _is_record(name: str) -> bool:
    return len(name) == NAME_LENGTH and all(c in "0123456789abcdef" for c in name)


def _temporary(name: str) -> tuple[str, int] | None:
    """(the record's name, the writer's pid) of a `<record>.tmp<pid>` file name, else None."""
    record, sep, pid = name.partition(_TMP)
    if not sep or not _is_record(record) or not pid.isdigit() or not pid.isascii():
        return None
    return record, int(pid)


def _alive(pid: int) -> bool:
    """Whether a process has this pid (ours included). A live pid may be another process that
    reused a dead writer's: its file waits for a later sweep, which is harmless."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such pid, or none could be
        return False
    except OSError:  # EPERM: someone's process, alive
        return True
    return True


def sweep_temporary(record: str | None = None) -> int:
    """Remove the temporary files of dead writers (of one record's name, or all); -> how many.
    A live writer's file is left: it is about to be renamed over its record."""
    try:
        names = os.listdir(RECORD_DIR)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        tmp = _temporary(name)
        if tmp is None or (record is not None and tmp[0] != record) or _alive(tmp[1]):
            continue
        try:
            os.unlink(os.path.join(RECORD_DIR, name))  # unlink never follows a symlink
            removed += 1
        except FileNotFoundError:
            pass  # another sweep was first
    return removed


def remember(network: str, container_id: str, ifname: str, veth: str, index: int) -> None:
    """Record the tbf about to be made on `veth` (ifindex `index`); raises OSError if it cannot
    (the ADD fails before it made the tbf: a tbf without its record would outlive a DEL)."""
    body = json.dumps({"network": network, "containerID": container_id, "ifname": ifname,
                       "veth": veth, "index": index, "node": node_netns()}).encode()
    path = _path(network, container_id, ifname)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:  # the first record since boot: no directory yet
        os.makedirs(RECORD_DIR, mode=0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(body)
        while view:  # one write for a record's size; a short one is continued, as f.write does
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def recall(network: str, container_id: str, ifname: str) -> Shaped | None:
    return _read(_path(network, container_id, ifname))


def forget(network: str, container_id: str, ifname: str) -> None:
    try:
        os.unlink(_path(network, container_id, ifname))
    except FileNotFoundError:
        pass


def listed() -> list[Shaped]:
    """Every readable record (never a temporary file)."""
    try:
        names = sorted(os.listdir(RECORD_DIR))
    except FileNotFoundError:
        return []
    out = []
    for name in filter(_is_record, names):
        record = _read(os.path.join(RECORD_DIR, name))
        if record is not None:
            out.append(record)
    return out


def _read(path: str) -> Shaped | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return Shaped(str(data["network"]), str(data["containerID"]), str(data["ifname"]),
                      str(data["veth"]), int(data["index"]), int(data["node"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, or not ours to read: DEL falls back as without a record
