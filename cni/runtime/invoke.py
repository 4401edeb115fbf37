"""Exec one plugin the way libcni's pkg/invoke does: find it in CNI_PATH, set the CNI_* env on
top of ours, feed the config on stdin, read the result or the error JSON from stdout.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any, NamedTuple

from cni.spec import result as results
from cni.spec.errors import CNIError, Code
from cni.spec.version import CURRENT, SUPPORTED, parse

# A plugin being replaced on disk fails with ETXTBSY for a moment; libcni retries like this.
_BUSY_RETRIES = 5


class Args(NamedTuple):
    """The per-exec parameters (libcni invoke.Args) that become CNI_* variables."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    cni_args: Sequence[tuple[str, str]] = ()
    path: Sequence[str] = ()

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Our environment plus the CNI_* variables; ours win over inherited ones."""
        env = dict(os.environ if base is None else base)
        env.update({
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_ARGS": ";".join(f"{k}={v}" for k, v in self.cni_args),
            "CNI_IFNAME": self.ifname,
            "CNI_PATH": os.pathsep.join(self.path),
        })
        return env


def find_in_path(plugin: str, paths: list[str]) -> str:
    """The first regular file called `plugin` in `paths` (libcni FindInPath)."""
    if not paths:
        raise CNIError(Code.UNKNOWN, "no paths provided")
    if not plugin:
        raise CNIError(Code.UNKNOWN, "no plugin name provided")
    if os.sep in plugin:
        raise CNIError(Code.UNKNOWN, f"invalid plugin name: {plugin}")
    for directory in paths:
        candidate = os.path.join(directory, plugin)
        try:
            if os.path.isfile(candidate):
                return candidate
        except OSError:
            continue
    raise CNIError(Code.UNKNOWN, f'failed to find plugin "{plugin}" in path [{" ".join(paths)}]')


def exec_plugin(plugin_path: str, stdin: bytes, env: dict[str, str],
                stderr: IO[str] | None = None) -> bytes:
    """Run the plugin; its stdout on success, or the CNIError it reported.

    The plugin's stderr goes to `stderr` (ours by default), as libcni's RawExec does.
    """
    import subprocess  # here: bridge imports this module for its in-process IPAM too (~2.5 ms)

    proc = None
    for attempt in range(_BUSY_RETRIES + 1):
        try:
            proc = subprocess.run([plugin_path], input=stdin, env=env, capture_output=True,
                                  check=False)
            break
        except OSError as e:
            if e.errno == errno.ETXTBSY and attempt < _BUSY_RETRIES:
                time.sleep(1)
                continue
            raise CNIError(Code.UNKNOWN, f"netplugin failed with no error message: {e}") from None
    assert proc is not None
    if proc.returncode != 0:
        raise plugin_error(proc.returncode, proc.stdout, proc.stderr)
    if proc.stderr:
        print(proc.stderr.decode(errors="replace"), end="", file=stderr or sys.stderr)
    return proc.stdout


def plugin_error(returncode: int, stdout: bytes, stderr: bytes) -> CNIError:
    """The error a failed plugin reported: its stdout JSON, else its stderr text."""
    status = f"exit status {returncode}" if returncode > 0 else f"signal: {-returncode}"
    if not stdout.strip():
        if not stderr.strip():
            return CNIError(Code.UNKNOWN, f"netplugin failed with no error message: {status}")
        return CNIError(Code.UNKNOWN,
                        f"netplugin failed: {_quote(stderr)}")
    try:
        data = json.loads(stdout)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        code = data.get("code", 0)
        return CNIError(int(code) if isinstance(code, int) else 0, str(data.get("msg", "")),
                        str(data.get("details", "") or ""))
    except ValueError as e:
        text = _quote(stdout)
        return CNIError(Code.UNKNOWN,
                        f"netplugin failed but error parsing its diagnostic message {text}: {e}")


def _quote(raw: bytes) -> str:
    """Close to Go's %q: double-quoted, escapes for controls, printable Unicode kept."""
    return json.dumps(raw.decode(errors="replace"), ensure_ascii=False)


def decode_result(stdout: bytes, conf_version: str) -> tuple[dict[str, Any], str]:
    """A plugin's ADD output -> (canonical result, the version it was printed in).

    A result without cniVersion is taken to be of the config's version (libcni
    fixupResultVersion).
    """
    try:
        raw = json.loads(stdout)
    except ValueError as e:
        raise CNIError(Code.DECODING_FAILURE, f"failed to unmarshal raw result: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CNIError(Code.DECODING_FAILURE, "failed to unmarshal raw result: not an object")
    version = raw.get("cniVersion")
    if not isinstance(version, str) or not version:
        version = conf_version or "0.1.0"
    if version not in SUPPORTED:
        raise CNIError(Code.INCOMPATIBLE_VERSION, f'unsupported CNI result version "{version}"')
    return results.to_current(raw, version), version


def version_info(plugin_path: str, stderr: IO[str] | None = None) -> dict[str, Any]:
    """The plugin's VERSION answer: {"cniVersion", "supportedVersions"} (libcni GetVersionInfo)."""
    args = Args("VERSION", netns="dummy", ifname="dummy", path=["dummy"])
    stdin = json.dumps({"cniVersion": CURRENT}, separators=(",", ":")).encode()
    try:
        out = exec_plugin(plugin_path, stdin, args.env(), stderr=stderr)
    except CNIError as e:
        if e.msg == "unknown CNI_COMMAND: VERSION":
            return {"cniVersion": "0.1.0", "supportedVersions": ["0.1.0"]}
        raise
    try:
        info = json.loads(out)
    except ValueError as e:
        raise CNIError(Code.DECODING_FAILURE, f"decoding version info: {e}") from None
    if not isinstance(info, dict) or not info.get("cniVersion"):
        raise CNIError(Code.DECODING_FAILURE, "decoding version info: missing field cniVersion")
    versions = info.get("supportedVersions")
    if parse(info["cniVersion"]) < (0, 3, 0) and not versions:
        versions = ["0.1.0", "0.2.0"] if info["cniVersion"] == "0.2.0" else ["0.1.0"]
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise CNIError(Code.DECODING_FAILURE, "decoding version info: bad supportedVersions")
    return {"cniVersion": info["cniVersion"], "supportedVersions": versions}
