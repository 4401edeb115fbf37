"""A daemon's spare serves request after request (child.back_home): it must come back to
exactly what it was, or exit. Checked on the process itself (namespaces, cwd, umask,
environment, fds, threads, children) and end to end through the daemon: pods' chains, two
callers in two namespaces, the cap on requests per spare."""

from __future__ import annotations

import gc
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cnitest import BIN, Netns, Plugins
from test_daemon import (  # noqa: F401 (start_daemon is a fixture)
    LOOPBACK,
    run_chain,
    scenario,
    start_daemon,
    wait_for,
)

from cni.fast import child
from cni.fast.procs import PR_SET_CHILD_SUBREAPER
from cni.host import netns
from cni.host.errors import NamespaceMissing
from cni.host.nsfd import libc, setns

NOT_BACK = "a spare exits instead of serving again"
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


def test_entering_a_missing_namespace_leaves_no_fd_open() -> None:
    """A DEL of a pod whose netns is gone went through here and left the caller's namespace
    open: harmless in a process that exits, a leak in one that serves again."""
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(NamespaceMissing), netns.entered("/nonexistent/pycni-netns"):
        pass
    assert sorted(os.listdir("/proc/self/fd")) == before


def in_child(host: Netns, request: Callable[[], None],
             before: Callable[[], None] = lambda: None) -> dict:
    """Fork; in the child: enter `host`, run `before`, take Home, run `request` (what a request
    would leave behind), back_home; report what it answered and where it is then."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        report: dict = {}
        try:
            fd = os.open(f"/run/netns/{host.name}", os.O_RDONLY)
            setns(fd)
            os.close(fd)
            os.chdir("/")
            libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # as spare_main
            before()
            home = child.Home.here()
            request()
            said = logging.Handler()
            said.emit = lambda record: report.setdefault("said", []).append(record.getMessage())
            logging.getLogger(child.log.name).addHandler(said)
            report["back"] = child.back_home(home)
            report["net"] = os.stat("/proc/self/ns/net").st_ino
            report["cwd"] = os.getcwd()
            report["umask"] = os.umask(0o022)
            report["env"] = "PYCNI_REQUEST_VAR" in os.environ
            report["policy"] = os.sched_getscheduler(0)
        except BaseException as e:  # noqa: BLE001
            report["error"] = repr(e)
        finally:
            os.write(wr, json.dumps(report).encode())
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    assert "error" not in out, out["error"]
    return out


@pytest.mark.root
def test_back_home_undoes_what_a_request_takes(host: Netns, pod: Netns) -> None:
    """A request enters the caller's namespace and cwd, takes its umask and environment."""
    umask = os.umask(0o022)
    os.umask(umask)

    def request() -> None:
        fd = os.open(pod.path, os.O_RDONLY)
        setns(fd)
        os.close(fd)
        os.chdir("/tmp")
        os.umask(0o077)
        os.environ["PYCNI_REQUEST_VAR"] = "1"

    def nft_context() -> None:  # as a warm-up (or the test process) might have left one
        from cni.host import nft
        nft.list_json("tables")

    out = in_child(host, request, before=nft_context)
    assert out["back"] is True, out.get("said")
    assert out["net"] == os.stat(f"/run/netns/{host.name}").st_ino
    assert (out["cwd"], out["umask"], out["env"]) == ("/", umask, False)
    assert out["policy"] == os.SCHED_OTHER  # idle while cleaning up, not for the next request


@pytest.mark.root
def test_garbage_from_before_a_request_is_not_taken_for_the_requests(host: Netns) -> None:
    """A socket in a reference cycle that the spare's parent left (garbage the spare inherits,
    its collection off): freed when the spare takes its Home, not by back_home's collection,
    where its fd would look closed by the request and the spare would exit unused."""
    def garbage() -> None:
        gc.disable()
        cycle: list = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)]
        cycle.append(cycle)

    out = in_child(host, lambda: None, before=garbage)
    assert out["back"] is True, out.get("said")


LEFT = ["fd", "fd-swapped", "thread", "process", "grandchild", "module", "handler", "mask",
        "groups", "egid", "capability", "no-new-privs", "nice", "affinity", "limit"]


@pytest.mark.root
@pytest.mark.parametrize("left", LEFT)
def test_a_spare_that_is_not_back_says_so(host: Netns, left: str, tmp_path: Path) -> None:
    """An fd left open (a record lock would go with it) or another file on a number it had, a
    thread still running, a process still there (a child, or a double-forking plugin's
    orphan), a module the request imported (from the caller's mount namespace), a signal
    handler or mask changed, credentials, capabilities, no_new_privs, its nice value, CPU
    affinity or a resource limit changed (a plugin of anyone's runs in the spare): the spare
    must not serve again. Processes are killed and reaped."""
    held: list = []
    pid_file = tmp_path / "orphan.pid"
    sys_fd = os.open("/dev/null", os.O_RDONLY)  # the spare's own, open before the request

    def request() -> None:
        if left == "fd":
            held.append(os.open("/dev/null", os.O_RDONLY))
        elif left == "fd-swapped":  # same number, another file
            os.dup2(os.open("/dev/zero", os.O_RDONLY), sys_fd)
        elif left == "thread":
            child.THREADS_WAIT = 0.2
            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        elif left == "process":
            held.append(subprocess.Popen(["sleep", "60"]))
            pid_file.write_text(str(held[0].pid))
        elif left == "grandchild":  # sh exits at once: its sleep is orphaned, to the spare
            subprocess.run(["sh", "-c", f"sleep 60 & echo $! > {pid_file}"], check=True)
        elif left == "module":
            import colorsys  # noqa: F401 (not loaded before: the import is the point)
        elif left == "handler":
            signal.signal(signal.SIGUSR1, lambda *_: None)
        elif left == "mask":
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        elif left == "groups":
            os.setgroups([*os.getgroups(), 4242])
        elif left == "egid":
            os.setegid(4242)
        elif left == "capability":  # CAP_SYS_BOOT out of the bounding set, for good
            assert libc().prctl(PR_CAPBSET_DROP, 22, 0, 0, 0) == 0
        elif left == "no-new-privs":
            assert libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        elif left == "nice":
            os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)
        elif left == "affinity":
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        else:
            soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (0 if soft else 1, hard))

    out = in_child(host, request)
    assert out["back"] is False, out
    if left in ("process", "grandchild"):
        assert "killed and reaped" in out["said"][0]
        assert not Path(f"/proc/{pid_file.read_text()}").exists()  # killed, and reaped (no zombie)
    os.close(sys_fd)


@pytest.mark.root
def test_spares_serve_pod_after_pod(host: Netns, pod: Netns, plugins: Plugins,
                                    start_daemon, tmp_path: Path) -> None:  # noqa: F811
    """The whole chain (nftables, conntrack, veth and ifb deletes with their helper threads,
    IPAM files), DEL of a pod whose netns is gone, errors: the spares come back every time."""
    daemon = start_daemon(host, "--max-spares", "2")  # no growth: these two serve every pod
    wait_for(lambda: len(daemon.named("pycni-spare")) == 2, "two spares")
    spares = set(daemon.named("pycni-spare"))
    daemon.wait_warm(spares)
    steps = 0
    for round_ in range(2):
        (tmp_path / str(round_)).mkdir()
        steps += len(run_chain(plugins, pod, scenario("chain", tmp_path / str(round_)),
                               daemon.env))
    daemon.wait_served(steps)
    # both back, and no other: none exited (a spare that does is replaced by a new one)
    wait_for(lambda: set(daemon.named("pycni-spare")) == spares, "both spares back")
    assert daemon.status()["spares"]["retired"] == 0
    assert NOT_BACK not in daemon.log.read_text()
    assert "spare is back" in daemon.log.read_text()


@pytest.mark.root
def test_a_spare_acts_in_each_callers_namespace(
        netns_factory, start_daemon, tmp_path: Path) -> None:  # noqa: F811
    """Requests from two callers in two namespaces, alternating, through the same spares: each
    bridge and masquerade rule lands in its caller's namespace (an nftables context is made
    per request, never kept for the next)."""
    home = netns_factory("pycni-host")
    callers = [netns_factory("pycni-host") for _ in range(2)]
    daemon = start_daemon(home, "--spares", "1")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1, "the spare")
    spare = daemon.named("pycni-spare")
    daemon.wait_warm(spare)
    conf = scenario("bridge", tmp_path)[0]
    for i in range(4):
        caller = callers[i % 2]
        pod = netns_factory("pycni-pod")
        Plugins(caller).ok("bridge", "ADD", conf, netns=pod.path, container_id=f"c{i}",
                           env=daemon.env)
        daemon.wait_served(i + 1)
        wait_for(lambda: daemon.named("pycni-spare") == spare, "the spare back")
    for n, caller in enumerate(callers):
        rules = caller.run("nft", "list", "chain", "inet", "cni_plugins_masquerade",
                           "masq_checks").stdout
        assert [f"id: c{i}" in rules for i in range(4)] == [i % 2 == n for i in range(4)]
        assert caller.run("ip", "link", "show", "idbr0", check=False).returncode == 0
    assert home.run("ip", "link", "show", "idbr0", check=False).returncode != 0
    assert NOT_BACK not in daemon.log.read_text()


@pytest.mark.root
def test_a_spare_retires_after_max_served(host: Netns, pod: Netns, plugins: Plugins,
                                          start_daemon) -> None:  # noqa: F811
    daemon = start_daemon(host, "--spares", "1")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1, "the spare")
    first = daemon.named("pycni-spare")
    daemon.wait_warm(first)  # else the first requests get a fork each, and it serves fewer
    for i in range(child.MAX_SERVED):
        plugins.ok("loopback", "CHECK", LOOPBACK, netns=pod.path, ifname="lo", env=daemon.env)
        daemon.wait_served(i + 1)  # one at a time: every request finds the spare back
        if i < child.MAX_SERVED - 1:
            wait_for(lambda: daemon.named("pycni-spare") == first, "the spare back")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1
             and daemon.named("pycni-spare") != first, "a new spare")
    assert daemon.log.read_text().count("(the spare is back)") == child.MAX_SERVED - 1
    assert NOT_BACK not in daemon.log.read_text()


def test_a_hang_up_seen_after_its_job_ended_in_the_same_round_is_ignored() -> None:
    """The spare's 'back' and its caller's close can come in one round of events: the first
    ends the job (its connection closed), the second must then do nothing (it raised, and the
    daemon's loop with it)."""
    import selectors
    import socket

    from cni.fast.server import Job, Options, Server

    listener, _ = socket.socketpair()
    server = Server(listener, Options(spares=0))
    conn, caller = socket.socketpair()
    job = Job(os.getpid(), conn, time.monotonic() + 60, "loopback ADD ctr1", b"",
              ("ctr1", "lo"))
    server.jobs[job.pid] = job
    server.busy[job.key] = {job.pid}
    server.sel.register(conn, selectors.EVENT_READ)
    caller.close()
    server._finish(server.jobs.pop(job.pid), 0, "the spare is back")
    server._hangup(job)  # the same round's stale event
    assert conn.fileno() == -1 and not server.busy and not job.abandoned


# --- a caller whose /proc lies ----------------------------------------------------------------

def send_request(path: Path, plugin: str, env: dict[str, str], conf: dict,
                 by_role: dict[int, int]) -> tuple[int, dict]:
    """What a shim sends, with the fds chosen here; -> (exit code, its JSON) once ACKed."""
    import struct

    from cni.fast import protocol as proto

    fds = [by_role[r] for r in proto.ROLES if r in by_role]
    data = proto.encode_request(plugin, proto.encode_env(
        {k.encode(): v.encode() for k, v in env.items()}), json.dumps(conf).encode(),
        sum(by_role), 0o022)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(path))
        assert s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   struct.pack(f"{len(fds)}i", *fds))]) == len(data)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    assert answer[:1] == proto.ACK, answer[:200]
    code, out_len, _ = proto.reply_sizes(answer[1:1 + proto.REPLY_PREFIX])
    return code, json.loads(answer[1 + proto.REPLY_PREFIX:1 + proto.REPLY_PREFIX + out_len])


def make_proc_lie(liar: int, daemon: int, spare: int, home_net: str, store: Path,
                  scratch: Path) -> None:
    """In the mount namespace of process `liar`: a tmpfs over /proc whose self/ns/{mnt,net}
    and thread-self/ns/* lead to the daemon's own namespaces (symlinks to the real nsfs files:
    the spare, in there, would read that it is home), self/fd lists the spare's fd numbers,
    and a tmpfs of its own over `store` (where the next pod's IPAM files must not go)."""
    real = scratch / "realproc"
    real.mkdir()
    script = ["set -e", f"mount --bind /proc {real}", "mount -t tmpfs liar-proc /proc"]
    for d in ("self", "thread-self"):  # symlinks: stat() follows them to the real nsfs files
        script += [f"mkdir -p /proc/{d}/ns /proc/{d}/fd",
                   f"ln -s {real}/{daemon}/ns/mnt /proc/{d}/ns/mnt",
                   f"ln -s {home_net} /proc/{d}/ns/net"]
    fds = {int(fd) for fd in os.listdir(f"/proc/{spare}/fd")}
    fds.add(min(set(range(len(fds) + 1)) - fds))  # the one its own listing will open
    script += [f"touch /proc/self/fd/{fd}" for fd in sorted(fds)]
    script += [f"mkdir -p {store}", f"mount -t tmpfs liar-store {store}"]
    made = subprocess.run(["nsenter", "-t", str(liar), "-m", "sh", "-cx", "\n".join(script)],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]


@pytest.mark.root
def test_a_caller_whose_proc_lies_does_not_keep_the_spare(
        netns_factory, start_daemon, tmp_path: Path) -> None:  # noqa: F811
    """A caller's mount namespace whose /proc says the spare is home when it is not: the spare
    goes home by its own fds anyway, and the next pod (from the daemon's own namespaces, as a
    node's shims are) gets its address written where it belongs, not into the liar's tmpfs."""
    host, liar_net = netns_factory("pycni-host"), netns_factory("pycni-host")
    pod, next_pod = netns_factory("pycni-pod"), netns_factory("pycni-pod")
    liar = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    store = tmp_path / "ipam"
    try:
        wait_for(lambda: os.readlink(f"/proc/{liar.pid}/ns/mnt")
                 != os.readlink("/proc/self/ns/mnt"), "the liar's mount namespace")
        daemon = start_daemon(host, "--spares", "1")
        wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
        spare = daemon.named("pycni-spare")
        make_proc_lie(liar.pid, daemon.proc.pid, spare[0], host.path, store, tmp_path)
        env = {"PATH": "/usr/bin:/bin", "CNI_CONTAINERID": "liar1", "CNI_IFNAME": "lo",
               "CNI_PATH": str(BIN)}
        flags = os.O_RDONLY | os.O_CLOEXEC
        fds = [os.open(pod.path, flags), os.open(liar_net.path, flags),
               os.open(f"/proc/{liar.pid}/ns/mnt", flags), os.open("/", flags | os.O_PATH)]
        from cni.fast import protocol as proto

        roles = dict(zip(proto.ROLES, fds, strict=True))
        send_request(daemon.socket, "loopback", env | {"CNI_COMMAND": "ADD",
                     "CNI_NETNS": pod.path}, LOOPBACK, roles)  # its answer does not matter
        for fd in fds:
            os.close(fd)
        daemon.wait_served(1)
        wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "a warm spare")
        # The next pod, from the daemon's own mount and network namespaces.
        conf = {"cniVersion": "1.0.0", "name": "liarnet", "type": "host-local",
                "ranges": [[{"subnet": "10.78.0.0/24"}]], "dataDir": str(store)}
        fds = [os.open(next_pod.path, flags), os.open(host.path, flags),
               os.open(f"/proc/{daemon.proc.pid}/ns/mnt", flags), os.open("/", flags | os.O_PATH)]
        code, out = send_request(daemon.socket, "host-local", env | {
            "CNI_COMMAND": "ADD", "CNI_NETNS": next_pod.path, "CNI_CONTAINERID": "next1",
            "CNI_IFNAME": "eth0"}, conf | {"ipam": conf}, dict(zip(proto.ROLES, fds,
                                                                  strict=True)))
        for fd in fds:
            os.close(fd)
        assert code == 0, out
        assert out["ips"][0]["address"] == "10.78.0.2/24"  # what a fresh process answers
        assert (store / "liarnet" / "10.78.0.2").read_text().startswith("next1")
        figures = daemon.status()
        assert (figures["started"], figures["answered"], figures["forked"]) == (2, 2, 0)
        wait_for(lambda: daemon.named("pycni-spare") == spare, "the spare back")
        assert NOT_BACK not in daemon.log.read_text()  # home, by its own fds: serving still
    finally:
        liar.kill()
        liar.wait()


@pytest.mark.root
@pytest.mark.parametrize("spares", ["0", "1"])
def test_what_a_double_forking_ipam_leaves_is_killed_with_its_request(
        host: Netns, pod: Netns, plugins: Plugins, start_daemon, tmp_path: Path,  # noqa: F811
        spares: str) -> None:
    """bridge execs an IPAM wrapper that leaves a process behind (`sleep &`, orphaned when the
    wrapper's own process ends): with a spare, the spare (a subreaper) kills and reaps it and
    retires; with a child forked for the request, the daemon kills the child's process group
    when it exits. Either way nothing of the request outlives it."""
    bin_dir = tmp_path / "wrapbin"
    bin_dir.mkdir()
    pid_file = tmp_path / "orphan.pid"
    script = bin_dir / "leaky-ipam"
    script.write_text("#!/bin/sh\n"
                      f"sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}\n"
                      f'exec {BIN}/host-local "$@"\n')
    script.chmod(0o755)
    daemon = start_daemon(host, "--spares", spares)
    if spares == "1":
        wait_for(lambda: daemon.status()["spares"]["warm"] == 1, "the spare warm")
    conf = {"cniVersion": "1.0.0", "name": "leaknet", "type": "bridge", "bridge": "leakbr0",
            "ipam": {"type": "leaky-ipam", "ranges": [[{"subnet": "10.76.0.0/24"}]],
                     "dataDir": str(tmp_path / "ipam")}}
    out = plugins.ok("bridge", "ADD", conf, netns=pod.path,
                     env=daemon.env | {"CNI_PATH": f"{bin_dir}:{BIN}"})
    assert out["ips"][0]["address"] == "10.76.0.2/24"
    orphan = int(pid_file.read_text())
    wait_for(lambda: not Path(f"/proc/{orphan}").exists(), "the orphan killed and reaped")
    daemon.wait_served(2)  # bridge's ADD, and the host-local its wrapper exec'd (nested)
    figures = daemon.status()
    # the nested request finds the one spare busy with bridge's: it forks
    assert figures["forked"] == (2 if spares == "0" else 1)
    if spares == "1":
        assert "the request left 1 process(es) (killed and reaped)" in daemon.log.read_text()
        wait_for(lambda: daemon.status()["spares"]["retired"] == 1, "the spare retired")
