"""`pycni doctor`: what the plugins need on this host, each finding with its fix.

Kernel features (bridge, veth, ifb, tbf, ingress + u32 + mirred, nftables nat with fib, sysctl
writes) are probed in a forked child that first unshares its network namespace: everything it
creates dies with it, and the host's own namespace is only ever read. (Creating an ifb may load
the ifb module, which adds idle ifb0/ifb1 to the initial namespace: the bandwidth plugin would
do the same on first use.)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from cni import __version__, registry
from cni import install as inst
from cni.fast import status
from cni.fast.protocol import DEFAULT_SOCKET, SOCKET_ENV
from cni.host import nsfd

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"
PROBE_TIMEOUT = 30.0
STORE_DIR = Path("/var/lib/cni/networks")
CACHE_DIR = Path("/var/lib/cni")
REINSTALL = "pip install pycni's wheel into its venv again (from a checkout: make setup)"


@dataclass
class Finding:
    status: str
    what: str
    detail: str = ""
    fix: str = ""


# ---- kernel probes (run in the child, inside its own network namespace) ----------------------

# (name, required, commands, fix). A probe passes when all its commands succeed, in order.
PROBES: list[tuple[str, bool, list[list[str]], str]] = [
    ("bridge links", True, [["ip", "link", "add", "pd-br0", "type", "bridge"],
                            ["ip", "link", "set", "pd-br0", "up"]],
     "load the bridge module: modprobe bridge"),
    ("veth pairs", True, [["ip", "link", "add", "pd-v0", "type", "veth", "peer", "name", "pd-v1"],
                          ["ip", "link", "set", "pd-v0", "master", "pd-br0"],
                          ["ip", "link", "set", "pd-v0", "up"]],
     "load the veth module: modprobe veth"),
    ("ifb links (bandwidth egress)", False, [["ip", "link", "add", "pd-ifb0", "type", "ifb"],
                                             ["ip", "link", "set", "pd-ifb0", "up"]],
     "load the ifb module: modprobe ifb (only the bandwidth plugin needs it)"),
    ("tbf qdisc (bandwidth)", False,
     [["tc", "qdisc", "add", "dev", "pd-v0", "root", "handle", "1:", "tbf", "rate", "1mbit",
       "burst", "16kb", "latency", "25ms"]],
     "load sch_tbf: modprobe sch_tbf"),
    ("ingress qdisc + u32 mirred redirect (bandwidth egress)", False,
     [["tc", "qdisc", "add", "dev", "pd-v0", "handle", "ffff:", "ingress"],
      ["tc", "filter", "add", "dev", "pd-v0", "parent", "ffff:", "protocol", "all", "u32",
       "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "pd-ifb0"]],
     "modprobe sch_ingress cls_u32 act_mirred"),
]
NFT_PROBE = (
    "add table ip pycni_doctor\n"
    "add chain ip pycni_doctor pre { type nat hook prerouting priority dstnat; }\n"
    "add chain ip pycni_doctor post { type nat hook postrouting priority srcnat; }\n"
    "add rule ip pycni_doctor pre fib daddr type local tcp dport 8080 dnat to 10.255.0.2:80"
    ' comment "probe"\n'
    "add rule ip pycni_doctor post ip saddr 10.255.0.2 ip daddr != 10.255.0.0/24 masquerade\n"
    "add table ip6 pycni_doctor\n"
    "add chain ip6 pycni_doctor pre { type nat hook prerouting priority dstnat; }\n"
    "add rule ip6 pycni_doctor pre fib daddr type local tcp dport 8080 dnat to [fd00::2]:80\n"
)


def _probe_child() -> dict[str, str]:
    """Runs in the forked child after unshare(CLONE_NEWNET): name -> "" (ok) or the error."""
    out: dict[str, str] = {}
    for name, _, cmds, _ in PROBES:
        out[name] = ""
        for cmd in cmds:
            if shutil.which(cmd[0]) is None:
                out[name] = f"{cmd[0]} not installed: cannot probe"
                break
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            if proc.returncode != 0:
                out[name] = f"`{' '.join(cmd)}`: {proc.stderr.strip() or proc.returncode}"
                break
    out["nftables nat, fib, masquerade"] = _nft_probe()
    for key, path in (("sysctl writes (ip_forward)", "/proc/sys/net/ipv4/ip_forward"),
                      ("sysctl writes (IPv6 forwarding)",
                       "/proc/sys/net/ipv6/conf/all/forwarding")):
        try:
            Path(path).write_text("1")
            out[key] = ""
        except OSError as e:
            out[key] = f"{path}: {e.strerror}"
    return out


def _nft_probe() -> str:
    try:
        import nftables  # the plugins' binding: libnftables in-process
    except ImportError as e:
        return f"python nftables binding: {e}"
    try:
        nft = nftables.Nftables()
    except OSError as e:
        return f"libnftables: {e}"
    rc, _, err = nft.cmd(NFT_PROBE)
    return "" if rc == 0 else (err.strip() or f"nft returned {rc}")


def kernel_probe(timeout: float = PROBE_TIMEOUT) -> dict[str, str] | str:
    """Fork; the child unshares its netns and probes. Returns the results, or why it could not."""
    libc = nsfd.libc()  # loaded before the fork: the child only calls it
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's code
        code = 0
        try:
            os.close(r)
            nsfd.check(libc.unshare(nsfd.CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True)
            payload = json.dumps(_probe_child())
        except BaseException as e:  # noqa: BLE001 - report anything, exit cleanly
            payload = json.dumps({"__error__": str(e)})
            code = 1
        with os.fdopen(w, "w") as f:
            f.write(payload)
        os._exit(code)
    os.close(w)
    data = b""
    deadline = time.monotonic() + timeout
    with os.fdopen(r, "rb") as f:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([f], [], [], left)
            if not ready:
                break
            chunk = os.read(f.fileno(), 65536)
            if not chunk:
                break
            data += chunk
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    try:
        result = json.loads(data or b"{}")
    except ValueError:
        return "the probe died without an answer"
    if not result:
        return f"the probe gave no answer within {timeout:.0f}s"
    return result.get("__error__") or result


def kernel_findings() -> list[Finding]:
    if os.geteuid() != 0:
        return [Finding(WARN, "kernel features", "not probed: needs root",
                        "run `pycni doctor` as root (the plugins run as root)")]
    result = kernel_probe()
    if isinstance(result, str):
        return [Finding(FAIL, "kernel features", f"cannot probe in a new network namespace: "
                        f"{result}", "run on a host (or privileged container) with netns support")]
    required = {name: req for name, req, _, _ in PROBES}
    fixes = {name: fix for name, _, _, fix in PROBES}
    fixes["nftables nat, fib, masquerade"] = ("apt-get install libnftables1; modprobe nf_tables "
                                              "nft_nat nft_fib_inet nft_masq")
    out = []
    for name, err in result.items():
        if not err:
            out.append(Finding(OK, name))
            continue
        needed = required.get(name, True)
        out.append(Finding(FAIL if needed else WARN, name, err,
                           fixes.get(name, "run as root with a writable /proc/sys")))
    return out


# ---- host state (read only) -----------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def sysctl_findings() -> list[Finding]:
    out = []
    fwd = _read("/proc/sys/net/ipv4/ip_forward")
    if fwd == "1":
        out.append(Finding(OK, "net.ipv4.ip_forward = 1"))
    else:
        out.append(Finding(INFO, f"net.ipv4.ip_forward = {fwd}",
                           "bridge with isGateway sets it to 1 on first ADD (as the reference)",
                           "set it in /etc/sysctl.d if other software relies on it staying 0"))
    v6 = _read("/proc/sys/net/ipv6/conf/all/disable_ipv6")
    if v6 is None:
        out.append(Finding(WARN, "IPv6", "disabled in the kernel (ipv6.disable=1)",
                           "use IPv4-only ranges, or boot without ipv6.disable=1"))
    elif v6 == "1":
        out.append(Finding(WARN, "net.ipv6.conf.all.disable_ipv6 = 1",
                           "IPv6 ranges will fail", "sysctl -w net.ipv6.conf.all.disable_ipv6=0"))
    else:
        out.append(Finding(OK, "IPv6 enabled"))
    nf = _read("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if nf == "0":
        out.append(Finding(INFO, "net.bridge.bridge-nf-call-iptables = 0",
                           "bridged pod traffic skips the host firewall (kube-proxy needs it)",
                           "for Kubernetes: modprobe br_netfilter; sysctl -w "
                           "net.bridge.bridge-nf-call-iptables=1"))
    return out


def _writable(path: Path) -> str:
    """"" if path is (or could be made as) a writable dir, else why not."""
    p = path
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a directory"
    if os.statvfs(p).f_flag & os.ST_RDONLY:
        return f"{p} is on a read-only filesystem"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable by uid {os.geteuid()}"
    return ""


def dir_findings() -> list[Finding]:
    out = []
    for what, path in (("host-local store", STORE_DIR), ("result cache", CACHE_DIR / "results")):
        err = _writable(path)
        fix = f"make {path} writable for root (on a tmpfs, run `pycni gc` after a reboot)"
        out.append(Finding(FAIL, f"{what} {path}", err, fix) if err
                   else Finding(OK, f"{what} {path}"))
    return out


def daemon_findings() -> list[Finding]:
    configured = os.environ.get(SOCKET_ENV)
    path = configured or DEFAULT_SOCKET
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if configured:
            return [Finding(WARN, f"daemon socket {path}", "configured but missing",
                            "start `pycni daemon` (or its systemd socket unit), or unset "
                            f"{SOCKET_ENV}")]
        return [Finding(INFO, "daemon", f"no socket at {path}: plugins run in-process "
                        "(same results, slower start)", "optional: run `pycni daemon`")]
    if not stat.S_ISSOCK(st.st_mode):
        return [Finding(FAIL, f"daemon socket {path}", "not a socket", f"remove {path}")]
    if st.st_uid != 0 or st.st_mode & 0o077:
        return [Finding(FAIL, f"daemon socket {path}",
                        f"owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}: not root-only",
                        "restart `pycni daemon` as root; the socket must be 0600 root")]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
    except OSError as e:
        return [Finding(WARN, f"daemon socket {path}", f"refuses connections: {e.strerror}",
                        "restart `pycni daemon` (plugins fall back to in-process meanwhile)")]
    finally:
        s.close()
    return [Finding(OK, f"daemon socket {path}"), *daemon_status_findings(path)]


def daemon_status_findings(path: str) -> list[Finding]:
    """What the daemon says of itself (status.query): that it answers, its version, spares."""
    figures = status.query(path)
    if figures is None:
        return [Finding(WARN, "daemon answers", f"no status answer on {path} (not running "
                        "as root, or a daemon older than this pycni)",
                        "run `pycni doctor` as root; else restart `pycni daemon`")]
    out = [Finding(OK, "daemon answers", f"pid {figures['pid']}, {figures['answered']} "
                   f"requests answered, {figures['forked']} forked without a spare")]
    if figures["version"] == __version__:
        out.append(Finding(OK, "daemon version", figures["version"]))
    else:
        out.append(Finding(WARN, "daemon version", f"{figures['version']}, but pycni here is "
                           f"{__version__}", "restart `pycni daemon` to run this version"))
    sp = figures["spares"]
    most = f" (up to {sp['max']} under load)" if sp.get("max", 0) > sp["configured"] > 0 else ""
    detail = (f"{sp['configured']} configured{most}, {sp['warm']} warm, {sp['serving']} "
              f"serving, {sp['retired']} retired")
    if sp["configured"] > 0 and sp["warm"] + sp["serving"] == 0:
        out.append(Finding(WARN, "daemon spares", detail + ": requests fork a child each "
                           "(slower)", "see the daemon's log for why its spares exit"))
    else:
        out.append(Finding(OK, "daemon spares", detail))
    for name, why in sorted(figures.get("plugins", {}).get("refused", {}).items()):
        out.append(Finding(WARN, f"daemon plugin {name}", f"not served: {why}",
                           "fix or remove the package declaring it, then restart the daemon"))
    return out


def plugin_findings(bin_dir: Path | None = None) -> list[Finding]:
    """The entry-point plugins (cni.registry.discover), each imported as the daemon would; with
    bin_dir, whether install linked it there."""
    from cni import skel

    try:
        found = registry.discover(refresh=True)
    except Exception as e:  # noqa: BLE001 - unreadable metadata
        return [Finding(WARN, f"{registry.GROUP} entry points", f"unreadable: {e}", REINSTALL)]
    out = [Finding(WARN, f"plugin {name}", why, "fix or remove the package declaring it")
           for name, why in sorted(registry.REFUSED.items())]
    for name, target in sorted(found.items()):
        try:
            skel.load(name)
        except Exception as e:  # noqa: BLE001 - the daemon would refuse it the same way
            out.append(Finding(WARN, f"plugin {name}", f"importing {target} failed: "
                               f"{type(e).__name__}: {e}", "fix or remove its package"))
            continue
        if bin_dir is not None and not (bin_dir / name).exists():
            out.append(Finding(WARN, f"plugin {name}", f"{target}, not in {bin_dir}",
                               f"pycni install --bin-dir {bin_dir}"))
        else:
            out.append(Finding(OK, f"plugin {name}", target))
    return out


def python_findings() -> list[Finding]:
    out = []
    for mod, fix in (("pyroute2", REINSTALL), ("pydantic", REINSTALL), ("netaddr", REINSTALL),
                     ("nftables", f"apt-get install libnftables1, then {REINSTALL}")):
        try:
            __import__(mod)
            out.append(Finding(OK, f"python module {mod}"))
        except Exception as e:  # noqa: BLE001 - an OSError from a missing .so counts too
            out.append(Finding(FAIL, f"python module {mod}", str(e), fix))
    return out


def install_findings(bin_dir: Path, conf_dir: Path) -> list[Finding]:
    out = []
    manifest = inst.Manifest.load(bin_dir) if bin_dir.is_dir() else None
    if manifest is None:
        out.append(Finding(WARN, f"install in {bin_dir}", "no pycni install recorded there",
                           f"pycni install --bin-dir {bin_dir} --conf-dir {conf_dir}"))
    else:
        changed = [e.path for e in manifest.entries if not e.matches_disk()]
        if changed:
            out.append(Finding(WARN, f"install in {bin_dir}", "changed since install: "
                               + ", ".join(changed), "pycni install --force to rewrite them"))
        elif not Path(manifest.python).exists():
            out.append(Finding(FAIL, f"install in {bin_dir}",
                               f"interpreter {manifest.python} is gone",
                               f"{REINSTALL}, then pycni install again"))
        elif manifest.lib and not Path(manifest.lib, "cni").is_dir():
            out.append(Finding(FAIL, f"install in {bin_dir}",
                               f"the package copy the plugins run, {manifest.lib}, is gone",
                               "pycni install --force"))
        else:
            copy = f", the package from {manifest.lib}" if manifest.lib else ""
            copy += ", the names linked to pycni-forwarder" if manifest.forwarder else ""
            out.append(Finding(OK, f"install in {bin_dir}", f"runs {manifest.python}{copy}"))
    out += _conflist_findings(bin_dir, conf_dir)
    return out


def _conflist_findings(bin_dir: Path, conf_dir: Path) -> list[Finding]:
    files = sorted(p for p in conf_dir.glob("*") if p.suffix in (".conf", ".conflist", ".json")
                   ) if conf_dir.is_dir() else []
    if not files:
        return [Finding(WARN, f"conflists in {conf_dir}", "none",
                        f"pycni install --conf-dir {conf_dir}")]
    out = [Finding(INFO, f"conflists in {conf_dir}", f"{files[0].name} comes first: runtimes "
                   "that load one network (containerd's CRI, CRI-O) use it")]
    for path in files:
        try:
            conf = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            out.append(Finding(FAIL, f"conflist {path}", f"unreadable: {e}",
                               "fix or remove it: runtimes skip or stop at bad files"))
            continue
        plugins = (conf.get("plugins") or [conf]) if isinstance(conf, dict) else []
        missing = sorted({p.get("type", "?") for p in plugins if isinstance(p, dict)
                          and not (bin_dir / str(p.get("type", "?"))).exists()})
        if missing:
            out.append(Finding(WARN, f"conflist {path.name}", f"plugins not in {bin_dir}: "
                               + ", ".join(missing), "install them, or point the runtime's "
                               "bin dir at where they are"))
    return out


def run_all(bin_dir: Path, conf_dir: Path) -> list[Finding]:
    groups: list[Callable[[], list[Finding]]] = [
        python_findings, kernel_findings, sysctl_findings, dir_findings, daemon_findings,
        lambda: install_findings(bin_dir, conf_dir), lambda: plugin_findings(bin_dir)]
    out = []
    if os.geteuid() != 0:
        out.append(Finding(WARN, "running as uid " + str(os.geteuid()), "plugins run as root",
                           "run `pycni doctor` as root"))
    for group in groups:
        out += group()
    return out


def render(findings: list[Finding], as_json: bool = False) -> str:
    if as_json:
        return json.dumps([asdict(f) for f in findings], indent=2)
    lines = []
    for f in findings:
        line = f"[{f.status:>4}] {f.what}"
        if f.detail:
            line += f": {f.detail}"
        lines.append(line)
        if f.fix and f.status != OK:
            lines.append(f"       fix: {f.fix}")
    failed = sum(f.status == FAIL for f in findings)
    lines.append(f"{failed} required item(s) missing" if failed else "all required items present")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(run_all(inst.DEFAULT_BIN, inst.DEFAULT_CONF)))
    sys.exit(0)
