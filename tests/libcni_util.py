"""libcni in front of pycni: the reference cnitool (libcni v1.3, shared/reference/bin) run inside
a test's throwaway host namespace, on conflists written to a scratch NETCONFPATH.

CNI_PATH is a directory of small sh wrappers, one per plugin, that exec pycni's executable and
keep each call's stdout (libcni prints only an error's message; the wrapper's record has its
code). The plugins reach a pycni daemon started for the test module (its own namespace, its own
socket, the shim's fallback off), so a case costs milliseconds per plugin, not an interpreter.
cnitool's container ID is "cnitool-" + 20 hex of sha512(netns path); its cache is
/var/lib/cni/results (a tmpfs under scripts/test.sh).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cnitest import BIN, ROOT, VENV_PY, Netns, delete_netns, new_netns

REFERENCE = ROOT.parent / "shared" / "reference" / "bin"  # v1.9.1 plugins, cnitool 1.3
CNITOOL = REFERENCE / "cnitool"
PLUGINS = ("bridge", "host-local", "loopback", "portmap", "bandwidth", "tuning", "firewall")
CACHE = Path("/var/lib/cni")
RECORD_PREFIX = "pycni-att-"  # portmap's per-attachment record chains (cni.host.hostport)
STORE = CACHE / "networks"

WRAPPER = """#!/bin/sh
# test wrapper: run pycni's {name}, keep what it printed (libcni shows an error's message only)
out=$(mktemp -p {calls}) || exit 1
{real} >"$out"
rc=$?
cat "$out"
mv "$out" "{calls}/$(date +%s%N)-{name}-$CNI_COMMAND-$rc.json"
exit $rc
"""


def container_id(netns: Netns) -> str:
    return "cnitool-" + hashlib.sha512(netns.path.encode()).hexdigest()[:20]


@dataclass
class Daemon:
    proc: subprocess.Popen
    socket: Path
    log: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL what is left of it and its children (spares, zygote)."""
        kids: list[int] = []
        with contextlib.suppress(OSError):
            kids = [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                    .read_text().split()]
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_daemon(ns: Netns, home: Path) -> Daemon:
    sock, log = home / "run" / "pycni.sock", home / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*("ip", "netns", "exec", ns.name), str(VENV_PY), "-m",
                                 "cni.fast.daemon", "--socket", str(sock)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the daemon did not listen: {log.read_text()}"
        time.sleep(0.05)
    return Daemon(proc, sock, log)


@dataclass
class Libcni:
    """cnitool in `host`, with `daemon` serving the plugins."""

    host: Netns
    daemon: Daemon
    home: Path
    plugins: Path = BIN  # whose executables the wrappers run (the reference's, for an oracle)

    def __post_init__(self) -> None:
        self.confdir, self.bindir, self.calls = (self.home / d for d in ("net.d", "bin", "calls"))
        for d in (self.confdir, self.bindir, self.calls):
            d.mkdir(parents=True, exist_ok=True)
        for name in PLUGINS:
            path = self.bindir / name
            path.write_text(WRAPPER.format(name=name, real=self.plugins / name,
                                          calls=self.calls))
            path.chmod(0o755)

    def write(self, conflist: dict[str, Any] | str) -> str:
        """Make `conflist` the only one in NETCONFPATH; -> its network name."""
        for old in self.confdir.iterdir():
            old.unlink()
        text = conflist if isinstance(conflist, str) else json.dumps(conflist, indent=2)
        (self.confdir / "10-test.conflist").write_text(text)
        return json.loads(text)["name"]

    def run(self, verb: str, network: str, pod: Netns, cap_args: dict | None = None,
            ifname: str = "eth0", cni_args: str = "") -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "NETCONFPATH": str(self.confdir), "CNI_PATH": str(self.bindir),
               "CNI_IFNAME": ifname, "PYCNI_SOCKET": str(self.daemon.socket),
               "PYCNI_SHIM_FALLBACK": "0"}
        if cap_args is not None:
            env["CAP_ARGS"] = json.dumps(cap_args)
        if cni_args:
            env["CNI_ARGS"] = cni_args
        return subprocess.run(["ip", "netns", "exec", self.host.name, str(CNITOOL), verb,
                               network, pod.path], env=env, capture_output=True, text=True,
                              timeout=120)

    def ok(self, verb: str, network: str, pod: Netns, **kw: Any) -> str:
        proc = self.run(verb, network, pod, **kw)
        assert proc.returncode == 0, f"cnitool {verb}: {proc.stdout}{proc.stderr}"
        return proc.stdout

    def recorded(self, plugin: str, command: str) -> list[tuple[int, Any]]:
        """Every call of `plugin` with `command` so far, in order: (exit code, stdout parsed)."""
        out = []
        for path in sorted(self.calls.glob(f"*-{plugin}-{command}-*.json")):
            text = path.read_text()
            out.append((int(path.stem.rsplit("-", 1)[1]), json.loads(text) if text.strip()
                        else None))
        return out

    def forget_calls(self) -> None:
        for path in self.calls.iterdir():
            path.unlink()


def module_daemon() -> Iterator[Daemon]:
    """A daemon for a test module, in a namespace of its own (its children enter each caller's
    namespaces), stopped after the module. cnitool must be there: shared/ is beside the
    checkout in CI, and a missing one fails rather than skips."""
    if not CNITOOL.exists():
        pytest.fail(f"{CNITOOL} missing: shared/reference/bin must be beside the checkout")
    ns = new_netns("pycni-dmn")
    home = Path(tempfile.mkdtemp(prefix="pycni-libcni-"))  # 0700, outside pytest's tmp tree
    try:
        d = start_daemon(ns, home)
        yield d
        d.stop()
    finally:
        delete_netns(ns)
        shutil.rmtree(home, ignore_errors=True)


def leftovers(host: Netns, pod: Netns, network: str, ifname: str = "eth0") -> list[str]:
    """What an attachment left after its DEL: the pod's interfaces (a veth's host end goes with
    it), its ifb, host rules whose comment names its container ID (portmap's bare ID, bridge's
    "id: <ID>"), its reservations and its libcni cache entry."""
    cid = container_id(pod)
    found = [f"pod link {n}" for n in pod.links() if n != "lo"]
    ifb = "bwp" + hashlib.sha512((network + cid).encode()).hexdigest()[:12]
    found += [f"host ifb {ifb}" for name in host.links() if name == ifb]
    for item in host.nft_ruleset().get("nftables", []):
        rule = item.get("rule")
        if rule and cid in str(rule.get("comment", "")):
            found.append(f"nft rule in {rule['table']}/{rule['chain']}: {rule['comment']}")
    store = STORE / network
    if store.is_dir():
        found += [f"reservation {p.name}" for p in store.iterdir()
                  if p.is_file() and cid in p.read_text(errors="replace")]
    cache = CACHE / "results" / f"{network}-{cid}-{ifname}"
    if cache.exists():
        found.append(f"cache {cache}")
    return found


def host_leftovers(host: Netns) -> list[str]:
    """Every veth, ifb (but the module's spare ifbN) and owned rule in a test's own host
    namespace: after the last DEL there must be none."""
    found = [f"host {info['linkinfo']['info_kind']} {name}"
             for name, info in host.links().items()
             if info.get("linkinfo", {}).get("info_kind") in ("veth", "ifb")
             and not (name.startswith("ifb") and name[3:].isdigit())]
    for item in host.nft_ruleset().get("nftables", []):
        rule, chain = item.get("rule"), item.get("chain")
        if rule and rule.get("comment"):
            found.append(f"nft rule in {rule['table']}/{rule['chain']}: {rule['comment']}")
        if chain and chain["name"].startswith(RECORD_PREFIX):
            found.append(f"nft chain {chain['table']}/{chain['name']}")
    return found
