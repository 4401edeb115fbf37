"""Delegation to an IPAM plugin, as the spec has a main plugin do it (the reference's pkg/ipam).

The IPAM plugin gets the caller's stdin and environment with CNI_COMMAND set to the verb. When the
plugin found in CNI_PATH is our own multi-call executable, skel.run runs it in-process (no exec,
no second interpreter start-up); anything else is exec'd by the runtime's own exec code
(cni.runtime.invoke, as libcni). Another package's plugin (an entry point) runs in a forked child
with a deadline (run_forked, below): its hang is error 11, its crash 999, and the main
plugin's namespaces, cwd and environment are untouched by it. Both paths then read the same
bytes the same way: the plugin's stdout, its error JSON, its result converted from the version
it printed.
"""

from __future__ import annotations

import functools
import io
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cni import registry, skel
from cni.runtime import invoke
from cni.skel import Request
from cni.spec.errors import CNIError, Code
from cni.spec.result import Result

MARKER = b"pycni-multicall"
# `pycni install --forwarder`'s binary (forwarder/): it relays to this daemon, so the IPAM
# plugin it stands for runs in-process as the multi-call's would; known by its name.
FORWARDER = "pycni-forwarder"
# A checkout's bin/cni-plugin, known by its path without a read; installed copies (and this path
# under site-packages, where no such file is) are known by their marker.
_MULTICALL = (Path(__file__).resolve().parent.parent.parent / "bin" / "cni-plugin").resolve()


def add(req: Request, ipam_type: str) -> Result:
    """The IPAM plugin's result. When the plugin succeeded (so it may have reserved) but its
    answer cannot be used, its DEL runs before the error: the caller undoes a reservation only
    once it holds a result."""
    stdout = _invoke(req, ipam_type, "ADD")
    try:
        if not stdout.strip():
            raise CNIError(Code.INTERNAL, f"IPAM plugin {ipam_type} returned no result")
        result, _ = invoke.decode_result(stdout, req.version)
    except CNIError:
        try:
            delete(req, ipam_type)
        except Exception as e:  # the unusable answer is the error to report
            req.log(f"releasing the IPAM reservation failed: {e}")
        raise
    return result


def check(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "CHECK")


def delete(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "DEL")


def delete_lenient(req: Request, ipam_type: Any) -> None:
    """DEL of a main plugin's IPAM when the config may be one ADD refused: a type that is no
    plugin name, or no plugin in CNI_PATH, cannot have reserved anything; skip it, say so."""
    try:
        find(ipam_type, req.path)
    except CNIError as e:
        req.log(f"DEL: IPAM skipped: {e.msg}")
        return
    delete(req, ipam_type)


def gc(req: Request, ipam_type: str) -> int:
    """-> objects our in-process IPAM's GC removed (0 for an exec'd one: it does not say)."""
    removed = _invoke(req, ipam_type, "GC", removed=True)
    return removed if isinstance(removed, int) else 0


def status(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "STATUS")


def find(ipam_type: str, path: list[str]) -> str:
    """The first file named `ipam_type` in `path` (the reference's FindInPath); config error 7."""
    validate_type(ipam_type)
    try:
        return invoke.find_in_path(ipam_type, path)
    except CNIError as e:
        raise CNIError(Code.INVALID_CONFIG, e.msg) from None


def validate_type(ipam_type: Any) -> None:
    """A type is a file name, never a path: it must not reach outside CNI_PATH."""
    if (not isinstance(ipam_type, str) or not ipam_type or "/" in ipam_type
            or "\0" in ipam_type or ".." in ipam_type or ipam_type == "."):
        raise CNIError(Code.INVALID_CONFIG,
                       f"invalid ipam.type {json.dumps(ipam_type)}: not a plugin name")


def is_ours(executable: str) -> bool:
    """Our multi-call executable (the repo's, or an installed copy carrying the marker).
    Remembered for the path while neither it (a symlink re-pointed) nor the file it leads to
    (replaced, rewritten: its inode, size and times) changes: a spare asks it for every IPAM
    call of the bridge plugin, and the answer is a path resolution and a read (~70 us of a
    CHECK in a spare). The repo's executable carries the marker too, so the answer is the
    file's, whichever path leads to it."""
    try:
        link, target = os.lstat(executable), os.stat(executable)
    except OSError:
        return _is_ours(executable)
    return _is_ours_at(executable, _identity(link), _identity(target))


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@functools.lru_cache(maxsize=16)  # the IPAM plugins found in a runtime's few CNI_PATHs
def _is_ours_at(executable: str, link: tuple[int, ...], target: tuple[int, ...]) -> bool:
    return _is_ours(executable)


def _is_ours(executable: str) -> bool:
    try:
        real = Path(executable).resolve()
        if real == _MULTICALL or real.name == FORWARDER:
            return True
        with open(executable, "rb") as f:
            return MARKER in f.read(1024)
    except OSError:
        return False


def _invoke(req: Request, ipam_type: str, command: str, removed: bool = False) -> Any:
    executable = find(ipam_type, req.path)
    env = {**req.env, "CNI_COMMAND": command}
    if is_ours(executable):
        if command == req.command == "CHECK":  # its own verb: skel has read and checked this
            def call() -> skel.Reply:
                return skel.run_nested(req, ipam_type)  # input for the main plugin already
        else:
            def call() -> skel.Reply:
                return skel.run(ipam_type, env, req.stdin, req.netns_fd)
        if ipam_type in registry.PLUGINS:
            reply = call()
        else:  # another package's: its faults and what it leaves changed stay in a child
            reply = run_forked(call, f"IPAM plugin {ipam_type}")
        _log(req, reply.stderr.decode("utf-8", "replace"))
        if reply.code != 0:
            raise invoke.plugin_error(reply.code, reply.stdout, reply.stderr)
        if removed:
            return reply.removed
        stdout = reply.stdout
    else:
        logged = io.StringIO()  # the plugin's stderr joins ours (skel.run prints nothing)
        try:
            stdout = invoke.exec_plugin(executable, req.stdin, env, stderr=logged)
        finally:
            _log(req, logged.getvalue())
    return stdout  # add() decodes ADD's; the other verbs print nothing we read


def _log(req: Request, text: str) -> None:
    for line in text.splitlines():
        req.log(line)


NESTED_TIMEOUT = 60.0  # an entry-point IPAM's call inside its main plugin (under --timeout's 120)


# The modules that keep sockets or contexts in a process (a daemon's spare: preload), each with
# its forget_inherited for a forked child
_KEEPERS = ("cni.host.netns", "cni.host.nft", "cni.host.nftrecord", "cni.host.conntrack")


def _own_sockets() -> None:
    """In run_forked's child: the IPAM makes its own netlink sockets and nftables contexts; the
    parent's are the same kernel sockets here, and what the child leaves unread on one (killed
    mid-request) the parent would read next."""
    for name in _KEEPERS:
        module = sys.modules.get(name)
        if module is not None:
            module.forget_inherited()


def run_forked(call: Callable[[], skel.Reply], what: str,
               timeout: float | None = None) -> skel.Reply:
    """skel.Reply of call() run in a forked child of this process, with a deadline: a nested
    entry-point IPAM's hang, crash, exit, or the namespace, cwd or environment it leaves changed,
    stay in that child. CNI error 11 when it overruns, 999 when it dies without an answer."""
    timeout = NESTED_TIMEOUT if timeout is None else timeout
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            _own_sockets()
            reply = call()
            data = json.dumps([reply.code, reply.removed, reply.stdout.decode("latin-1"),
                               reply.stderr.decode("latin-1")]).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline, overran = [], time.monotonic() + timeout, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                overran = True
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if overran:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if overran:
        raise CNIError(Code.TRY_AGAIN_LATER, f"{what} did not answer within {timeout:g}s")
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise CNIError(Code.INTERNAL, f"{what} crashed ({sig})")
    try:
        code, removed, out, err = json.loads(b"".join(chunks))
    except ValueError:
        raise CNIError(Code.INTERNAL, f"{what} ended without an answer (exit code "
                       f"{os.waitstatus_to_exitcode(status)})") from None
    return skel.Reply(out.encode("latin-1"), err.encode("latin-1"), code, removed)
