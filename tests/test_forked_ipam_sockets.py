"""A nested entry-point IPAM runs in a child forked from its main plugin's process
(delegate.run_forked), in the daemon a spare: the child must make netlink sockets and nftables
contexts of its own. The spare's (its kept host socket and NFTSockets, its kept libnftables
context, the request's shared sockets, a pod socket it carries) are the same kernel sockets in
both processes after a fork: an IPAM that sent on one and was killed before it read the answer
would leave its replies on a socket the spare reads again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cnitest import BIN
from plugin_dists import fake_dists_fixture  # noqa: F401 - the fixture

from cni import skel
from cni.host import links, netns, nft, nftrecord

# The IPAM: what its netns.iproute() and its nftables context are, written to a file (it runs
# in a forked child): the socket's inode, the context's object id (the inherited one is kept
# alive, so a new object cannot take its id).
SOCKET_IPAM = '''
import json, os
from cni.host import netns, nft


def add(req):
    with netns.iproute() as ipr:
        sock = os.fstat(ipr.fileno()).st_ino
    with open(os.environ["PYCNI_TEST_SEEN"], "w") as f:
        json.dump({"socket": sock, "nft": id(nft._nft())}, f)
    return {"cniVersion": req.version, "ips": [{"address": "198.51.100.9/24"}]}


def check(req):
    return None


def delete(req):
    return None
'''
# The main plugin: its request's one socket per namespace (as bridge's), the IPAM called
# inside that block.
MAIN = '''
import json, os
from cni.api import get_key, ipam_add
from cni.host import netns


def add(req):
    with netns.shared_sockets():
        with netns.iproute() as ipr:
            sock = os.fstat(ipr.fileno()).st_ino
        with open(os.environ["PYCNI_TEST_MAIN"], "w") as f:
            json.dump({"socket": sock}, f)
        return ipam_add(req, get_key(req.config, "ipam")["type"])


def check(req):
    return None


def delete(req):
    return None
'''


@pytest.fixture
def spare_like(monkeypatch):
    """This process's kept host socket, NFTSockets and libnftables context, as a spare's
    warm-up makes them (preload.keep_home_sockets), forgotten afterwards."""
    for module, name in ((netns, "_kept"), (netns, "_carried"), (nftrecord, "_kept"),
                         (nft, "_home"), (nft, "_ctx")):
        monkeypatch.setattr(module, name, {} if name == "_ctx" else None)
    sock = netns.new_socket()
    monkeypatch.setattr(netns, "_kept", (netns.ns_key(), sock))
    nft.keep_home_context()
    yield sock
    sock.close()


@pytest.mark.parametrize("kept", [True, False], ids=["kept socket", "request's socket"])
def test_a_forked_ipam_makes_sockets_of_its_own(fake_dists, spare_like, monkeypatch,
                                                tmp_path: Path, kept: bool) -> None:
    if not kept:  # the main plugin's request socket for this namespace, shared in its block
        monkeypatch.setattr(netns, "_kept", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "socket-ipam").symlink_to(BIN / "cni-plugin")
    fake_dists("sk", {"socket-ipam": "socket_mod", "main": "main_mod"},
               {"socket_mod": SOCKET_IPAM, "main_mod": MAIN})
    seen, main = tmp_path / "seen.json", tmp_path / "main.json"
    monkeypatch.setenv("PYCNI_TEST_SEEN", str(seen))
    monkeypatch.setenv("PYCNI_TEST_MAIN", str(main))
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir)}
    conf = json.dumps({"cniVersion": "1.0.0", "name": "net", "type": "main",
                       "ipam": {"type": "socket-ipam"}}).encode()
    reply = skel.run("main", env, conf)
    assert reply.code == 0, reply
    child, parent = json.loads(seen.read_text()), json.loads(main.read_text())
    if kept:
        assert parent["socket"] == os.fstat(spare_like.fileno()).st_ino
    assert child["socket"] != parent["socket"]  # the IPAM's own socket, not the spare's
    assert child["nft"] != id(nft._home[1])  # and its own libnftables context
    # the spare's socket still answers here (the child closed nothing of the parent's)
    assert links.get(spare_like, "lo") is not None
