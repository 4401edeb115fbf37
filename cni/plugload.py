"""Loading another package's plugin (cni.registry's entry points) so that its faults stay its own.

Before the daemon, install, doctor or the in-process path imports an entry-point plugin here:

- its files are checked (check_files): the site dir it is found in, its module (a file, or a
  package's dir and every file under it), its dist-info dir and files, and the other files its
  distribution's RECORD lists in the site dirs must be root's and
  writable by root alone (cni.install.trust's rule), else it is refused naming the path, owner
  and mode. The module is looked up in the site dirs only, and must be the one this process's
  import would find (not shadowed by an entry of sys.path before them);
- its import (and a class's instantiation) is tried in a short-lived child (probe): this
  interpreter with -I -S, cwd /, only the site dirs and pycni's own dir on its path. A child that
  does not answer within PROBE_TIMEOUT is killed; one that crashes (a signal), exits, raises,
  starts a thread, or leaves its namespaces, cwd, umask or environment changed is refused by
  name with why. The children run at once, so the deadline bounds the whole check.

Only what passes is imported in-process. The findings are kept in cni.registry.REFUSED (the
daemon's status query, `pycni doctor`, the requests for it: error 50 naming why).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from cni import registry

PROBE_TIMEOUT = 15.0  # seconds an import may take in the probe child (pydantic models: ~1 s)
PYCNI_DIR = str(Path(__file__).resolve().parent.parent)  # where `cni` is (a checkout, a site)

# Run by the probe child: argv = target, then the dirs of its sys.path (before the stdlib's).
PROBE = r"""
import sys
sys.path[0:0] = sys.argv[2:]
import importlib, json, os
def state():
    out = {}
    for kind in ("net", "mnt", "uts", "ipc", "pid", "user", "cgroup"):
        try:
            out[kind + " namespace"] = os.stat(f"/proc/thread-self/ns/{kind}").st_ino
        except OSError:
            pass
    mask = os.umask(0o022); os.umask(mask)
    return {**out, "cwd": os.getcwd(), "umask": mask, "environment": dict(os.environ),
            "threads": len(os.listdir("/proc/self/task"))}
before = state()
report = {}
try:
    name, _, attr = sys.argv[1].partition(":")
    obj = importlib.import_module(name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()
    first = getattr(obj, "SUPPORTED_FROM", None)
    report["supported_from"] = first if isinstance(first, str) else ""
except BaseException as e:
    report["error"] = f"{type(e).__name__}: {e}"
after = state()
report["changed"] = [k for k in before if before[k] != after[k]]
sys.stdout.write("\n" + json.dumps(report))
sys.stdout.flush()
os._exit(0)
"""


class Refused(Exception):
    """An entry-point plugin not to be imported here; the message says why."""


def check_files(name: str, target: str, sites: list[str]) -> str:
    """Refused unless the module `target` names (found in `sites` only) and the dist-info of the
    distribution declaring `name` are root's alone; -> the module's path."""
    import pkgutil

    from cni.host.safewalk import Untrusted, check_tree, walk

    top = target.partition(":")[0].split(".")[0]
    # Where `top` is in the site dirs alone (the first of them that has it), found, not imported.
    found = next((m for m in pkgutil.iter_modules(sites) if m.name == top), None)
    spec = found.module_finder.find_spec(top) if found else None
    if spec is None or spec.origin is None and not spec.submodule_search_locations:
        raise Refused(f"module {top} is not in the site dirs {', '.join(sites)}")
    try:
        locations = list(spec.submodule_search_locations or [])
        for where in locations:  # a package: its dir and every file under it
            check_tree(Path(where), f"plugin {name}'s package")
        if not locations:
            walk(spec.origin, f"plugin {name}'s module")
        dist = registry.DISTS.get(name)
        info = getattr(dist, "_path", None)
        if info is not None:
            check_tree(Path(info), f"plugin {name}'s dist-info")
        for path in _recorded(dist, sites):  # its other modules too (RECORD)
            walk(path, f"plugin {name}'s file")
    except Untrusted as e:
        raise Refused(str(e)) from None
    path = locations[0] if locations else spec.origin
    from importlib.util import find_spec

    here = sys.modules.get(top)
    mine = getattr(here, "__spec__", None) if here is not None else find_spec(top)
    mine_at = (list(mine.submodule_search_locations or [])[:1] or [mine.origin]) if mine else []
    if mine is not None and os.path.realpath(mine_at[0] or "") != os.path.realpath(path):
        raise Refused(f"module {top} would be imported from {mine_at[0]}, not from the site "
                      f"dir's {path} (an entry of sys.path before the site dirs)")
    return path


def _recorded(dist: object, sites: list[str]) -> list[str]:
    """The files a distribution's RECORD lists inside the site dirs (that exist)."""
    out = []
    inside = [os.path.abspath(d) + "/" for d in sites]
    for f in getattr(dist, "files", None) or []:
        path = os.path.abspath(str(f.locate()))
        if any(path.startswith(d) for d in inside) and os.path.lexists(path):
            out.append(path)
    return out


def probe(targets: dict[str, str], sites: list[str], python: str | None = None,
          timeout: float | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Each target's import tried in its own child, all at once; -> (name -> its
    SUPPORTED_FROM or "", for those that imported cleanly; name -> why, for the others)."""
    import subprocess

    timeout = PROBE_TIMEOUT if timeout is None else timeout
    path = [*sites, *([PYCNI_DIR] if PYCNI_DIR not in sites else [])]
    procs: dict[str, subprocess.Popen] = {}
    refused: dict[str, str] = {}
    for name, target in targets.items():
        try:
            procs[name] = subprocess.Popen(
                [python or sys.executable, "-I", "-S", "-c", PROBE, target, *path],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd="/", env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
                start_new_session=True)
        except OSError as e:
            refused[name] = f"cannot try importing {target}: {e}"
    deadline = time.monotonic() + timeout
    ok: dict[str, str] = {}
    for name, proc in procs.items():
        target = targets[name]
        try:
            # past the deadline (one before it hung), a child that is done is still read
            out, err = proc.communicate(timeout=max(0.5, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            refused[name] = f"importing {target} did not finish within {timeout:g}s"
            continue
        finally:
            _kill(proc)  # and whatever it left in its session
        why = _judge(target, proc.returncode, out, err)
        if why is None:
            ok[name] = _report(out)["supported_from"]
        else:
            refused[name] = why
    return ok, refused


def _judge(target: str, code: int, out: bytes, err: bytes) -> str | None:
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return f"importing {target} crashed the process ({sig})"
    try:
        report = _report(out)
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:]
        return (f"importing {target} ended the process (exit code {code})"
                + (f": {tail[0]}" if tail else ""))
    if "error" in report:
        return f"importing {target} failed: {report['error']}"
    if report["changed"]:
        return (f"importing {target} changed the process's {', '.join(report['changed'])}"
                f" (a plugin's import must leave it as it found it)")
    return None


def _report(out: bytes) -> dict:
    """The probe's report: its last line (the plugin may have printed before it)."""
    report = json.loads(out.rsplit(b"\n", 1)[-1])
    if not isinstance(report, dict) or "changed" not in report:
        raise ValueError("no report")
    return report


def _kill(proc) -> None:  # a subprocess.Popen
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def vet(found: dict[str, str], sites: list[str], python: str | None = None
        ) -> tuple[dict[str, str], dict[str, str]]:
    """check_files, then probe, for each of `found` (name -> target); -> (name -> its
    SUPPORTED_FROM, for those to import; name -> why, for the refused)."""
    refused: dict[str, str] = {}
    passed: dict[str, str] = {}
    for name, target in found.items():
        try:
            check_files(name, target, sites)
        except Refused as e:
            refused[name] = str(e)
        else:
            passed[name] = target
    ok, failed = probe(passed, sites, python)
    return ok, {**refused, **failed}


def vet_one(plugin: str, target: str) -> None:
    """The in-process path's check before it imports an entry-point plugin; Refused."""
    _, refused = vet({plugin: target}, registry.site_dirs())
    if plugin in refused:
        registry.REFUSED[plugin] = refused[plugin]
        raise Refused(refused[plugin])
