"""cni.api's sysctl helpers, as docs/PLUGINS.md describes them: the key forms, the value and
return types, and a key the pod's namespace does not have (a missing interface) as CNI error 7
naming it, not a bare FileNotFoundError (which skel turned into 999 and a traceback)."""

from __future__ import annotations

import json
import types

import pytest
from cnitest import Netns

from cni import api, skel

pytestmark = pytest.mark.root


@pytest.fixture
def dotted(pod: Netns) -> Netns:
    """The pod with an interface whose name has a dot."""
    pod.run("ip", "link", "add", "eth0.100", "type", "veth", "peer", "name", "peer0")
    return pod


def test_key_forms_values_and_return_type(dotted: Netns) -> None:
    with api.netns_entered(dotted.path):
        api.sysctl_write("net/ipv4/conf/eth0.100/accept_local", 1)  # an int: str(value)
        for key in ("net.ipv4.conf.lo.accept_local", "net/ipv4/conf/lo/accept_local",
                    "/proc/sys/net/ipv4/conf/lo/accept_local"):
            assert api.sysctl_read(key) == "0"
        assert api.sysctl_read("net/ipv4/conf/eth0.100/accept_local") == "1"
        api.sysctl_write("net.ipv4.ip_local_port_range", "20000 30000")
        assert api.sysctl_read("net.ipv4.ip_local_port_range") == "20000\t30000"
        with pytest.raises(OSError) as bad:  # the kernel refuses the value: EINVAL
            api.sysctl_write("net.ipv4.conf.lo.accept_local", "x")
        assert not isinstance(bad.value, api.CNIError)
    assert dotted.run("cat", "/proc/sys/net/ipv4/conf/eth0.100/accept_local").stdout == "1\n"


def test_a_missing_interface_is_error_7_naming_the_key(dotted: Netns) -> None:
    with api.netns_entered(dotted.path):
        for call in (lambda k: api.sysctl_read(k), lambda k: api.sysctl_write(k, "1")):
            # eth9 is not there; a dotted key splits eth0.100 into two components
            for key in ("net.ipv4.conf.eth9.accept_local", "net.ipv4.conf.eth0.100.accept_local"):
                with pytest.raises(api.CNIError) as e:
                    call(key)
                assert e.value.code == api.Code.INVALID_CONFIG and repr(key) in e.value.msg
                assert isinstance(e.value, FileNotFoundError)  # what API 1.0 raised


def test_through_skel_a_plugin_gets_the_error_json_and_no_traceback(
        dotted: Netns, monkeypatch: pytest.MonkeyPatch) -> None:
    def add(req: api.Request) -> api.Result:
        with api.netns_entered(req.netns_target):
            api.sysctl_write("net.ipv4.conf.IFNAME.accept_local".replace("IFNAME", req.ifname),
                             "1")
        return req.prev_result

    monkeypatch.setitem(skel._loaded, "sysctl-test", types.SimpleNamespace(add=add))
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": dotted.path,
           "CNI_IFNAME": "eth9", "CNI_PATH": "/nonexistent"}
    conf = {"cniVersion": "1.0.0", "name": "t", "type": "sysctl-test",
            "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth9"}]}}
    reply = skel.run("sysctl-test", env, json.dumps(conf).encode())
    out = json.loads(reply.stdout)
    assert reply.code == 1 and out["code"] == 7, out
    assert "net.ipv4.conf.eth9.accept_local" in out["msg"] and "no such key" in out["msg"]
    assert b"Traceback" not in reply.stderr
