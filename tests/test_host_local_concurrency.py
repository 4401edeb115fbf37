"""host-local under concurrency: 100 ADDs as separate processes on one network, ours alone and
mixed half-and-half with the reference Go plugin sharing the same store (both flock `lock`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_host_local import GO, OURS, conf, env, needs_go, reservations, store_files

N = 100


def run_all(command: str, config: dict, exes: list[Path]) -> list[tuple[int, str]]:
    """Start every process first, then collect: they really run at the same time."""
    stdin = json.dumps(config).encode()
    procs = []
    for i, exe in enumerate(exes):
        p = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env(command, cid=f"ctr-{i:03d}"))
        procs.append(p)
    for p in procs:
        p.stdin.write(stdin)
        p.stdin.close()
    out = []
    for p in procs:
        stdout = p.stdout.read().decode()
        p.stdout.close()
        p.stderr.read()
        p.stderr.close()
        out.append((p.wait(), stdout))
    return out


def add_then_del(tmp_path: Path, exes: list[Path]) -> None:
    config = conf(tmp_path, "0.4.0", subnet="10.100.0.0/24")
    results = run_all("ADD", config, exes)
    assert all(code == 0 for code, _ in results), [r for r in results if r[0]]
    addrs = [json.loads(out)["ips"][0]["address"] for _, out in results]
    assert len(set(addrs)) == N
    held = reservations(tmp_path)
    assert len(held) == N
    # every process's file names its own container, and the address it was given
    for i, addr in enumerate(addrs):
        assert held[addr.split("/")[0]] == f"ctr-{i:03d}\r\neth0".encode()

    results = run_all("DEL", config, exes)
    assert all(code == 0 for code, _ in results), [r for r in results if r[0]]
    assert reservations(tmp_path) == {}
    assert set(store_files(tmp_path)) == {"lock", "last_reserved_ip.0"}


def test_100_concurrent_adds_and_dels_ours(tmp_path):
    add_then_del(tmp_path, [OURS] * N)


@needs_go
def test_100_concurrent_adds_and_dels_half_reference(tmp_path):
    add_then_del(tmp_path, [OURS if i % 2 else GO for i in range(N)])


@needs_go
@pytest.mark.parametrize("first", [OURS, GO])
def test_release_made_by_the_other_implementation_concurrently(tmp_path, first):
    """ADD with one implementation, DEL with the other, all at once."""
    config = conf(tmp_path, "0.4.0", subnet="10.101.0.0/24")
    other = GO if first == OURS else OURS
    assert all(code == 0 for code, _ in run_all("ADD", config, [first] * 20))
    assert len(reservations(tmp_path)) == 20
    assert all(code == 0 for code, _ in run_all("DEL", config, [other] * 20))
    assert reservations(tmp_path) == {}
