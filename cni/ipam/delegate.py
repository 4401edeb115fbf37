"""Delegation to an IPAM plugin, as the spec has a main plugin do it.

The IPAM plugin gets the caller's stdin and environment with CNI_COMMAND set to the verb. When the
plugin found in CNI_PATH is our own multi-call executable it runs in-process (no exec, no second
interpreter start-up); anything else is exec'd. Both paths answer the same: an in-process ADD
result goes through the same version conversion an exec'd plugin's stdout would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from cni.skel import Request
from cni.spec.errors import CNIError, Code
from cni.spec.result import Result, from_current, to_current

MARKER = b"pycni-multicall"
_MULTICALL = (Path(__file__).resolve().parent.parent.parent / "bin" / "cni-plugin").resolve()
_VERBS = {"ADD": "add", "CHECK": "check", "DEL": "delete", "GC": "gc", "STATUS": "status"}


def add(req: Request, ipam_type: str) -> Result:
    out = _invoke(req, ipam_type, "ADD")
    if out is None:
        raise CNIError(Code.INTERNAL, f"IPAM plugin {ipam_type} returned no result")
    return out


def check(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "CHECK")


def delete(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "DEL")


def gc(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "GC")


def status(req: Request, ipam_type: str) -> None:
    _invoke(req, ipam_type, "STATUS")


def find(ipam_type: str, path: list[str]) -> str:
    """The first executable named `ipam_type` in `path` (the reference's FindInPath)."""
    validate_type(ipam_type)
    for directory in path:
        candidate = os.path.join(directory, ipam_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CNIError(Code.INVALID_CONFIG,
                   f'failed to find plugin "{ipam_type}" in path {_go_list(path)}')


def validate_type(ipam_type: Any) -> None:
    """A type is a file name, never a path: it must not reach outside CNI_PATH."""
    if (not isinstance(ipam_type, str) or not ipam_type or "/" in ipam_type
            or "\0" in ipam_type or ".." in ipam_type or ipam_type == "."):
        raise CNIError(Code.INVALID_CONFIG,
                       f"invalid ipam.type {json.dumps(ipam_type)}: not a plugin name")


def is_ours(executable: str) -> bool:
    """Our multi-call executable (the repo's, or an installed copy carrying the marker)."""
    try:
        if Path(executable).resolve() == _MULTICALL:
            return True
        with open(executable, "rb") as f:
            return MARKER in f.read(1024)
    except OSError:
        return False


def _invoke(req: Request, ipam_type: str, command: str) -> Result | None:
    executable = find(ipam_type, req.path)
    if is_ours(executable):
        return _in_process(req, ipam_type, command)
    return _exec(req, executable, command)


def _in_process(req: Request, ipam_type: str, command: str) -> Result | None:
    from cni import skel
    from cni.spec import version as versions

    module = skel.load(ipam_type)
    # The same version gate the exec'd plugin's skel would apply.
    versions.require_supported(req.version, versions.SUPPORTED)
    env = {**req.env, "CNI_COMMAND": command}
    child = Request(
        plugin=ipam_type, command=command, container_id=req.container_id, netns=req.netns,
        ifname=req.ifname, args=list(req.args), path=list(req.path), config=req.config,
        version=req.version, stdin=req.stdin, env=env, netns_fd=req.netns_fd,
        prev_result=req.prev_result, log=req.log,
    )
    fn = getattr(module, _VERBS[command], None)
    if fn is None:
        if command in ("GC", "STATUS"):
            return None
        raise CNIError(Code.INTERNAL, f"{ipam_type} has no {command}")
    result = fn(child)
    if command != "ADD":
        return None
    # Exactly what an exec'd plugin would print for this version, read back.
    return to_current(from_current(result, req.version), req.version)


def _exec(req: Request, executable: str, command: str) -> Result | None:
    env = {**req.env, "CNI_COMMAND": command}
    try:
        proc = subprocess.run([executable], input=req.stdin, env=env, capture_output=True,
                              check=False)
    except OSError as e:
        raise CNIError(Code.INTERNAL, f"failed to exec {executable}: {e}") from None
    if proc.returncode != 0:
        raise _error_from(executable, proc.stdout, proc.stderr)
    if command != "ADD":
        return None
    try:
        obj = json.loads(proc.stdout)
    except (ValueError, UnicodeDecodeError):
        raise CNIError(Code.DECODING_FAILURE,
                       f"failed to parse IPAM result from {executable}: "
                       f"{_quote(proc.stdout)}") from None
    return to_current(obj, req.version)


def _error_from(executable: str, stdout: bytes, stderr: bytes) -> CNIError:
    """The plugin's own error (code, msg, details), as libcni reads it: stdout, else stderr."""
    raw = stdout if stdout.strip() else stderr
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("code"), int) and "msg" in obj:
        return CNIError(obj["code"], str(obj.get("msg", "")), str(obj.get("details") or ""))
    if not raw.strip():
        return CNIError(Code.INTERNAL, f"netplugin {executable} failed with no error message")
    return CNIError(Code.INTERNAL, f"netplugin {executable} failed: {_quote(raw)}")


def _quote(raw: bytes, limit: int = 1000) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return json.dumps(text[:limit] + ("..." if len(text) > limit else ""))


def _go_list(items: list[str]) -> str:
    return "[" + " ".join(items) + "]"
