"""What cni.api promises a plugin of one's own beyond names (issue 47, item 6): a prevResult
handed on by value, sysctls confined to the network namespace, and an ADD whose result the
config's version cannot carry leaving nothing made. Each plugin here is a third-party module
declared by a distribution in a site dir (plugin_dists.fake_dists), checked and imported by the
loader as a real package's, and run by skel.run in-process in a pod namespace the test made."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cnitest import ROOT, VENV_PY, Netns
from plugin_dists import fake_dists_fixture  # noqa: F401 - the fixture

from cni import skel

pytestmark = pytest.mark.root

# Makes a link (a bridge) named CNI_IFNAME in the pod and returns a result without IP addresses
# (what 0.1.0/0.2.0 cannot carry); "checkFirst" in the config: it checks that up front.
DUMMY = '''
from cni.api import delete_link, iproute, netns_entered, require_printable

DELETED = []

def add(req):
    result = {"cniVersion": req.version, "interfaces": [{"name": req.ifname}]}
    if req.config.get("checkFirst"):
        require_printable(result, req.version)
    with netns_entered(req.netns_target), iproute() as ipr:
        ipr.link("add", ifname=req.ifname, kind="bridge")
    return result

def check(req):
    return None

def delete(req):
    DELETED.append(req.command)
    with netns_entered(req.netns_target), iproute() as ipr:
        delete_link(ipr, req.ifname)
'''
# A chained plugin handing on an equal copy of the prevResult (not the object it got).
COPIER = '''
import copy

def add(req):
    return copy.deepcopy(req.prev_result)

def check(req):
    return None

def delete(req):
    return None
'''


@pytest.fixture
def third_party(fake_dists) -> Iterator[None]:
    """The two plugins, declared by a distribution in a site dir of the test's (as pip leaves
    it), so the loader checks and imports them as it would a real package's."""
    fake_dists("contract", {"dummyer": "dummy_mod", "copier": "copier_mod"},
               {"dummy_mod": DUMMY, "copier_mod": COPIER})
    yield


def run(plugin: str, pod: Netns, conf: dict) -> tuple[int, dict]:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "dummy0", "CNI_PATH": "/nonexistent"}
    reply = skel.run(plugin, env, json.dumps(conf).encode())
    return reply.code, json.loads(reply.stdout)


def test_an_add_the_configs_version_cannot_carry_leaves_nothing(third_party, pod) -> None:
    """At 0.2.0 a result is IP addresses only: the plugin's ADD made a link and returned none.
    skel answers the reference's error and has the plugin's DEL undo it (before: the link
    stayed); a plugin that checks up front (require_printable) makes nothing at all."""
    conf = {"cniVersion": "0.2.0", "name": "n", "type": "dummyer"}
    code, out = run("dummyer", pod, conf)
    assert code == 1 and (out["code"], out["msg"]) == (999, "cannot convert: no valid IP addresses")
    assert set(pod.links()) == {"lo"}
    assert sys.modules["dummy_mod"].DELETED == ["DEL"]
    code, out = run("dummyer", pod, conf | {"checkFirst": True})
    assert code == 1 and out["msg"] == "cannot convert: no valid IP addresses"
    assert set(pod.links()) == {"lo"} and sys.modules["dummy_mod"].DELETED == ["DEL"]
    code, out = run("dummyer", pod, conf | {"cniVersion": "1.0.0"})  # 1.0.0 carries it
    assert code == 0 and out["interfaces"] == [{"name": "dummy0"}]
    assert pod.links()["dummy0"]["linkinfo"]["info_kind"] == "bridge"


def test_an_equal_copy_of_the_prev_result_is_handed_on_as_it_came(third_party, pod) -> None:
    """A 0.2.0 prevResult without IP addresses prints as it came when handed on unchanged;
    before, only the very object did, and an equal copy was 'cannot convert'."""
    prev = {"cniVersion": "0.2.0", "dns": {"nameservers": ["192.0.2.53"]}}
    conf = {"cniVersion": "0.2.0", "name": "n", "type": "copier", "prevResult": prev}
    code, out = run("copier", pod, conf)
    assert code == 0, out
    assert out == {"cniVersion": "0.2.0", "dns": {"nameservers": ["192.0.2.53"]}}


# sysctl_write / sysctl_read as a plugin calls them, in a process with its own UTS and network
# namespaces: a kernel.* key written there changes only that throwaway UTS namespace.
SYSCTL = """
import json, socket, sys
from cni import api
out = {}
for key in sys.argv[1:]:
    try:
        api.sysctl_write(key, "pycni-evil" if "hostname" in key else "1")
        out[key] = ["written", api.sysctl_read(key)]
    except Exception as e:
        out[key] = [type(e).__name__, str(e), isinstance(e, api.HostError)]
out["hostname"] = socket.gethostname()
print(json.dumps(out))
"""


def test_sysctls_are_the_network_namespaces_only() -> None:
    keys = ["net.ipv4.conf.lo.forwarding", "net/ipv6/conf/lo/forwarding", "kernel.hostname",
            "kernel/hostname", "net/../kernel/hostname", "net", "vm.swappiness"]
    ran = subprocess.run(["unshare", "--uts", "--net", str(VENV_PY), "-c", SYSCTL, *keys],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out.pop("hostname") != "pycni-evil"
    assert out.pop("net.ipv4.conf.lo.forwarding") == ["written", "1"]
    assert out.pop("net/ipv6/conf/lo/forwarding") == ["written", "1"]
    for key, (kind, msg, host_error) in out.items():
        assert kind == "KeyRefused" and host_error, (key, msg)
        assert msg == (f"sysctl {key!r}: only net.* keys, which the kernel keeps per network "
                       "namespace, may be read or written")
