"""Real traffic under shaping: iperf3 between a pod and the test host namespace.

Ingress (toward the pod) is limited to 10 Mbit/s, egress (from the pod) to 20 Mbit/s. A busy
2-core box cannot promise a rate, so each test compares within itself: an unshaped pod wired
the same way, measured in the same test, runs at least 10x faster than the shaped one (the
shaper, not the box, sets the rate); the shaped rates never exceed their limits (plus a little
for the burst); and egress runs at twice ingress, as the limits say (a ratio of two rates
measured alike). Runs are short (1 s warm-up omitted + 3 s measured), bounded by timeouts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from bandwidth_util import conf, runtime_bw, wire
from rootskips import skip_unless

pytestmark = [pytest.mark.root,
              skip_unless(shutil.which("iperf3") is not None,
                          "iperf3 (scripts/setup.sh installs it)")]

MBIT = 1_000_000
INGRESS, EGRESS = 10 * MBIT, 20 * MBIT
CAP_SLACK = 0.10  # above the limit: the burst (80-160 kB) spread over a 3 s run, and rounding
RATIO = (1.5, 2.5)  # egress / ingress, for limits of 20 and 10 Mbit/s


@pytest.fixture
def iperf_server(host) -> Iterator[None]:
    """An iperf3 server in the host namespace, listening on every address it has."""
    proc = subprocess.Popen(["ip", "netns", "exec", host.name, "iperf3", "-s", "-p", "5201"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    yield
    proc.kill()
    proc.wait()


def measure(pod, server_ip: str, reverse: bool) -> float:
    """Bits/s the receiving side saw: reverse=True is host -> pod (the pod's ingress)."""
    cmd = ["iperf3", "-c", server_ip, "-p", "5201", "-t", "3", "-O", "1", "-J",
           "--connect-timeout", "2000"] + (["-R"] if reverse else [])
    for _ in range(3):  # the server serves one client at a time: retry a refused start
        proc = pod.run(*cmd, check=False, timeout=20)
        report = json.loads(proc.stdout or "{}")
        if proc.returncode == 0 and "error" not in report:
            return float(report["end"]["sum_received"]["bits_per_second"])
        time.sleep(0.5)
    raise AssertionError(f"iperf3 failed: {proc.stdout[-500:]} {proc.stderr[-500:]}")


def assert_shaped(shaped, free) -> None:
    """Shaped vs unshaped, measured in the same test one after the other."""
    rates = {"free in": measure(free.pod, free.host_ip, reverse=True),
             "free out": measure(free.pod, free.host_ip, reverse=False),
             "in": measure(shaped.pod, shaped.host_ip, reverse=True),
             "out": measure(shaped.pod, shaped.host_ip, reverse=False)}
    shown = {k: round(v / MBIT, 2) for k, v in rates.items()}
    print(f"measured (Mbit/s): {shown}")
    assert rates["in"] <= INGRESS * (1 + CAP_SLACK), shown
    assert rates["out"] <= EGRESS * (1 + CAP_SLACK), shown
    assert rates["free in"] >= 10 * rates["in"], shown
    assert rates["free out"] >= 10 * rates["out"], shown
    assert RATIO[0] <= rates["out"] / rates["in"] <= RATIO[1], shown


def test_shaped_pod_runs_at_its_limits_and_unshaped_pod_far_faster(
        plugins, host, netns_factory, iperf_server) -> None:
    shaped = wire(host, netns_factory("pycni-pod"), 1)
    free = wire(host, netns_factory("pycni-pod"), 2)
    cfg = conf(**runtime_bw((INGRESS, 80_000), (EGRESS, 160_000)))
    plugins.ok("bandwidth", "ADD", cfg | {"prevResult": shaped.prev_result()},
               netns=shaped.pod.path)
    assert_shaped(shaped, free)


def test_annotation_limits_shape_real_traffic(plugins, host, netns_factory,
                                              iperf_server) -> None:
    """The same limits from pod annotations, with the derived burst (not a 4 Gbit one)."""
    shaped = wire(host, netns_factory("pycni-pod"), 1)
    free = wire(host, netns_factory("pycni-pod"), 2)
    cfg = conf(runtimeConfig={"io.kubernetes.cri.pod-annotations": {
        "kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "20M"}})
    plugins.ok("bandwidth", "ADD", cfg | {"prevResult": shaped.prev_result()},
               netns=shaped.pod.path)
    assert_shaped(shaped, free)
