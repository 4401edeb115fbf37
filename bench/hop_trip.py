"""The trip alone: a shim's call to the daemon (connect, send, ACK, reply) timed in one process,
without the interpreter's start-up, for requests with almost nothing to do (loopback CHECK).

    python bench/hop_trip.py SOCKET NETNS [N] [GAP_MS] [VERB]

Each call is the shim's own call_daemon; GAP_MS sleeps between calls (a pod's next plugin
starts an interpreter first: ~5 ms). VERB: CHECK (a few netlink reads in the pod's namespace,
the default) or STATUS (nothing to do: the trip alone). Prints the trip's median, p10 and
p90 in ms."""

from __future__ import annotations

import os
import statistics
import sys
import time

from cni.fast import shim

CONF = b'{"cniVersion":"1.1.0","name":"lo","type":"loopback"}'


def main() -> None:
    sock, netns = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    gap = float(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.005
    verb = sys.argv[5] if len(sys.argv) > 5 else "CHECK"
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": "hop-trip", "CNI_NETNS": netns,
           "CNI_IFNAME": "lo", "CNI_PATH": "/nonexistent"}
    for k, v in env.items():
        os.environ[k] = v
        shim.posix.environ[k.encode()] = v.encode()
    trips = []
    for _ in range(n):
        t0 = time.perf_counter()
        reply = shim.call_daemon("loopback", CONF, sock)
        trips.append((time.perf_counter() - t0) * 1000)
        if isinstance(reply, str) or reply[2] != 0:
            raise SystemExit(f"not served: {reply!r}")
        time.sleep(gap)
    q = statistics.quantiles(trips, n=10)
    print(f"trip ms: median {statistics.median(trips):.2f} p10 {q[0]:.2f} p90 {q[-1]:.2f} "
          f"({verb}, n={n}, gap {gap * 1000:g} ms, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
