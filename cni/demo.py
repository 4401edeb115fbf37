"""`make demo`: the chain on throwaway namespaces, shown step by step, then shown gone.

Everything happens inside a demo "host" network namespace (the bridge, nft rules and qdiscs
land there, never in the machine's real one), with the store and result cache in a temp dir.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cni import install as inst

LOOPBACK_ONLY = {"cniVersion": "1.1.0", "name": "lo", "plugins": [{"type": "loopback"}]}


def main() -> int:
    if os.geteuid() != 0:
        print("demo: run as root (it creates network namespaces)", file=sys.stderr)
        return 1
    tag = secrets.token_hex(3)
    host, pods = f"pycni-demo-host-{tag}", [f"pycni-demo-pod{i}-{tag}" for i in (1, 2)]
    work = Path(tempfile.mkdtemp(prefix="pycni-demo-"))
    try:
        for ns in (host, *pods):
            _run("ip", "netns", "add", ns)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        nets = _write_conflists(work, tag)
        # The plugins as `pycni install` writes them, into the demo's own bin dir: the same
        # from a checkout or from an installed wheel.
        inst.install(work / "bin", None, None, compile_bytecode=False)
        env = _runner_env(work)
        _title(f"networks: {', '.join(nets)} (conflists from {work / 'net.d'})")
        for net in nets:
            for pod in pods:
                _title(f"pycni add {net} {pod}")
                print(_pycni(host, env, "add", net, pod))
        for pod in pods:
            _title(f"inside {pod}")
            print(_run("ip", "netns", "exec", pod, "ip", "-br", "addr"))
            print(_run("ip", "netns", "exec", pod, "ip", "route"))
        _show_traffic(pods)
        _title("the demo host: links, rules, qdiscs")
        print(_run("ip", "netns", "exec", host, "ip", "-br", "link"))
        print(_run("ip", "netns", "exec", host, "nft", "list", "ruleset") or "(no nft rules)")
        print(_run("ip", "netns", "exec", host, "tc", "qdisc", "show"))
        for net in nets:
            for pod in pods:
                _title(f"pycni check {net} {pod}")
                print(_pycni(host, env, "check", net, pod) or "ok")
        for net in reversed(nets):
            for pod in pods:
                _title(f"pycni del {net} {pod}")
                print(_pycni(host, env, "del", net, pod) or "ok")
        _title("after DEL: what is left")
        leftovers = _leftovers(host, work)
        print("\n".join(leftovers) if leftovers else "nothing: no veth, no address, no rule,"
              " no reservation, no cache file")
        return 1 if leftovers else 0
    except subprocess.CalledProcessError as e:
        print(f"demo: {' '.join(e.cmd)} failed:\n{e.stdout}{e.stderr}", file=sys.stderr)
        return 1
    finally:
        for ns in (*pods, host):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _write_conflists(work: Path, tag: str) -> list[str]:
    """The first shipped conflist, made private to the demo: its own bridge name and store."""
    out = work / "net.d"
    out.mkdir()
    names = []
    sources = [n for n in inst.shipped_conflists() if n.endswith(".conflist")]
    for path in [inst.CONF_SRC / n for n in sources[:1] if _have("bridge")]:
        conf = json.loads(path.read_text())
        for plugin in conf["plugins"]:
            if plugin.get("type") == "bridge":
                plugin["bridge"] = f"demo{tag}"
            if isinstance(plugin.get("ipam"), dict):
                plugin["ipam"]["dataDir"] = str(work / "networks")
        (out / path.name).write_text(json.dumps(conf, indent=2))
        names.append(conf["name"])
    if not names:
        (out / "99-loopback.conflist").write_text(json.dumps(LOOPBACK_ONLY, indent=2))
        names.append(LOOPBACK_ONLY["name"])
    return names


def _have(plugin: str) -> bool:
    return (inst.PACKAGE / "plugins" / f"{plugin}.py").exists()


def _runner_env(work: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "NETCONFPATH": str(work / "net.d"),
        "CNI_PATH": str(work / "bin"),
        "PYCNI_CACHE_DIR": str(work / "cache"),
    }


def _cap_args(pod: str) -> str:
    """Each pod gets its own hostPort (8081, 8082) and a 10/20 Mbit/s shaping."""
    port = 8080 + int(pod.split("-pod")[1].split("-")[0])
    return json.dumps({
        "portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 10_000_000, "ingressBurst": 100_000,
                      "egressRate": 20_000_000, "egressBurst": 200_000},
    })


def _pycni(host: str, env: dict[str, str], verb: str, net: str, pod: str) -> str:
    env = env | {"CNI_CONTAINERID": f"demo-{pod}", "CAP_ARGS": _cap_args(pod)}
    return _run("ip", "netns", "exec", host, sys.executable, "-m", "cni.cli", verb, net,
                f"/run/netns/{pod}", env=env)


def _show_traffic(pods: list[str]) -> None:
    addrs = _ipv4(pods[1])
    if not addrs:
        return
    _title(f"ping from {pods[0]} to {pods[1]} ({addrs[0]})")
    print(_run("ip", "netns", "exec", pods[0], "ping", "-c", "2", "-W", "2", addrs[0]))
    gateway = _gateway(pods[1])
    if gateway and shutil.which("ncat"):
        _title(f"{pods[1]} asks {gateway}:8081, the hostPort of {pods[0]}'s port 80")
        server = subprocess.Popen(
            ["ip", "netns", "exec", pods[0], "ncat", "-l", "80", "--send-only", "-w", "5"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server.stdin.write(b"hello from " + pods[0].encode() + b" via its hostPort\n")
            server.stdin.close()
            reply = subprocess.run(
                ["ip", "netns", "exec", pods[1], "ncat", "--recv-only", "-w", "5", gateway,
                 "8081"], capture_output=True, text=True, timeout=15)
            print(reply.stdout.strip() or f"no answer: {reply.stderr.strip()}")
        finally:
            server.kill()
            server.wait()


def _gateway(ns: str) -> str | None:
    routes = json.loads(_run("ip", "netns", "exec", ns, "ip", "-j", "-4", "route"))
    return next((r["gateway"] for r in routes if r.get("dst") == "default"), None)


def _ipv4(ns: str) -> list[str]:
    info = json.loads(_run("ip", "netns", "exec", ns, "ip", "-j", "-4", "addr"))
    return [a["local"] for link in info if link["ifname"] != "lo" for a in link["addr_info"]]


def _leftovers(host: str, work: Path) -> list[str]:
    left = []
    links = json.loads(_run("ip", "netns", "exec", host, "ip", "-j", "link"))
    left += [f"link {link['ifname']}" for link in links if link["ifname"].startswith(
        ("veth", "bwp"))]
    ruleset = json.loads(_run("ip", "netns", "exec", host, "nft", "-j", "list", "ruleset"))
    left += [f"nft rule {o['rule'].get('comment', '')}" for o in ruleset.get("nftables", [])
             if "rule" in o and "demo-" in o["rule"].get("comment", "")]
    for sub in ("networks", "cache"):
        base = work / sub
        if base.exists():
            left += [f"file {p}" for p in base.rglob("*") if p.is_file()
                     and p.name != "lock" and not p.name.startswith("last_reserved_ip")]
    return left


def _run(*cmd: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return proc.stdout.rstrip()


def _title(text: str) -> None:
    print(f"\n== {text}")



if __name__ == "__main__":
    sys.exit(main())
