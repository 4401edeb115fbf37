"""One request at a time per attachment (container ID, ifname), across processes.

The daemon's queue holds a request while one for its attachment runs, but only among its own
jobs: during a handover the old daemon still runs what it accepted while the successor starts
new requests, and the shim's in-process fallback runs beside either. So whatever runs a verb
(the daemon's child, the shim in-process) first takes an flock on
/run/pycni/attach/<container ID>.<ifname in hex>.lock (in the caller's mount namespace, where
both run), waits for it up to the daemon's request timeout (then error 11, nothing run), and
drops it before the reply is sent. A DEL that succeeded removes the file while it holds it (a
pod leaves no file behind); a waiter that then gets the lock on the removed file sees that the
path no longer names its file and takes the lock again on a new one.

Taken at the process boundary, not in skel.run: skel.run is also how bridge runs our own
host-local in-process (same process, same attachment), and it stays pure. An IPAM plugin bridge
execs (a wrapper script around our host-local) is a separate process on the same attachment
while bridge holds the lock: the holder puts ENV ("pid:dev:inode" of itself and the lock file)
in the environment of what it runs, and a request that finds the lock taken skips it when that
names this very file and a holder that is the request's caller or one of its ancestors. The
daemon's child checks the ancestry from its caller (SO_PEERCRED, in the daemon's own /proc) and
then names itself as the holder (vouch); the server lets such a nested call past its queue too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from cni.host import lockfile
from cni.host.errors import Busy  # the attachment's lock stayed taken for the whole wait
from cni.spec import names

LOCK_DIR = "/run/pycni/attach"
ENV = "PYCNI_ATTACHMENT_LOCK"
WAIT = 120.0  # in-process: the daemon's default request timeout (state.Options.timeout)
COMMANDS = ("ADD", "CHECK", "DEL")  # GC and STATUS have no attachment
_MAX_CID = 200  # longer container IDs are hashed: a file name has 255 bytes
_ANCESTRY = 64  # a bounded walk up the parent chain


class Lock(NamedTuple):
    fd: int | None  # None: a caller of ours holds it (a nested call)
    path: str
    token: str  # ENV's value for what the verb runs


def run(runner: Callable[..., Any], plugin: str, env: dict[str, str], stdin: bytes,
        netns: int | None = None, wait: float = WAIT) -> Any:
    """runner(plugin, env, stdin, netns) (skel.run's shape) with the attachment's lock held."""
    path = lock_path(env)
    if path is None:
        return runner(plugin, env, stdin, netns)
    try:
        lock = acquire(path, env.get(ENV, ""), wait)
    except Busy:
        from cni import skel
        from cni.fast import protocol as proto
        msg = (f"another request on container {env['CNI_CONTAINERID']} interface "
               f"{env['CNI_IFNAME']} still runs after {wait:g}s; try again later")
        return skel.Reply(proto.error_reply(proto.TRY_AGAIN_LATER, msg, stdin), b"", 1)
    except OSError:
        return runner(plugin, env, stdin, netns)  # no lock file possible (not root): as before
    try:
        reply = runner(plugin, {**env, ENV: lock.token}, stdin, netns)
        if lock.fd is not None and env["CNI_COMMAND"] == "DEL" and reply.code == 0:
            _remove(lock.path)  # held: no one else can be using this path's file now
        return reply
    finally:
        if lock.fd is not None:
            os.close(lock.fd)


def lock_path(env: dict[str, str]) -> str | None:
    """The lock file of the request's attachment; None for a verb without one, or names skel
    refuses (code 4: nothing will run). Nothing unvalidated reaches the path."""
    if env.get("CNI_COMMAND") not in COMMANDS:
        return None
    cid, ifname = env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", "")
    if not names.valid_id(cid) or names.ifname_problem(ifname) is not None:
        return None
    if len(cid) > _MAX_CID:
        import hashlib
        cid = hashlib.sha256(cid.encode()).hexdigest()
    return f"{LOCK_DIR}/{cid}.{ifname.encode().hex()}.lock"


def acquire(path: str, token: str, wait: float) -> Lock:
    """The lock on `path`, or Lock(None) when a caller of ours holds it; Busy after `wait`."""
    deadline = time.monotonic() + wait
    while True:
        fd = lockfile.open_file(path)
        try:
            st = os.fstat(fd)
            if not lockfile.try_lock(fd):
                if _held_by_caller(token, st):
                    os.close(fd)
                    return Lock(None, path, token)
                # Contention is rare: the daemon's queue serializes its own requests; this
                # waits out the other daemon's, or the fallback's
                if not lockfile.wait_lock(fd, deadline):
                    raise Busy(path)
            if _current(st, path):
                return Lock(fd, path, f"{os.getpid()}:{st.st_dev}:{st.st_ino}")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a DEL removed it while we waited: again, on the file the path names now


def holder(token: str) -> int:
    """The pid an ENV value names as the lock's holder; 0 if it names none."""
    pid = token.partition(":")[0]
    return int(pid) if pid.isdigit() else 0


def vouch(env: dict[str, str], caller: Callable[[], int]) -> None:
    """The daemon's child, before it enters the caller's mount namespace (its /proc is the
    daemon's): ENV stays, naming this process, only if its holder is the caller (`caller()`,
    its pid) or an ancestor of it; else it goes."""
    token = env.get(ENV)
    if token is None:
        return
    pid = holder(token)
    if pid and descends_from(caller(), pid):
        env[ENV] = f"{os.getpid()}:{token.partition(':')[2]}"
    else:
        del env[ENV]


def descends_from(pid: int, ancestor: int) -> bool:
    from cni.fast.procs import parent
    for _ in range(_ANCESTRY):
        if pid == ancestor:
            return True
        pid = parent(pid)
        if pid <= 1:
            return False
    return False


def _held_by_caller(token: str, st: os.stat_result) -> bool:
    pid, _, rest = token.partition(":")
    if rest != f"{st.st_dev}:{st.st_ino}" or not pid.isdigit():
        return False  # no token, or another file's (another attachment, or one since removed)
    return int(pid) == os.getpid() or descends_from(os.getpid(), int(pid))


def _current(st: os.stat_result, path: str) -> bool:
    """Whether `path` still names the file locked (a DEL removes it while holding it)."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
