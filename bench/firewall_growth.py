"""How a firewall verb's time grows with the attachments already in its table (DESIGN "Speed").

Run as root inside a throwaway network namespace (its nft tables and iptables are its own):

    unshare -n .venv/bin/python bench/firewall_growth.py [--iptables] [--others 200]

Times ADD, CHECK and DEL of one attachment in-process, with 0 and then N other attachments of
the same network in `inet cni_firewall` (and, with --iptables, an `iptables -P FORWARD DROP`
host, so the iptables CNI-FORWARD rules are written too); prints the medians and the ratio.
Not a test: speed is never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cni.plugins import firewall  # noqa: E402
from cni.skel import Request  # noqa: E402


def request(command: str, cid: str, ip: str) -> Request:
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "br0"}],
            "ips": [{"address": f"{ip}/16", "gateway": "10.99.0.1", "interface": 0}]}
    conf = {"cniVersion": "1.0.0", "name": "fwnet", "type": "firewall", "prevResult": prev}
    return Request("firewall", command, cid, "/dev/null", "eth0", [], [], conf, "1.0.0",
                   json.dumps(conf).encode(), {}, prev_result=prev)


def ip_of(i: int) -> str:
    return f"10.99.{1 + i // 250}.{1 + i % 250}"


def timed(command: str, cid: str, ip: str, runs: int) -> dict[str, float]:
    out: dict[str, list[float]] = {"ADD": [], "CHECK": [], "DEL": []}
    for _ in range(runs):
        for verb, fn in (("ADD", firewall.add), ("CHECK", firewall.check),
                         ("DEL", firewall.delete)):
            start = time.perf_counter()
            fn(request(verb, cid, ip))
            out[verb].append((time.perf_counter() - start) * 1000)
    return {v: statistics.median(t) for v, t in out.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--others", type=int, default=200)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--iptables", action="store_true")
    p.add_argument("--kept", action="store_true",
                   help="keep the NFTSockets CHECK asks by handle, as a daemon's spare does")
    a = p.parse_args()
    if a.kept:
        from cni.host import nftrecord

        nftrecord.keep_home_sockets()
    if a.iptables:
        for tool in ("iptables-nft", "ip6tables-nft"):
            subprocess.run([tool, "-P", "FORWARD", "DROP"], check=True)
    timed("ADD", "warm", ip_of(9000), 2)  # imports, the table's skeleton
    zero = timed("ADD", "probe", ip_of(9001), a.runs)
    for i in range(a.others):
        firewall.add(request("ADD", f"other-{i}", ip_of(i)))
    many = timed("ADD", "probe", ip_of(9001), a.runs)
    print(f"{'verb':6} {'0 others ms':>12} {f'{a.others} others ms':>16} {'ratio':>6}")
    for verb in zero:
        print(f"{verb:6} {zero[verb]:12.2f} {many[verb]:16.2f} {many[verb] / zero[verb]:6.2f}")


if __name__ == "__main__":
    main()
