"""Churn: hours of pod life compressed. Workers ADD/CHECK/DEL pods through the runtime at once.

Injected: every 13th pod is DELed twice, every 17th loses its netns before its DEL. Anything else
that fails is a failure; two live pods holding one address is a duplicate; nothing may be left.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import figures
import leakcheck
import pytest
from cnitest import Netns, delete_netns, destroy_netns, new_netns
from relharness import (
    DAEMON_MODULE,
    PLUGIN_MODULES,
    Daemon,
    Runtime,
    count,
    have,
    need,
    need_runtime,
    pod_caps,
)

pytestmark = pytest.mark.root


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[str, str] = field(default_factory=dict)  # address -> container ID
    failures: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    done: int = 0
    repeated_dels: int = 0
    netns_gone_before_del: int = 0
    addresses_seen: set[str] = field(default_factory=set)

    def fail(self, msg: str) -> None:
        with self.lock:
            self.failures.append(msg)


def lifecycle(rt: Runtime, idx: int, tag: str, tally: Tally) -> None:
    cid = f"{tag}c{idx}"
    caps = pod_caps(30000 + idx)
    pod: Netns | None = new_netns("rlchurn")
    addr = ""
    try:
        code, out, err = rt.run("add", pod.path, cid, caps)
        if code != 0 or not isinstance(out, dict) or not out.get("ips"):
            tally.fail(f"{cid} add: {code} {out} {err[-500:]}")
            rt.run("del", pod.path, cid, caps)  # what a runtime does after a failed ADD
            return
        addr = out["ips"][0]["address"]
        with tally.lock:
            if addr in tally.live:
                tally.duplicates.append(f"{addr}: {tally.live[addr]} and {cid}")
            tally.live[addr] = cid
            tally.addresses_seen.add(addr)
        if addr not in pod.addresses("eth0"):
            tally.fail(f"{cid}: {addr} not on eth0: {pod.addresses('eth0')}")
        code, out, err = rt.run("check", pod.path, cid, caps)
        if code != 0:
            tally.fail(f"{cid} check: {code} {out} {err[-500:]}")
        if idx % 17 == 5:
            destroy_netns(pod, rt.host)  # the pod died before the runtime got to DEL it
            pod = None
            with tally.lock:
                tally.netns_gone_before_del += 1
        path = pod.path if pod else f"/run/netns/rlchurn-gone-{idx}"
        for attempt in range(2 if idx % 13 == 3 else 1):
            code, out, err = rt.run("del", path, cid, caps)
            if code != 0:
                tally.fail(f"{cid} del#{attempt}: {code} {out} {err[-500:]}")
            elif attempt:
                with tally.lock:
                    tally.repeated_dels += 1
    except (OSError, subprocess.SubprocessError) as e:
        tally.fail(f"{cid}: {type(e).__name__}: {e}")
    finally:
        with tally.lock:
            if addr and tally.live.get(addr) == cid:
                del tally.live[addr]
            tally.done += 1
        if pod is not None:
            delete_netns(pod)


@pytest.fixture(params=["exec", "daemon"])
def churn_runtime(request, host: Netns, runtime: Runtime, tmp_path: Path) -> Iterator[Runtime]:
    if request.param == "daemon":
        need(DAEMON_MODULE)
        d = Daemon(host, tmp_path / "run" / "pycni.sock", tmp_path / "daemon.log").start()
        runtime.extra_env.update(d.env())  # no fallback: a pod the daemon did not serve fails
        yield runtime
        assert d.status()["answered"] > 0
        d.stop()
    else:
        yield runtime


def churn(host: Netns, rt: Runtime, tag: str, pods: int, workers: int, name: str) -> None:
    need_runtime()
    need(*PLUGIN_MODULES.values())
    tally = Tally()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(lifecycle, rt, i, tag, tally) for i in range(pods)]:
            f.result()
    leaks = leakcheck.find(host, rt.net.data_dir, rt.net.cache_dir)
    via = "daemon" if "PYCNI_SOCKET" in rt.extra_env else ("exec" if not have(DAEMON_MODULE)
                                                           else "exec")
    figures.record(name, via=via, lifecycles=tally.done, workers=workers,
                   repeated_dels=tally.repeated_dels,
                   netns_deleted_before_del=tally.netns_gone_before_del,
                   failures=len(tally.failures), duplicates=len(tally.duplicates),
                   distinct_addresses=len(tally.addresses_seen), leaks=leaks.total())
    assert tally.done == pods
    assert not tally.failures, f"{len(tally.failures)} failures: {tally.failures[:10]}"
    assert not tally.duplicates, tally.duplicates
    assert leaks.empty(), str(leaks)
    assert tally.repeated_dels and tally.netns_gone_before_del  # the injections did happen


def test_churn(host: Netns, churn_runtime: Runtime, tag: str) -> None:
    pods = count(12, 12) if "PYCNI_SOCKET" not in churn_runtime.extra_env else count(60, 60)
    churn(host, churn_runtime, tag, pods, 4, "churn")


@pytest.mark.slow
def test_churn_long(host: Netns, churn_runtime: Runtime, tag: str) -> None:
    pods = count(12, 400) if "PYCNI_SOCKET" not in churn_runtime.extra_env else count(60, 2000)
    churn(host, churn_runtime, tag, pods, 6, "churn-long")
