"""A spare keeps its last request's pod socket for the pod's next plugin (netns.carry_sockets):
one IPRoute fewer a request in a pod's chain. The socket pins the pod's namespace, so it is let
go when no request comes soon (child.CARRY_IDLE) and never kept after a DEL. Seen on the spare
itself: which namespaces its netlink sockets live in (pidfd_getfd + SIOCGSKNS), and what a
pinned namespace keeps alive (the host end of a veth whose pod namespace was deleted)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import subprocess
from pathlib import Path

import pytest
from cnitest import Netns, Plugins
from test_daemon import scenario, start_daemon, wait_for  # noqa: F401 (a fixture)

from cni.fast import child

SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438
SIOCGSKNS = 0x894C  # a socket's network namespace, as an fd
NOT_BACK = "a spare exits instead of serving again"


def socket_namespaces(pid: int) -> list[int]:
    """The network namespace (inode) of each socket process `pid` holds."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    assert pidfd >= 0, os.strerror(ctypes.get_errno())
    found = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                continue
            try:
                ns = fcntl.ioctl(fd, SIOCGSKNS)
                found.append(os.fstat(ns).st_ino)
                os.close(ns)
            except OSError:
                pass  # not a socket with a namespace of its own (a unix socketpair is too)
            finally:
                os.close(fd)
    finally:
        os.close(pidfd)
    return found


def pod_inode(pod: Netns) -> int:
    return os.stat(pod.path).st_ino


@pytest.fixture
def one_spare(host: Netns, start_daemon):  # noqa: F811
    daemon = start_daemon(host, "--spares", "1", "--max-spares", "1")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1, "the spare")
    spare = daemon.named("pycni-spare")
    daemon.wait_warm(spare)
    return daemon, spare[0]


@pytest.mark.root
def test_a_pods_socket_is_kept_for_its_next_plugin_and_not_after_a_del(
        one_spare, pod: Netns, plugins: Plugins, tmp_path: Path) -> None:
    daemon, spare = one_spare
    bridge = scenario("bridge", tmp_path)[0]
    inode = pod_inode(pod)
    before = socket_namespaces(spare)
    assert inode not in before

    out = plugins.ok("bridge", "ADD", bridge, netns=pod.path, env=daemon.env)
    daemon.wait_served(1)
    assert daemon.named("pycni-spare") == [spare]  # back home, the socket carried
    assert socket_namespaces(spare).count(inode) == 1

    plugins.ok("bridge", "CHECK", bridge | {"prevResult": out}, netns=pod.path, env=daemon.env)
    daemon.wait_served(2)
    assert daemon.named("pycni-spare") == [spare]
    assert socket_namespaces(spare).count(inode) == 1  # the same one, not a second

    plugins.ok("bridge", "DEL", bridge | {"prevResult": out}, netns=pod.path, env=daemon.env)
    daemon.wait_served(3)
    wait_for(lambda: daemon.named("pycni-spare") == [spare], "the spare back")
    assert inode not in socket_namespaces(spare)
    assert sorted(socket_namespaces(spare)) == sorted(before)  # nothing else kept either
    assert NOT_BACK not in daemon.log.read_text()


@pytest.mark.root
def test_a_pod_deleted_without_a_del_is_not_kept_alive_by_the_spare(
        one_spare, host: Netns, netns_factory, plugins: Plugins, tmp_path: Path) -> None:
    """The runtime lost the pod (its namespace deleted, no DEL): the spare's carried socket
    lets the namespace go within CARRY_IDLE, and the veth's host end goes with it."""
    daemon, spare = one_spare
    pod = netns_factory("pycni-pod")
    out = plugins.ok("bridge", "ADD", scenario("bridge", tmp_path)[0], netns=pod.path,
                     env=daemon.env)
    host_end = out["interfaces"][1]["name"]
    inode = pod_inode(pod)
    daemon.wait_served(1)
    assert inode in socket_namespaces(spare)
    subprocess.run(["ip", "netns", "delete", pod.name], check=True)
    # (a generous bound: held, the namespace would live until the spare's next request)
    wait_for(lambda: host.run("ip", "link", "show", host_end, check=False).returncode != 0,
             "the host end gone with its namespace", limit=10)
    assert inode not in socket_namespaces(spare)
    assert daemon.named("pycni-spare") == [spare]  # it let go and serves on
    assert child.CARRY_IDLE < 1


FAKE_IPAM = """#!/bin/sh
env > "$0.$CNI_CONTAINERID.env"
cat > /dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{"cniVersion": "1.0.0", "ips": [{"address": "10.78.0.9/24"}]}'
fi
"""


@pytest.mark.root
def test_each_request_gets_its_callers_environment_exactly(
        one_spare, netns_factory, plugins: Plugins, tmp_path: Path) -> None:
    """The spare keeps its last request's environment until the next: what the next request's
    plugin execs (an IPAM plugin) sees is its own caller's, nothing of the one before."""
    daemon, spare = one_spare
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "env-ipam").write_text(FAKE_IPAM)
    (bin_dir / "env-ipam").chmod(0o755)
    conf = {"cniVersion": "1.0.0", "name": "envnet", "type": "bridge", "bridge": "envbr0",
            "ipam": {"type": "env-ipam"}}
    for n, extra in enumerate(({"PYCNI_T_ONE": "1"}, {"PYCNI_T_TWO": "2"})):
        plugins.ok("bridge", "ADD", conf, netns=netns_factory("pycni-pod").path,
                   container_id=f"c{n}", env=daemon.env | extra | {"CNI_PATH": str(bin_dir)})
        daemon.wait_served(n + 1)
        wait_for(lambda: daemon.named("pycni-spare") == [spare], "the spare back")
    seen = [set((bin_dir / f"env-ipam.c{n}.env").read_text().splitlines()) for n in (0, 1)]
    assert "PYCNI_T_ONE=1" in seen[0] and not any(v.startswith("PYCNI_T_TWO") for v in seen[0])
    assert "PYCNI_T_TWO=2" in seen[1] and not any(v.startswith("PYCNI_T_ONE") for v in seen[1])
    assert "CNI_CONTAINERID=c1" in seen[1]
    assert NOT_BACK not in daemon.log.read_text()
