"""Test helpers: throwaway namespaces, exec'ing plugins like a runtime, reading kernel state.

Each netns test gets its own "host" namespace (where bridges, nft rules and host veths live) and
pod namespaces; nothing runs in the machine's real network namespace.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"


def forwarder_bin() -> Path:
    """build/forwarder-bin: `pycni install --forwarder` of this checkout (the binary built now),
    the plugin names there linking to pycni-forwarder."""
    subprocess.run(["make", "-s", "forwarder"], cwd=ROOT, check=True, timeout=900)
    from cni import install

    bin_dir, old = ROOT / "build" / "forwarder-bin", os.environ.get("PYCNI_SOCKET")
    os.environ["PYCNI_SOCKET"] = str(bin_dir / "none.sock")  # install asks no daemon of ours
    try:
        install.install(bin_dir, None, None, compile_bytecode=False, use_forwarder=True)
    finally:
        os.environ.pop("PYCNI_SOCKET") if old is None else os.environ.update(PYCNI_SOCKET=old)
    return bin_dir


# The plugins' executables. PYCNI_TEST_FORWARDER=1 execs them through pycni-forwarder instead:
# the reliability runs through it (`PYCNI_TEST_FORWARDER=1 ./scripts/test.sh tests/reliability`).
BIN = forwarder_bin() if os.environ.get("PYCNI_TEST_FORWARDER") == "1" else ROOT / "bin"
REFERENCE_BIN = Path("/usr/lib/cni")
REFERENCE_PLUGINS = (f"the reference plugins in {REFERENCE_BIN} "
                     "(scripts/setup.sh installs containernetworking-plugins)")


def loaded_by(module: str, candidates: tuple[str, ...]) -> list[str]:
    """Which of `candidates` a fresh interpreter has in sys.modules after importing `module`."""
    code = (f"import sys, {module}; "
            f"print(' '.join(m for m in {candidates!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return out.stdout.split()


def sh(*cmd: str, check: bool = True, netns: str | None = None,
       **kw) -> subprocess.CompletedProcess:
    argv = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


@dataclass
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return sh(*cmd, check=check, netns=self.name, **kw)

    def ip(self, *args: str) -> Any:
        """`ip -j ...` in this namespace, parsed."""
        out = self.run("ip", "-j", *args).stdout
        return json.loads(out) if out.strip() else []

    def links(self) -> dict[str, dict]:
        return {link["ifname"]: link for link in self.ip("-d", "link", "show")}

    def addresses(self, ifname: str) -> list[str]:
        info = self.ip("addr", "show", "dev", ifname)
        return [f"{a['local']}/{a['prefixlen']}" for a in info[0]["addr_info"]] if info else []

    def nft_ruleset(self) -> dict:
        return json.loads(self.run("nft", "-j", "list", "ruleset").stdout or "{}")


@dataclass
class Plugins:
    """Execs CNI plugins inside a host namespace the way a runtime does."""

    host: Netns
    bin_dir: Path = BIN
    made: list[Netns] = field(default_factory=list)

    def exec(self, plugin: str, command: str, conf: dict | bytes | str, *,
             container_id: str = "ctr1", netns: str = "", ifname: str = "eth0",
             cni_args: str = "", env: dict | None = None, path: str | None = None,
             bin_dir: Path | None = None) -> tuple[int, Any, str]:
        stdin = conf if isinstance(conf, bytes) else (
            conf.encode() if isinstance(conf, str) else json.dumps(conf).encode())
        full = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": path or str(bin_dir or self.bin_dir),
        }
        if cni_args:
            full["CNI_ARGS"] = cni_args
        full.update(env or {})
        exe = str((bin_dir or self.bin_dir) / plugin)
        proc = subprocess.run(["ip", "netns", "exec", self.host.name, exe], input=stdin,
                              env=full, capture_output=True)
        out = proc.stdout.decode()
        try:
            parsed = json.loads(out) if out.strip() else None
        except ValueError:
            parsed = out
        return proc.returncode, parsed, proc.stderr.decode()

    def ok(self, plugin: str, command: str, conf: dict | bytes | str, **kw) -> Any:
        code, out, err = self.exec(plugin, command, conf, **kw)
        assert code == 0, f"{plugin} {command} failed ({code}): {out} {err}"
        return out


HEAVY_MODULES = ("pyroute2", "pydantic", "pydantic_core", "netaddr", "click", "nftables")


def probe_binary(plugin: str, env: dict[str, str], stdin: bytes = b"",
                 watch: tuple[str, ...] = HEAVY_MODULES,
                 netns: str | None = None) -> tuple[str, int, list[str]]:
    """Run bin/<plugin>'s code in a fresh `python -IS` as the exec'd binary would run (inside
    the namespace `netns`, if given), and report (its stdout, its exit code, which of the
    `watch` modules it imported)."""
    probe = (
        "import json, os, posix, runpy, sys\n"
        f"os.environ.clear(); os.environ.update({env!r})\n"
        "posix._exit = sys.exit  # the shim leaves by posix._exit: come back here to look\n"
        "code = 0\n"
        "try:\n"
        f"    runpy.run_path({str(BIN / plugin)!r}, run_name='__main__')  # sets argv[0]\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        f"loaded = [m for m in {watch!r} if m in sys.modules]\n"
        "print('\\nPROBE', json.dumps([code, loaded]))\n"
    )
    inside = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run([*inside, str(VENV_PY), "-IS", "-c", probe], input=stdin.decode(),
                         capture_output=True, text=True, cwd="/tmp", check=True).stdout
    body, _, tail = out.rpartition("\nPROBE ")
    code, loaded = json.loads(tail)
    return body, code, loaded


def new_netns(prefix: str) -> Netns:
    name = f"{prefix}-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    ns = Netns(name)
    ns.run("ip", "link", "set", "lo", "up")
    return ns


def forget_deleted_markers() -> None:
    """A new throwaway node starts without cni.deleted's markers from earlier tests (on a real
    node they live in /run: a node's own DELs made them)."""
    from cni import deleted
    from cni.plugins import shaped

    shutil.rmtree(deleted.MARKER_DIR, ignore_errors=True)
    shutil.rmtree(shaped.RECORD_DIR, ignore_errors=True)  # bandwidth's tbf records: per node


def delete_netns(ns: Netns) -> None:
    subprocess.run(["ip", "netns", "del", ns.name], check=False, capture_output=True)


def destroy_netns(ns: Netns, host: Netns, timeout: float = 60.0) -> list[str]:
    """`ip netns del` the pod namespace `ns` and wait until the kernel has destroyed it.

    `ip netns del` only unmounts the name: the kernel tears the namespace down later, from a
    work queue (seconds on a loaded box), and only then goes the host end of each of its veths.
    A test that asserts what a DEL or GC left on the host must first wait for that, or it sees
    the kernel's pending work as a leak. The host ends are found by pairing ifindexes: the pod
    end's peer index is the host end's index, and the other way round. Returns the names of
    the host ends it waited for."""
    pod_ends = {(link["ifindex"], link["link_index"]) for link in ns.ip("link", "show")
                if "link_index" in link}
    host_ends = {link["ifindex"]: link["ifname"] for link in host.ip("link", "show")
                 if (link.get("link_index"), link["ifindex"]) in pod_ends}
    subprocess.run(["ip", "netns", "del", ns.name], check=True)
    deadline = time.monotonic() + timeout
    while host_ends.keys() & {link["ifindex"] for link in host.ip("link", "show")}:
        assert time.monotonic() < deadline, (
            f"the kernel had not destroyed netns {ns.name} after {timeout:.0f} s")
        time.sleep(0.05)
    return sorted(host_ends.values())


def can_use_netns() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        ns = new_netns("pycni-probe")
    except (OSError, subprocess.CalledProcessError):
        return False
    delete_netns(ns)
    return True
