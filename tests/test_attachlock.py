"""One request per attachment across processes (cni/fast/attachlock.py): the daemon's queue
serializes only its own jobs, so an ADD the old daemon still runs after a handover, or one the
daemon runs while the shim falls back in-process, must hold a DEL of the same attachment off.

The ADD is held inside its verb by bridge's IPAM plugin: a wrapper script around our host-local
that waits on a gate (test_daemon.wrapped_ipam), after bridge made the veth. Its IPAM call is a
nested request on the same attachment, in another process: it must not wait for the lock its
own caller holds."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from cnitest import BIN, Netns
from test_daemon import (
    NO_DAEMON,
    WRAPPED,
    finish,
    kill_tree,
    run_wrapped_bridge,
    start_daemon,
    wait_for,
    wrapped_bridge_conf,
    wrapped_ipam,
)

from cni.fast import attachlock
from cni.fast import protocol as proto
from cni.install import upgrade
from cni.skel import Reply

__all__ = ["start_daemon"]  # the fixture, used by name

CID, IFNAME = WRAPPED


def lock_file() -> Path:
    path = attachlock.lock_path({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": CID,
                                 "CNI_IFNAME": IFNAME})
    assert path is not None
    return Path(path)


def openers(path: Path) -> set[int]:
    """The processes with `path` open (by inode: each mount namespace names it its own way)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return set()
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = fd.stat()
            except OSError:
                continue
            if (target.st_dev, target.st_ino) == (st.st_dev, st.st_ino):
                pids.add(int(proc.name))
    return pids


def ipam_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "ipam.log"
    return log.read_text().splitlines() if log.exists() else []


def del_waits_for_add(tmp_path: Path, host: Netns, pod: Netns, delete: subprocess.Popen,
                      add: subprocess.Popen, release) -> None:
    """The DEL waits while the ADD is held (it ran nothing: its IPAM call is not logged, the
    ADD's veth is there), then runs after the ADD, and nothing of the attachment is left."""
    wait_for(lambda: len(openers(lock_file())) >= 2 or delete.poll() is not None
             or len(ipam_calls(tmp_path)) > 1, "the DEL to wait for the attachment, or run")
    assert delete.poll() is None and ipam_calls(tmp_path) == [f"ADD {CID}"], \
        "the DEL ran beside the ADD"
    host_veths = [n for n in host.links() if n not in ("lo", "wrapbr0")]
    assert len(host_veths) == 1 and IFNAME in pod.links()  # the ADD's, untouched
    release()
    code, out = finish(add)
    assert code == 0, (out, add.stderr.read())
    assert out["ips"][0]["address"] == "10.79.0.2/24"
    assert delete.stdout.read() == b"" and delete.wait(60) == 0, delete.stderr.read()
    assert ipam_calls(tmp_path) == [f"ADD {CID}", f"DEL {CID}"]
    assert [n for n in host.links() if n not in ("lo", "wrapbr0")] == []
    assert IFNAME not in pod.links()
    store = tmp_path / "ipam" / "wrapnet"
    assert not (store / "10.79.0.2").exists(), sorted(p.name for p in store.iterdir())
    assert not lock_file().exists()  # a DEL that succeeded removes it


def test_a_del_at_the_successor_waits_for_the_add_the_old_daemon_runs(
        host, pod, start_daemon, tmp_path) -> None:
    """The handover case: the old daemon runs the ADD it accepted, the successor takes the DEL
    (its queue knows nothing of the ADD). The ADD's own IPAM call, made after the handover,
    reaches the successor too, nested in the old daemon's request: it runs at once."""
    daemon = start_daemon(host)
    bin_dir, release = wrapped_ipam(tmp_path)
    conf = wrapped_bridge_conf(tmp_path)
    env = {**daemon.env, "CNI_PATH": f"{bin_dir}:{BIN}"}
    add = run_wrapped_bridge(host, pod, "ADD", conf, env)
    wait_for(lambda: (tmp_path / "gate.started").exists(), "bridge ADD to exec its IPAM")
    old = daemon.status()
    successor = 0
    try:
        successor = upgrade.request(str(daemon.socket))["successor"]
        assert daemon.status()["pid"] == successor != old["pid"]
        delete = run_wrapped_bridge(host, pod, "DEL", conf, env)
        del_waits_for_add(tmp_path, host, pod, delete, add, release)
        daemon.proc.wait(30)  # the old one finished what it had accepted
        # Both daemons write the log; "served" once the spare is back, after the reply.
        wait_for(lambda: f"[{successor}]: DEBUG served bridge DEL wrap1"
                 in daemon.log.read_text(), "the successor to log the DEL")
        assert f"[{old['pid']}]: DEBUG served bridge ADD wrap1" in daemon.log.read_text()
    finally:
        if successor:
            kill_tree(successor)


def test_an_in_process_del_waits_for_the_add_the_daemon_runs(
        host, pod, start_daemon, tmp_path) -> None:
    """The fallback case: a shim that finds no daemon (here: another socket) runs the DEL
    in-process while the daemon runs the ADD. The DEL's own IPAM call (the wrapper, then our
    host-local in-process too) is nested in it and does not wait for it."""
    daemon = start_daemon(host)
    bin_dir, release = wrapped_ipam(tmp_path)
    conf = wrapped_bridge_conf(tmp_path)
    path = {"CNI_PATH": f"{bin_dir}:{BIN}"}
    add = run_wrapped_bridge(host, pod, "ADD", conf, {**daemon.env, **path})
    wait_for(lambda: (tmp_path / "gate.started").exists(), "bridge ADD to exec its IPAM")
    delete = run_wrapped_bridge(host, pod, "DEL", conf, {**NO_DAEMON, **path})
    del_waits_for_add(tmp_path, host, pod, delete, add, release)
    daemon.wait_served(2)  # bridge ADD and its nested host-local; not the DEL
    assert "bridge DEL" not in daemon.log.read_text()


def test_a_del_waiting_past_the_timeout_is_error_11_and_runs_nothing(
        host, pod, plugins, start_daemon) -> None:
    """A DEL that cannot have the attachment within the daemon's request timeout: try again
    later (11), named so, and nothing done (the loopback stays up)."""
    daemon = start_daemon(host, "--timeout", "2")
    conf = {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback"}
    plugins.ok("loopback", "ADD", conf, netns=pod.path, ifname="lo", container_id=CID,
               env=daemon.env)
    path = attachlock.lock_path({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": CID,
                                 "CNI_IFNAME": "lo"})
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another process running a verb on it would
        code, out, _ = plugins.exec("loopback", "DEL", conf, netns=pod.path, ifname="lo",
                                    container_id=CID, env=daemon.env)
        assert code == 1 and out["code"] == proto.TRY_AGAIN_LATER, out
        assert "still runs after 1s" in out["msg"] and CID in out["msg"], out
        assert "UP" in pod.links()["lo"]["flags"]
    finally:
        os.close(fd)
    plugins.ok("loopback", "DEL", conf, netns=pod.path, ifname="lo", container_id=CID,
               env=daemon.env)
    assert "UP" not in pod.links()["lo"]["flags"]
    assert not Path(path).exists()


# --- the module alone -------------------------------------------------------------------------

@pytest.fixture
def lock_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(attachlock, "LOCK_DIR", str(tmp_path / "attach"))
    return tmp_path / "attach"


def env_of(command: str, cid: str = CID, ifname: str = IFNAME) -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname}


def test_lock_names_come_from_validated_names_only(lock_dir) -> None:
    assert attachlock.lock_path(env_of("ADD")) == f"{lock_dir}/wrap1.65746830.lock"
    assert attachlock.lock_path(env_of("DEL", ifname="a.b")) == f"{lock_dir}/wrap1.612e62.lock"
    for command in ("GC", "STATUS", "VERSION", ""):
        assert attachlock.lock_path(env_of(command)) is None
    for cid, ifname in (("../x", IFNAME), (".x", IFNAME), ("", IFNAME), (CID, "a/b"),
                        (CID, ".."), (CID, ""), (CID, "x" * 16)):
        assert attachlock.lock_path(env_of("DEL", cid, ifname)) is None, (cid, ifname)
    long = attachlock.lock_path(env_of("DEL", "c" * 300))
    assert long is not None and len(Path(long).name) < 255 and "/" not in Path(long).name


def test_a_waiter_whose_file_a_del_removed_locks_the_new_one(lock_dir) -> None:
    """The unlink race: a DEL removes the file while it holds it; whoever waited on that file
    must not go on holding a lock no one else can see."""
    path = attachlock.lock_path(env_of("DEL"))
    first = attachlock.acquire(path, "", 5)
    got: list[attachlock.Lock] = []
    waiter = threading.Thread(target=lambda: got.append(attachlock.acquire(path, "", 30)))
    waiter.start()
    wait_for(lambda: len(openers(Path(path))) == 1 and _fds_on(path) >= 2, "the waiter")
    os.unlink(path)
    os.close(first.fd)
    waiter.join(30)
    assert got and got[0].fd is not None
    st, now = os.fstat(got[0].fd), os.stat(path)
    assert (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
    assert got[0].token == f"{os.getpid()}:{now.st_dev}:{now.st_ino}"
    os.close(got[0].fd)


def _fds_on(path: str) -> int:
    st = os.stat(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += (target.st_dev, target.st_ino) == (st.st_dev, st.st_ino)
    return count


def test_run_waits_then_answers_11_and_never_calls_the_verb(lock_dir) -> None:
    path = attachlock.lock_path(env_of("DEL"))
    held = attachlock.acquire(path, "", 5)
    calls: list[dict] = []

    def runner(plugin, env, stdin, netns):
        calls.append(env)
        return Reply(b"", b"", 0)
    try:
        reply = attachlock.run(runner, "bridge", env_of("DEL"), b'{"cniVersion":"0.4.0"}',
                               wait=0.3)
    finally:
        os.close(held.fd)
    assert calls == [] and reply.code == 1
    assert json.loads(reply.stdout) == {
        "cniVersion": "0.4.0", "code": proto.TRY_AGAIN_LATER,
        "msg": f"another request on container {CID} interface {IFNAME} still runs after 0.3s;"
               " try again later", "details": ""}
    # Free: the verb runs with the token naming this process and the file; a DEL that
    # succeeded removes the file, one that failed (or an ADD) leaves it.
    for command, code, left in (("ADD", 0, True), ("DEL", 1, True), ("DEL", 0, False)):
        reply = attachlock.run(lambda p, env, s, n, code=code: calls.append(env) or
                               Reply(b"", b"", code), "bridge", env_of(command), b"{}")
        st = os.stat(path) if Path(path).exists() else None
        assert Path(path).exists() is left
        if st is not None:
            assert calls[-1][attachlock.ENV] == f"{os.getpid()}:{st.st_dev}:{st.st_ino}"


def test_a_nested_call_skips_the_lock_its_caller_holds_and_no_other(lock_dir) -> None:
    """Same process (the token names us), and a child process (it names our pid, an ancestor of
    the child's): the verb runs at once. A token of another file, or of a process that is no
    ancestor, is no pass: it waits like any request."""
    path = attachlock.lock_path(env_of("ADD"))
    held = attachlock.acquire(path, "", 5)
    try:
        nested = attachlock.acquire(path, held.token, 0.2)
        assert nested.fd is None and nested.token == held.token
        code = ("import sys; from cni.fast import attachlock as a; a.LOCK_DIR = sys.argv[1];"
                "lock = a.acquire(a.lock_path({'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': "
                f"'{CID}', 'CNI_IFNAME': '{IFNAME}'}}), sys.argv[2], 0.2);"
                "print(lock.fd is None)")
        from cnitest import ROOT, VENV_PY
        out = subprocess.run([str(VENV_PY), "-c", code, str(lock_dir), held.token], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "True"
        _, dev_ino = held.token.split(":", 1)
        other_file = f"{os.getpid()}:{dev_ino}1"
        init = f"1:{dev_ino}"
        for token in ("", other_file, init, "x:y"):
            with pytest.raises(attachlock.Busy):
                attachlock.acquire(path, token, 0.1)
        env = env_of("ADD") | {attachlock.ENV: init}
        attachlock.vouch(env, lambda: os.getpid())  # pid 1 is no ancestor of ours: dropped
        assert attachlock.ENV not in env
        env = env_of("ADD") | {attachlock.ENV: f"{os.getppid()}:{dev_ino}"}
        attachlock.vouch(env, lambda: os.getpid())
        assert env[attachlock.ENV] == f"{os.getpid()}:{dev_ino}"
    finally:
        os.close(held.fd)


def test_the_in_process_wait_is_the_daemons_request_timeout() -> None:
    from cni.fast.state import Options
    assert Options.timeout == attachlock.WAIT


@pytest.mark.root
def test_nobody_cannot_touch_the_locks_and_runs_as_before() -> None:
    """/run/pycni is root's (0700): a caller that is not root can neither make nor take an
    attachment's lock; its request runs as it did without the lock (it can change nothing a
    root request would)."""
    from test_daemon import as_nobody

    def run() -> bytes:
        return attachlock.run(lambda *_: Reply(b"ran", b"", 0), "loopback", env_of("ADD"),
                              b"").stdout
    path = Path(attachlock.lock_path(env_of("ADD")))
    assert as_nobody(run) == b"ran" and not path.exists()
    held = attachlock.acquire(str(path), "", 5)  # root's, locked
    try:
        assert as_nobody(run) == b"ran"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        os.close(held.fd)
        path.unlink()
