"""The daemon's Prometheus metrics, scraped by a real Prometheus (Debian's `prometheus`) in the
test's own network namespace while pods are added and deleted through the chain (runner ->
executables -> shim -> daemon); then Prometheus's HTTP API must show exactly those requests."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

import pytest
from click.testing import CliRunner
from cnitest import BIN, ROOT, Netns, loaded_by
from rootskips import missing
from test_daemon import start_daemon, wait_for  # noqa: F401 (a fixture)

from cni.fast import child
from cni.fast.state import Job
from cni.skel import Reply

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
METRICS, PROM = "127.0.0.1:19310", "127.0.0.1:19090"
PODS = 3


def curl(host: Netns, *args: str) -> subprocess.CompletedProcess:
    return host.run("curl", "-sS", "--max-time", "10", *args, check=False)


def query(host: Netns, promql: str) -> dict[tuple, float]:
    """An instant query: {sorted label items (without __name__, job, instance): value}."""
    out = curl(host, "-G", f"http://{PROM}/api/v1/query", "--data-urlencode", f"query={promql}")
    if out.returncode != 0:
        return {}
    data = json.loads(out.stdout)["data"]["result"]
    return {tuple(sorted((k, v) for k, v in r["metric"].items()
                         if k not in ("__name__", "job", "instance"))): float(r["value"][1])
            for r in data}


def wait_query(host: Netns, promql: str, expected: dict[tuple, float]) -> None:
    """Poll until the scraped series equal `expected` (bounded; no fixed sleep asserts)."""
    last: dict = {}

    def matches() -> bool:
        nonlocal last
        last = query(host, promql)
        return last == expected
    try:
        wait_for(matches, f"{promql} == {expected}", limit=90)
    except AssertionError:
        raise AssertionError(f"{promql}: {last} != {expected}") from None


@pytest.fixture
def prometheus(host: Netns, tmp_path: Path):
    if not os.access(PROMETHEUS, os.X_OK):
        missing("prometheus (scripts/setup.sh installs it)")
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: pycni\n    static_configs:\n"
        f"      - targets: ['{METRICS}']\n")
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, PROMETHEUS, f"--config.file={conf}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={PROM}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(lambda: proc.poll() is not None
                 or curl(host, f"http://{PROM}/-/ready").returncode == 0, "prometheus ready")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.root
def test_prometheus_scrapes_request_counts_latencies_errors_and_gc(
        host, netns_factory, start_daemon, prometheus, tmp_path: Path) -> None:  # noqa: F811
    daemon = start_daemon(host, "--metrics-listen", METRICS)
    # Only GET /metrics is served.
    assert "pycni_spares_warm" in curl(host, f"http://{METRICS}/metrics").stdout
    assert curl(host, "-o", "/dev/null", "-w", "%{http_code}",
                f"http://{METRICS}/other").stdout == "404"
    assert curl(host, "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                f"http://{METRICS}/metrics").stdout == "405"
    # A client that connects and says nothing blocks neither a scrape nor the daemon; a header
    # beyond the endpoint's bound is refused.
    idle = subprocess.Popen(["ip", "netns", "exec", host.name, "ncat", *METRICS.split(":")],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        assert "pycni_requests_in_flight" in curl(host, f"http://{METRICS}/metrics").stdout
        assert curl(host, "-o", "/dev/null", "-w", "%{http_code}", "-H", "X-Big: " + "x" * 9000,
                    f"http://{METRICS}/metrics").stdout == "431"
    finally:
        idle.kill()
        idle.wait()

    netconf, store = tmp_path / "net.d", tmp_path / "ipam"
    netconf.mkdir()
    bridge = {"type": "bridge", "bridge": "metbr0", "isGateway": True, "ipMasq": True,
              "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.79.0.0/24"}]],
                       "dataDir": str(store)}}
    (netconf / "10-metnet.conflist").write_text(json.dumps(
        {"cniVersion": "1.1.0", "name": "metnet",
         "plugins": [bridge, {"type": "portmap", "capabilities": {"portMappings": True}}]}))
    env = {"PATH": os.environ["PATH"], "NETCONFPATH": str(netconf), "CNI_PATH": str(BIN),
           "PYCNI_CACHE_DIR": str(tmp_path / "cache"), **daemon.env}

    def pycni(*args: str, cid: str = "") -> None:
        out = subprocess.run(["ip", "netns", "exec", host.name, str(ROOT / ".venv/bin/pycni"),
                              *args], env=env | ({"CNI_CONTAINERID": cid} if cid else {}),
                             capture_output=True, text=True)
        assert out.returncode == 0, out

    pods = [netns_factory("pycni-metpod") for _ in range(PODS)]
    for i, pod in enumerate(pods):
        pycni("add", "metnet", pod.path, cid=f"met{i}")
    for i, pod in enumerate(pods):
        pycni("del", "metnet", pod.path, cid=f"met{i}")
    # One bad config, straight to the executable (through the daemon): error 7.
    bad = subprocess.run(["ip", "netns", "exec", host.name, str(BIN / "bridge")],
                         input=json.dumps({"cniVersion": "1.1.0", "name": "metnet",
                                           "type": "bridge", "mtu": 7}).encode(),
                         env=env | {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "metbad",
                                    "CNI_NETNS": pods[0].path, "CNI_IFNAME": "eth0"},
                         capture_output=True)
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == 7, bad
    # A reservation whose pod is gone, which GC releases: one object removed (by bridge's IPAM).
    (store / "metnet" / "10.79.0.200").write_bytes(b"gone\r\neth0")
    pycni("gc", "metnet", "--valid-attachments", "[]")
    assert not (store / "metnet" / "10.79.0.200").exists()

    def series(**labels: str) -> tuple:
        return tuple(sorted(labels.items()))
    wait_query(host, "sum by (plugin, verb, result) (pycni_requests_total)", {
        series(plugin="bridge", verb="ADD", result="0"): PODS,
        series(plugin="portmap", verb="ADD", result="0"): PODS,
        series(plugin="portmap", verb="DEL", result="0"): PODS,
        series(plugin="bridge", verb="DEL", result="0"): PODS,
        series(plugin="bridge", verb="ADD", result="7"): 1,
        series(plugin="bridge", verb="GC", result="0"): 1,
        series(plugin="portmap", verb="GC", result="0"): 1,
    })
    # Latency histograms: one observation per request, in every plugin and verb.
    count = "sum by (plugin, verb) (pycni_request_duration_seconds_count)"
    expected = {series(plugin="bridge", verb="ADD"): PODS + 1,
                series(plugin="portmap", verb="ADD"): PODS,
                series(plugin="bridge", verb="DEL"): PODS, series(plugin="portmap", verb="DEL"):
                PODS, series(plugin="bridge", verb="GC"): 1, series(plugin="portmap", verb="GC"): 1}
    wait_query(host, count, expected)
    assert query(host, 'sum by (plugin, verb) (pycni_request_duration_seconds_bucket'
                       '{le="+Inf"})') == expected
    sums = query(host, "sum by (plugin, verb) (pycni_request_duration_seconds_sum)")
    assert sums.keys() == expected.keys() and all(0 < v < 120 for v in sums.values()), sums
    median = query(host, 'histogram_quantile(0.5, sum by (le) '
                         '(pycni_request_duration_seconds_bucket{plugin="bridge",verb="ADD"}))')
    assert 0 < median[()] < 120, median
    wait_query(host, "pycni_gc_removed_objects_total", {series(plugin="bridge"): 1})
    # Every request either had a warm spare or forked one; none is left in flight.
    wait_query(host, "pycni_spare_requests_total + pycni_forked_requests_total",
               {(): 4 * PODS + 3})
    assert query(host, "pycni_requests_in_flight") == {(): 0}


class FakeServer:
    """What Metrics reads of the daemon's Server (metrics.Daemon)."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.queue: deque = deque()
        self.sel = selectors.DefaultSelector()

    def warm_spares(self) -> int:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_outcomes_count_even_when_read_as_their_job_finishes(monkeypatch) -> None:
    """A child's outcome datagram may still be queued when the parent pops its job (the spare's
    "back" or the exit came first in the same select round): it must count all the same."""
    from cni.fast.metrics import Metrics

    monkeypatch.setattr(child, "after_reply", None)  # Metrics sets it: undone after the test
    server = FakeServer()
    metrics = Metrics(server, f"127.0.0.1:{free_port()}")  # type: ignore[arg-type]
    try:
        def run(label: str, reply: Reply | None, exit_code: int = 0, **flags: bool) -> None:
            job = Job(os.getpid(), None, time.monotonic() + 120, label, b"",  # type: ignore
                      received=time.monotonic(), **flags)
            server.jobs[job.pid] = job
            if reply is not None:
                child.after_reply(reply)  # what the child does after sending its reply
            del server.jobs[job.pid]
            metrics.finished(job, exit_code)

        run("bridge ADD c1", Reply(b"{}", b"", 0))
        run("bridge ADD c2", Reply(b'{"code": 7, "msg": "bad"}', b"", 1))
        run("bridge GC", Reply(b"", b"", 0, removed=3))
        run("no-such-plugin WHAT c3", Reply(b"", b"", 0))
        run("portmap DEL c4", None, exit_code=-9, timed_out=True)
        run("portmap DEL c5", None, exit_code=75)  # never started: not a request
        value = metrics.registry.get_sample_value
        assert value("pycni_requests_total", {"plugin": "bridge", "verb": "ADD",
                                              "result": "0"}) == 1
        assert value("pycni_requests_total", {"plugin": "bridge", "verb": "ADD",
                                              "result": "7"}) == 1
        assert value("pycni_gc_removed_objects_total", {"plugin": "bridge"}) == 3
        assert value("pycni_requests_total", {"plugin": "other", "verb": "other",
                                              "result": "0"}) == 1
        assert value("pycni_requests_total", {"plugin": "portmap", "verb": "DEL",
                                              "result": "11"}) == 1
        assert value("pycni_request_duration_seconds_count",
                     {"plugin": "portmap", "verb": "DEL"}) == 1
        assert metrics.outcomes == {}
    finally:
        metrics.close_in_child()
        metrics.outbox.close()


def test_prometheus_client_only_in_a_daemon_with_metrics_and_the_env_setting_is_read() -> None:
    for module in ("cni.fast.daemon", "cni.fast.shim", "cni.skel", "cni.fast.child"):
        assert loaded_by(module, ("prometheus_client",)) == [], module
    from cni.fast.daemon import command

    out = CliRunner().invoke(command, [], env={"PYCNI_METRICS_LISTEN": "localhost:9310"})
    assert out.exit_code == 2 and "'localhost' does not appear to be an IPv4" in out.output
