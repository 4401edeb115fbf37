"""host-local ADD with 1, 1000 and 10000 existing reservations: ours against the reference.

Both plugins are exec'd as a runtime does, interleaved in the same run on the same store (they
share it: same files, same flock), so machine load hits both alike. Each ADD's reservation is
removed before the next (untimed), so the store size stays fixed. Prints medians and the ratio.

    .venv/bin/python bench/host_local.py [--rounds 15] [--sizes 1,1000,10000]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "bin" / "host-local"
GO = Path("/usr/lib/cni/host-local")
SUBNET = ipaddress.ip_network("10.128.0.0/14")  # room for 10000+ reservations
NET = "bench"


def populate(data_dir: Path, count: int) -> None:
    """`count` reservations in the reference's format, as if made by `count` containers."""
    d = data_dir / NET
    d.mkdir(parents=True)
    (d / "lock").touch(mode=0o600)
    hosts = SUBNET.hosts()
    next(hosts)  # the gateway
    last = None
    for i in range(count):
        last = str(next(hosts))
        (d / last).write_bytes(f"{i:064x}\r\neth0".encode())
    if last:
        (d / "last_reserved_ip.0").write_text(last)


def add_once(exe: Path, config: bytes, cid: str, data_dir: Path) -> float:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": "/dev/null",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(exe.parent), "PATH": "/usr/bin:/bin"}
    t0 = time.perf_counter()
    proc = subprocess.run([str(exe)], input=config, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{exe} ADD failed: {proc.stdout.decode()} {proc.stderr.decode()}")
    ip = json.loads(proc.stdout)["ips"][0]["address"].split("/")[0]
    os.unlink(data_dir / NET / ip)  # keep the store at its size (untimed)
    return elapsed


def bench(size: int, rounds: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as tmp:
        data_dir = Path(tmp)
        populate(data_dir, size)
        config = json.dumps({"cniVersion": "1.0.0", "name": NET, "ipam": {
            "type": "host-local", "subnet": str(SUBNET), "dataDir": str(data_dir)}}).encode()
        ours, go = [], []
        for i in range(rounds + 1):
            a = add_once(OURS, config, f"bench-ours-{i}", data_dir)
            b = add_once(GO, config, f"bench-go-{i}", data_dir)
            if i:  # the first round warms the page cache for both
                ours.append(a)
                go.append(b)
        return statistics.median(ours), statistics.median(go)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", default="1,1000,10000")
    args = parser.parse_args()
    if not os.access(GO, os.X_OK):
        sys.exit(f"reference plugin {GO} not found (Debian: containernetworking-plugins)")
    print(f"host-local ADD, median of {args.rounds} execs each, interleaved")
    print(f"{'reservations':>12} {'pycni ms':>10} {'reference ms':>13} {'ratio':>7}")
    for size in (int(s) for s in args.sizes.split(",")):
        ours, go = bench(size, args.rounds)
        print(f"{size:>12} {ours * 1000:>10.1f} {go * 1000:>13.1f} {ours / go:>7.2f}")


if __name__ == "__main__":
    main()
