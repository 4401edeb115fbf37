"""netns.iproute()'s sockets: pyroute2 IPRoutes made in the namespace they serve, one per
namespace per request, and a spare's kept socket for its own namespace (keep_home_socket)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent

KEPT = """
import fcntl, os, sys
from cni.host import links, netns
from cni.host.nsfd import setns

host, pod = sys.argv[1], sys.argv[2]
fd = os.open(host, os.O_RDONLY)
setns(fd)  # this process "is" a spare forked in the host namespace
netns.keep_home_socket()
kept = netns._kept[1]

def ns_of(ipr):  # SIOCGSKNS: the namespace the socket lives in
    nsfd = fcntl.ioctl(ipr.fileno(), 0x894C)
    try:
        return os.fstat(nsfd).st_ino
    finally:
        os.close(nsfd)

with netns.shared_sockets():
    with netns.iproute() as a, netns.iproute(host) as b, netns.iproute(pod) as c:
        assert a is kept and b is kept, "the kept socket serves its own namespace"
        assert c is not kept and ns_of(c) == os.stat(pod).st_ino
        assert links.get(a, "lo") is not None and links.get(c, "lo") is not None
assert kept.fileno() >= 0 and links.get(kept, "lo") is not None, "kept across requests"
print("ok")
"""


def _script_says_ok(script: str, *args: str) -> None:
    """Run `script` in a fresh interpreter (a process of its own, as a spare is) and require
    that it printed ok and nothing else."""
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok"]


def test_a_kept_socket_serves_its_namespace_and_outlives_the_request(host, pod) -> None:
    _script_says_ok(KEPT, host.path, pod.path)


def test_sockets_live_in_the_namespace_they_are_asked_for(host, pod) -> None:
    from cni.host import links, netns

    host.run("ip", "link", "add", "nsx0", "type", "veth", "peer", "name", "nsx1")
    with netns.shared_sockets(), netns.iproute(host.path) as a, \
            netns.iproute(host.path) as b, netns.iproute(pod.path) as c:
        assert a is b and a is not c  # one per namespace per request
        assert links.get(a, "nsx0") is not None
        assert links.get(c, "nsx0") is None


KEPT_NFT = """
import os, sys
import pyroute2
from cni.host import nftrecord
from cni.host.nsfd import setns

host, pod, handle = sys.argv[1], sys.argv[2], int(sys.argv[3])
setns(os.open(host, os.O_RDONLY))  # a spare forked in the host namespace
nftrecord.keep_home_sockets()
made = []
real = pyroute2.NFTSocket
pyroute2.NFTSocket = lambda **kw: made.append(kw) or real(**kw)
for _ in range(2):  # request after request
    assert nftrecord.comments("inet", "pycni_kept", [("c", handle), ("c", handle + 50)]) \\
        == ["kept rule", None]
assert nftrecord.comments("inet", "pycni_none", [("c", 1)]) == [None]
assert made == [], "the kept sockets serve their namespace"
setns(os.open(pod, os.O_RDONLY))  # a request whose namespace is another: a socket of its own
assert nftrecord.comments("inet", "pycni_kept", [("c", handle)]) == [None]
assert len(made) == 1
print("ok")
"""


def test_kept_nft_sockets_answer_in_their_namespace_only(host, pod) -> None:
    host.run("nft", 'add table inet pycni_kept; add chain inet pycni_kept c; '
             'add rule inet pycni_kept c continue comment "kept rule"')
    listed = host.run("nft", "-a", "list", "chain", "inet", "pycni_kept", "c").stdout
    handle = next(int(line.split("# handle ")[1]) for line in listed.splitlines()
                  if "kept rule" in line)
    _script_says_ok(KEPT_NFT, host.path, pod.path, str(handle))


ONE_SEND = """
import os, sys
from cni.host import nftrecord
from cni.host.nsfd import setns

host, handle = sys.argv[1], int(sys.argv[2])
setns(os.open(host, os.O_RDONLY))
nftrecord.keep_home_sockets()
kept = nftrecord._kept[1]["inet"].asyncore
sends = []
real = kept.send
kept.send = lambda data, flags=0: sends.append(len(data)) or real(data, flags)
asked = [("c", handle), ("c", handle + 50), ("nochain", handle), ("c", handle)]
assert nftrecord.comments("inet", "pycni_one", asked) == ["one", None, None, "one"]
assert len(sends) == 1, f"one send for the rules a verb asks about, not {len(sends)}"
assert nftrecord.comments("inet", "pycni_one", []) == [] and len(sends) == 1
print("ok")
"""


def test_the_rules_a_verb_asks_about_go_in_one_send(host) -> None:
    """A CHECK asks the kernel for each recorded rule (a hostPort's three, a dual-stack pod's
    masquerade rules): one send, one turn of the socket's loop, not one per rule."""
    host.run("nft", 'add table inet pycni_one; add chain inet pycni_one c; '
             'add rule inet pycni_one c continue comment "one"')
    listed = host.run("nft", "-a", "list", "chain", "inet", "pycni_one", "c").stdout
    handle = next(int(line.split("# handle ")[1]) for line in listed.splitlines()
                  if '"one"' in line)
    _script_says_ok(ONE_SEND, host.path, str(handle))


KEPT_LOOP = """
import os, sys, threading
from cni.host import links, netns
from cni.host.nsfd import setns

host, pod = sys.argv[1], sys.argv[2]
setns(os.open(host, os.O_RDONLY))  # a spare forked in the host namespace
netns.keep_home_socket()  # and its event loop, before it records its fds
loop = netns._loop[2]
kept = netns._kept[1]
fds = sorted(os.listdir("/proc/self/fd"))
for _ in range(50):  # request after request, each with a socket in the pod's namespace
    with netns.shared_sockets(), netns.iproute(pod) as ipr:
        assert ipr is not kept and ipr.asyncore.event_loop is loop
        assert links.set_loopback(pod, True) and links.loopback_is_up(pod)
assert sorted(os.listdir("/proc/self/fd")) == fds, "each socket closed with its request"
# nothing grows on the loop: the self-pipe's and the kept socket's readers, at most the last
# closed transport's callback, no task
assert len(loop._selector.get_map()) == 2 and len(loop._ready) <= 1
import asyncio
assert not asyncio.all_tasks(loop)
assert links.get(kept, "lo") is not None

def elsewhere(out):
    with netns.iproute(pod) as ipr:
        out.append(ipr.asyncore.event_loop is not loop and links.get(ipr, "lo") is not None)

done = []
thread = threading.Thread(target=elsewhere, args=(done,))
thread.start()
thread.join()
assert done == [True], "another thread makes its own loop"
pid = os.fork()
if pid == 0:  # a forked child shares the loop's epoll and self-pipe: it must not use them
    ok = []
    elsewhere(ok)
    os._exit(0 if ok == [True] else 1)
assert os.waitpid(pid, 0)[1] == 0, "a forked child makes its own loop"
print("ok")
"""


def test_a_kept_event_loop_serves_request_after_request_and_keeps_nothing(host, pod) -> None:
    _script_says_ok(KEPT_LOOP, host.path, pod.path)
