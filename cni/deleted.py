"""Attachments a DEL has already cleaned, so that a repeated DEL costs nothing.

containerd 1.6 runs the whole DEL chain twice per pod: StopPodSandbox with the netns, then
RemovePodSandbox with an empty CNI_NETNS. The second finds nothing to remove, but paying for it
means a daemon round trip (or, without the daemon, pyroute2 and libnftables imports) per plugin.

So a DEL that succeeded leaves a marker `<plugin>@<containerID>@<ifname>` in MARKER_DIR (a
root-only tmpfs dir: gone at reboot), and an ADD of the same plugin for the same attachment
removes it before changing anything. A DEL with an empty CNI_NETNS that finds a fresh marker
answers success at once. The marker is trusted for TTL seconds only: a DEL with an empty netns
is the only DEL some runtimes send (ctr), and if another plugin set (the reference, after a swap)
ADDed the same attachment meanwhile, the marker would be stale; container IDs are unique per
sandbox in the CRI, and the TTL bounds the rest.

Stdlib only, and only `os`: the shim calls this before anything else is imported.
"""

import os

MARKER_DIR = "/run/pycni/deleted"
TTL = 600.0
# Pruning stats every marker (all DELs of the last TTL: ~2 ms a DEL with 400 of them), so it
# runs at most once a minute; `.pruned` (no marker name starts with a dot) says when it last did.
PRUNE_EVERY = 60.0
PRUNED = ".pruned"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _path(plugin: str, container_id: str, ifname: str) -> str | None:
    """The marker's path, or None when the names cannot make a safe single file name (then the
    fast path is simply not taken; skel reports bad names as it always does)."""
    if not container_id or not set(container_id) <= _ID_CHARS or container_id[0] in "_.-":
        return None
    if not ifname or ifname in (".", "..") or "/" in ifname or "\x00" in ifname:
        return None
    if not plugin or "/" in plugin or "@" in plugin or plugin.startswith("."):
        return None
    name = f"{plugin}@{container_id}@{ifname}"
    try:
        if len(name.encode()) > 255:
            return None
    except UnicodeEncodeError:
        return None
    return os.path.join(MARKER_DIR, name)


def already_clean(plugin: str, env, now: float) -> bool:
    """True for a DEL with an empty CNI_NETNS whose attachment a DEL cleaned < TTL ago. The
    config is not read: the answer would be success whatever it says. The variables skel requires
    for DEL must still be there (else skel reports them, as it would for any DEL)."""
    if env.get("CNI_COMMAND") != "DEL" or env.get("CNI_NETNS") or not env.get("CNI_PATH"):
        return False
    path = _path(plugin, env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", ""))
    if path is None:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return now - st.st_mtime < TTL and st.st_uid == 0 and (st.st_mode & 0o170000) == 0o100000


def mark(plugin: str, container_id: str, ifname: str, now: float) -> None:
    """After a DEL succeeded: record it, and drop markers older than the TTL (at most once
    every PRUNE_EVERY seconds). Best effort."""
    path = _path(plugin, container_id, ifname)
    if path is None:
        return
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _touch(path, now)
        stamp = os.path.join(folder, PRUNED)
        try:
            if 0 <= now - os.lstat(stamp).st_mtime < PRUNE_EVERY:
                return  # pruned lately (a stamp in the future: the clock went back, prune)
        except FileNotFoundError:
            pass
        _touch(stamp, now)
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime >= TTL:
                        os.unlink(entry.path)
                except OSError:
                    pass  # a concurrent DEL pruned it first
    except OSError:
        pass  # no marker only means the next empty-netns DEL does the full work


def _touch(path: str, now: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    os.utime(path, (now, now))


def forget(plugin: str, container_id: str, ifname: str) -> None:
    """Before an ADD changes anything: the attachment is no longer clean. A marker that cannot
    be removed fails the ADD (it would make a later DEL skip this attachment's cleanup)."""
    path = _path(plugin, container_id, ifname)
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # none there: the usual case
