"""tuning through the exec'd binary, on a veth in a throwaway pod namespace: each setting
applied and read back from the kernel, CHECK catching drift, DEL restoring the originals from the
backup file, bad input refused with nothing changed, and the backup file shared with the
reference's binary (Debian's v1.1.1 in /usr/lib/cni) in both directions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cnitest import REFERENCE_BIN, REFERENCE_PLUGINS, Netns, Plugins, destroy_netns
from libcni_util import Daemon, Libcni, container_id, host_leftovers, leftovers, module_daemon
from rootskips import skip_unless

pytestmark = pytest.mark.root

ORIG_MAC = "02:00:00:00:00:01"
NEW_MAC = "02:aa:bb:cc:dd:ee"
NOBODY = ("setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups")
ARP_NOTIFY = "/proc/sys/net/ipv4/conf/eth0/arp_notify"
PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
reference = skip_unless((REFERENCE_BIN / "tuning").exists(), REFERENCE_PLUGINS)


@pytest.fixture
def eth0(pod: Netns) -> Netns:
    """The pod with an eth0 (a veth whose peer stays in the pod) of known settings."""
    pod.run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
    pod.run("ip", "link", "set", "eth0", "address", ORIG_MAC, "mtu", "1500", "txqueuelen",
            "1000")
    return pod


def prev(pod: Netns, version: str = "1.0.0") -> dict[str, Any]:
    return {"cniVersion": version,
            "interfaces": [{"name": "eth0", "mac": ORIG_MAC, "sandbox": pod.path}],
            "ips": [{"interface": 0, "address": "10.9.0.2/24", "gateway": "10.9.0.1"}]}


def conf(pod: Netns, data: Path, version: str = "1.0.0", **keys: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "tune", "type": "tuning", "dataDir": str(data),
            **keys, "prevResult": prev(pod, version)}


def state(pod: Netns) -> dict[str, Any]:
    link = pod.links()["eth0"]
    return {"mac": link["address"], "mtu": link["mtu"], "txqlen": link.get("txqlen", 0),
            "promisc": "PROMISC" in link["flags"], "allmulti": "ALLMULTI" in link["flags"],
            "arp_notify": read(pod, ARP_NOTIFY), "port_range": read(pod, PORT_RANGE)}


def read(ns: Netns, path: str) -> str:
    return ns.run("cat", path).stdout.strip()


ORIGINAL = {"mac": ORIG_MAC, "mtu": 1500, "txqlen": 1000, "promisc": False, "allmulti": False}

# key: value -> (what `state` shows after ADD, the backup file's text the ADD writes)
SETTINGS = {
    "mac": (NEW_MAC, {"mac": NEW_MAC}, f'{{\n "mac": "{ORIG_MAC}"\n}}'),
    "mtu": (1400, {"mtu": 1400}, '{\n "mtu": 1500\n}'),
    "promisc": (True, {"promisc": True}, '{\n "promisc": false\n}'),
    "allmulti": (True, {"allmulti": True}, '{\n "allmulti": false\n}'),
    "txQLen": (77, {"txqlen": 77}, '{\n "txQLen": 1000\n}'),
}


@pytest.mark.parametrize("key", list(SETTINGS))
def test_each_setting_applied_backed_up_and_restored_by_del(plugins: Plugins, eth0: Netns,
                                                            tmp_path: Path, key: str) -> None:
    value, shown, backup = SETTINGS[key]
    cfg = conf(eth0, tmp_path, **{key: value})
    before = state(eth0)
    out = plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    assert state(eth0) == before | shown
    # The reference's file, byte for byte: <dataDir>/<containerID>_<ifname>.json.
    assert (tmp_path / "ctr1_eth0.json").read_text() == backup
    assert out["interfaces"][0]["mac"] == (NEW_MAC if key == "mac" else ORIG_MAC)
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path)
    assert state(eth0) == before
    assert list(tmp_path.iterdir()) == []
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path)  # idempotent


def test_all_settings_together_and_the_file_in_the_reference_order(plugins: Plugins,
                                                                   eth0: Netns,
                                                                   tmp_path: Path) -> None:
    cfg = conf(eth0, tmp_path, txQLen=0, allmulti=True, mtu=9000, promisc=True, mac=NEW_MAC)
    plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    assert {k: v for k, v in state(eth0).items() if k in ORIGINAL} == {
        "mac": NEW_MAC, "mtu": 9000, "txqlen": 0, "promisc": True, "allmulti": True}
    assert (tmp_path / "ctr1_eth0.json").read_text() == (
        f'{{\n "mac": "{ORIG_MAC}",\n "promisc": false,\n "mtu": 1500,\n'
        ' "allmulti": false,\n "txQLen": 1000\n}')
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path)
    assert {k: v for k, v in state(eth0).items() if k in ORIGINAL} == ORIGINAL


def test_sysctls_are_written_in_the_pod_namespace_and_not_restored(plugins: Plugins,
                                                                   eth0: Netns, host: Netns,
                                                                   tmp_path: Path) -> None:
    host_range = read(host, PORT_RANGE)
    cfg = conf(eth0, tmp_path, sysctl={"net.ipv4.conf.IFNAME.arp_notify": "1",
                                       "net.ipv4.ip_local_port_range": "20000 30000",
                                       "net/ipv4/conf/all/log_martians": "1"})
    out = plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    assert out["interfaces"][0]["mac"] == ORIG_MAC  # prevResult passed on
    assert read(eth0, ARP_NOTIFY) == "1"
    assert read(eth0, PORT_RANGE).split() == ["20000", "30000"]
    assert read(eth0, "/proc/sys/net/ipv4/conf/all/log_martians") == "1"
    assert read(host, PORT_RANGE) == host_range  # the node's namespace untouched
    assert list(tmp_path.iterdir()) == []  # no link setting: no backup (as the reference)
    # The kernel prints "20000\t30000": CHECK compares words (the reference fails here).
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path)
    assert read(eth0, ARP_NOTIFY) == "1"  # sysctls stay, as the reference's DEL leaves them


DRIFT = [
    ({"mac": NEW_MAC}, ("ip", "link", "set", "eth0", "address", "02:00:00:00:00:09"), "mac"),
    ({"mtu": 1400}, ("ip", "link", "set", "eth0", "mtu", "1300"), "mtu"),
    ({"promisc": True}, ("ip", "link", "set", "eth0", "promisc", "off"), "promisc"),
    ({"promisc": False}, ("ip", "link", "set", "eth0", "promisc", "on"), "promisc"),
    ({"allmulti": True}, ("ip", "link", "set", "eth0", "allmulticast", "off"), "allmulti"),
    ({"allmulti": False}, ("ip", "link", "set", "eth0", "allmulticast", "on"), "allmulti"),
    ({"txQLen": 50}, ("ip", "link", "set", "eth0", "txqueuelen", "51"), "txQLen"),
    ({"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1"}},
     ("sh", "-c", f"echo 0 > {ARP_NOTIFY}"), ARP_NOTIFY),
    ({"mtu": 1400}, ("ip", "link", "del", "eth0"), "Cannot find container link eth0"),
]


@pytest.mark.parametrize("keys,drift,named", DRIFT, ids=[" ".join(d[1][3:5]) + str(d[0])
                                                         for d in DRIFT])
def test_check_catches_drift(plugins: Plugins, eth0: Netns, tmp_path: Path,
                             keys: dict, drift: tuple, named: str) -> None:
    cfg = conf(eth0, tmp_path, **keys)
    plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)
    eth0.run(*drift)
    code, out, _ = plugins.exec("tuning", "CHECK", cfg, netns=eth0.path)
    assert code == 1 and out["code"] == 999 and named in out["msg"], out


def test_where_the_mac_comes_from(plugins: Plugins, eth0: Netns, tmp_path: Path) -> None:
    """config < CNI_ARGS MAC < runtimeConfig.mac < args.cni.mac, as the reference's parseConf."""
    macs = ["02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c", "02:00:00:00:00:0d"]
    full = conf(eth0, tmp_path, mac=macs[0], runtimeConfig={"mac": macs[2]},
                args={"cni": {"mac": macs[3]}})
    cases = [(full, macs[3]), ({k: v for k, v in full.items() if k != "args"}, macs[2]),
             ({k: v for k, v in full.items() if k not in ("args", "runtimeConfig")}, macs[1])]
    for cfg, want in cases:
        out = plugins.ok("tuning", "ADD", cfg, netns=eth0.path,
                         cni_args=f"IgnoreUnknown=1;K8S_POD_NAME=p;MAC={macs[1]}")
        assert state(eth0)["mac"] == want and out["interfaces"][0]["mac"] == want
        plugins.ok("tuning", "DEL", cfg, netns=eth0.path)
        assert state(eth0)["mac"] == ORIG_MAC


def test_args_cni_overrides_and_merges(plugins: Plugins, eth0: Netns, tmp_path: Path) -> None:
    cfg = conf(eth0, tmp_path, mtu=1400, promisc=True, sysctl={
        "net.ipv4.conf.IFNAME.arp_notify": "1"}, args={"cni": {
            "mtu": 1300, "promisc": False, "txQLen": 10, "allmulti": True,
            "sysctl": {"net.ipv4.ip_local_port_range": "20000 30000"}, "ips": ["10.9.0.2"]}})
    plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    got = state(eth0)
    assert (got["mtu"], got["promisc"], got["txqlen"], got["allmulti"]) == (1300, False, 10, True)
    assert got["arp_notify"] == "1" and got["port_range"].split() == ["20000", "30000"]
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)


def test_keys_are_matched_however_cased(plugins: Plugins, eth0: Netns, tmp_path: Path) -> None:
    cfg = conf(eth0, tmp_path, MTU=1400, TxQlen=20, Mac=NEW_MAC)
    plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    assert (state(eth0)["mtu"], state(eth0)["txqlen"], state(eth0)["mac"]) == (1400, 20, NEW_MAC)


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0", "1.1.0"])
def test_result_is_prev_result_with_the_new_mac(plugins: Plugins, eth0: Netns, tmp_path: Path,
                                                version: str) -> None:
    cfg = conf(eth0, tmp_path, version, mac=NEW_MAC.upper())
    if version == "0.2.0":
        cfg["prevResult"] = {"cniVersion": "0.2.0", "ip4": {"ip": "10.9.0.2/24"}}
    out = plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
    assert out["cniVersion"] == version
    if version == "0.2.0":
        assert out["ip4"] == {"ip": "10.9.0.2/24"}
    else:  # written in upper case, reported as the kernel has it
        assert out["interfaces"] == [{"name": "eth0", "mac": NEW_MAC, "sandbox": eth0.path}]
    assert state(eth0)["mac"] == NEW_MAC
    if version >= "0.4.0":  # CHECK exists from 0.4.0 on
        plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)


# ---- bad input: refused, named, nothing changed ----------------------------------------------

ARP = "net.ipv4.conf.IFNAME.arp_notify"
BAD = [
    ({"mtu": "1500"}, "", 7, 'mtu: "1500"'),
    ({"mtu": -1}, "", 7, "mtu: -1"),
    ({"mtu": 1.5}, "", 7, "mtu: 1.5"),
    ({"txQLen": -1}, "", 7, "txQLen: -1"),
    ({"txQLen": 2**32}, "", 7, f"txQLen: {2**32}"),
    ({"txQLen": "5"}, "", 7, 'txQLen: "5"'),
    ({"promisc": "yes"}, "", 7, 'promisc: "yes"'),
    ({"allmulti": 1}, "", 7, "allmulti: 1"),
    ({"mac": 5}, "", 7, "mac: 5"),
    ({"mac": "zz"}, "", 7, 'mac "zz"'),
    ({"mac": "01:00:5e:00:00:01"}, "", 7, 'mac "01:00:5e:00:00:01"'),
    ({"mac": "00:00:00:00:00:00"}, "", 7, 'mac "00:00:00:00:00:00"'),
    ({"mac": "02:00:00:00:00:00:00:01"}, "", 7, '"02:00:00:00:00:00:00:01"'),
    ({"runtimeConfig": {"mac": 5}}, "", 7, "runtimeConfig.mac 5"),
    ({"runtimeConfig": {"mac": "nope"}}, "", 7, 'runtimeConfig.mac "nope"'),
    ({"args": {"cni": {"mtu": "x"}}}, "", 7, 'args.cni.mtu: "x"'),
    ({"args": {"cni": {"sysctl": {ARP: 1}}}}, "", 7, "args.cni.sysctl"),
    ({}, "MAC=zz", 7, 'CNI_ARGS MAC "zz"'),
    ({}, "FOO=1", 4, "FOO=1"),
    ({"dataDir": "relative/dir", "mtu": 1400}, "", 7, 'dataDir "relative/dir"'),
    ({"dataDir": 5}, "", 7, "dataDir: 5"),
    ({"sysctl": "x"}, "", 7, 'sysctl: "x"'),
    ({"sysctl": {ARP: 1}}, "", 7, f"sysctl.{ARP}: 1"),
    ({"sysctl": {"kernel.hostname": "x"}}, "", 7, 'sysctl.kernel.hostname "x"'),
    ({"sysctl": {"..kernel.hostname": "x"}}, "", 7, '"x": not a network sysctl'),
    ({"sysctl": {"/proc/sys/../../etc/passwd": "x"}}, "", 7, "not a network sysctl"),
    ({"sysctl": {"vm.swappiness": "1"}}, "", 7, "vm.swappiness"),
    # refused by the kernel after a first sysctl (and in the last two, the mac and promisc)
    # were written: all put back
    ({"sysctl": {ARP: "1", "net.ipv4.no_such_key": "1"}, "mac": NEW_MAC}, "", 7,
     'sysctl net.ipv4.no_such_key "1"'),
    ({"sysctl": {ARP: "1", "net.ipv4.conf.IFNAME.rp_filter": "x"}}, "", 7,
     'sysctl net.ipv4.conf.IFNAME.rp_filter "x"'),
    ({"sysctl": {ARP: "1"}, "mac": NEW_MAC, "promisc": True, "mtu": 70000}, "", 7,
     "mtu 70000: the kernel refused it"),
    ({"sysctl": {ARP: "1"}, "mac": NEW_MAC, "mtu": 20}, "", 7, "mtu 20"),
]


@pytest.mark.parametrize("keys,cni_args,code,named", BAD,
                         ids=[json.dumps(b[0] or b[1])[:50] for b in BAD])
def test_bad_input_is_refused_and_changes_nothing(plugins: Plugins, eth0: Netns, tmp_path: Path,
                                                  keys: dict, cni_args: str, code: int,
                                                  named: str) -> None:
    data = tmp_path / "data"
    before = state(eth0)
    code_, out, err = plugins.exec("tuning", "ADD", conf(eth0, data, **keys), netns=eth0.path,
                                   cni_args=cni_args)
    assert code_ == 1 and out["code"] == code and named in out["msg"], (out, err)
    assert "Traceback" not in err
    assert state(eth0) == before
    assert not data.exists() or list(data.iterdir()) == []
    # DEL after the refused ADD succeeds whatever the config says.
    plugins.ok("tuning", "DEL", conf(eth0, data, **keys), netns=eth0.path, cni_args=cni_args)


def test_duplicated_sysctl_keys_are_refused(plugins: Plugins, eth0: Netns,
                                            tmp_path: Path) -> None:
    body = json.dumps(conf(eth0, tmp_path, sysctl={ARP: "1"}))
    body = body.replace(f'"{ARP}": "1"', f'"{ARP}": "1", "{ARP}": "0"')
    code, out, _ = plugins.exec("tuning", "ADD", body, netns=eth0.path)
    assert code == 1 and out["code"] == 7 and "duplicated" in out["msg"] and ARP in out["msg"]
    assert read(eth0, ARP_NOTIFY) == "0"


def test_add_into_a_missing_netns_is_refused_even_with_nothing_to_do(plugins: Plugins,
                                                                      tmp_path: Path,
                                                                      eth0: Netns) -> None:
    code, out, _ = plugins.exec("tuning", "ADD", conf(eth0, tmp_path), netns="/run/netns/nope")
    assert code == 1 and out["code"] == 4 and "CNI_NETNS" in out["msg"]
    assert not os.path.exists("/run/netns/nope")


def test_missing_prev_result_and_missing_link(plugins: Plugins, eth0: Netns,
                                              tmp_path: Path) -> None:
    cfg = conf(eth0, tmp_path, mtu=1400)
    del cfg["prevResult"]
    code, out, _ = plugins.exec("tuning", "ADD", cfg, netns=eth0.path)
    assert code == 1 and out["code"] == 7 and "prevResult" in out["msg"]
    code, out, _ = plugins.exec("tuning", "ADD", conf(eth0, tmp_path, mtu=1400,
                                                      sysctl={ARP: "1"}),
                                netns=eth0.path, ifname="eth9")
    assert code == 1 and "eth9" in out["msg"]
    assert read(eth0, ARP_NOTIFY) == "0" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["owned by nobody", "writable by all", "a symlink"])
def test_a_data_dir_others_can_write_is_refused(plugins: Plugins, eth0: Netns, how: str) -> None:
    """Root writes the backup there: a directory another user controls could redirect the write
    (a planted symlink) or feed DEL the values to set."""
    victim = Path(tempfile.mkdtemp(prefix="pycni-tuning-victim-"))
    (victim / "file").write_text("root's\n")
    base = Path(tempfile.mkdtemp(prefix="pycni-tuning-"))
    base.chmod(0o755)
    try:
        data = base / "data"
        if how == "owned by nobody":
            base.chmod(0o1777)
            subprocess.run([*NOBODY, "mkdir", str(data)], check=True)
            subprocess.run([*NOBODY, "ln", "-s", str(victim / "file"),
                            str(data / "ctr1_eth0.json")], check=True)
        elif how == "writable by all":
            data.mkdir()
            data.chmod(0o777)
        else:
            data.symlink_to(victim)
            victim.chmod(0o777)
        before = state(eth0)
        code, out, _ = plugins.exec("tuning", "ADD", conf(eth0, data, mtu=1400),
                                    netns=eth0.path)
        assert code == 1 and out["code"] == 7 and f'dataDir "{data}"' in out["msg"], out
        assert state(eth0) == before
        assert (victim / "file").read_text() == "root's\n"
        assert sorted(os.listdir(victim)) == ["file"]
    finally:
        shutil.rmtree(base)
        shutil.rmtree(victim)


@pytest.mark.parametrize("how", ["parent owned by nobody", "symlink in a parent"])
def test_every_component_of_the_data_dir_is_walked(plugins: Plugins, eth0: Netns,
                                                   how: str) -> None:
    """Not only dataDir's last component: a parent another user owns could have its entries
    renamed or linked to move where root writes and unlinks; a symlink anywhere is not
    followed."""
    base = Path(tempfile.mkdtemp(prefix="pycni-tuning-"))
    base.chmod(0o755)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    try:
        if how == "parent owned by nobody":
            base.chmod(0o1777)
            evil = base / "evil"
            subprocess.run([*NOBODY, "mkdir", "-m", "0755", str(evil)], check=True)
            data = evil / "sub" / "data"
            named = [str(evil), "nobody"]
        else:  # root's own dirs, but a link in the path: it points where someone chose
            evil = base / "link"
            evil.symlink_to(elsewhere)
            data = evil / "data"
            named = [str(evil), "symlink"]
        before = state(eth0)
        code, out, _ = plugins.exec("tuning", "ADD", conf(eth0, data, mtu=1400),
                                    netns=eth0.path)
        assert code == 1 and out["code"] == 7 and f'dataDir "{data}"' in out["msg"], out
        assert all(word in out["msg"] for word in named), out
        assert state(eth0) == before
        assert os.listdir(elsewhere) == []
        if how == "parent owned by nobody":
            assert os.listdir(evil) == []  # nothing made under it
    finally:
        shutil.rmtree(base)


def test_missing_data_dir_components_are_made_0700_whatever_the_umask(
        plugins: Plugins, eth0: Netns, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    data = tmp_path / "a" / "b" / "data"
    old = os.umask(0)  # the plugin's exec inherits it
    try:
        plugins.ok("tuning", "ADD", conf(eth0, data, mtu=1400), netns=eth0.path)
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", data):
        assert oct(made.stat().st_mode & 0o7777) == "0o700", made
    assert os.listdir(data) == ["ctr1_eth0.json"]
    assert oct((data / "ctr1_eth0.json").stat().st_mode & 0o777) == "0o600"
    plugins.ok("tuning", "DEL", conf(eth0, data, mtu=1400), netns=eth0.path)
    assert os.listdir(data) == [] and state(eth0)["mtu"] == 1500


def test_allowlist_limits_the_sysctls_add_takes(eth0: Netns, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """/etc/cni/tuning/allowlist.conf (here a file of the test's: the plugin run in-process)."""
    from cni import skel
    from cni.plugins import tuning_allowlist

    allow = tmp_path / "allowlist.conf"
    allow.write_text("^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]*$\n\n  ^net\\.ipv4\\.ip_forward$ \n")
    monkeypatch.setattr(tuning_allowlist, "ALLOWLIST", str(allow))
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": eth0.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    data = tmp_path / "data"
    bad = conf(eth0, data, sysctl={ARP: "1", "net.ipv4.conf.all.log_martians": "1"})
    reply = skel.run("tuning", env, json.dumps(bad).encode())
    out = json.loads(reply.stdout)
    assert reply.code == 1 and out["code"] == 7, out
    assert "Sysctl net.ipv4.conf.all.log_martians is not allowed" in out["msg"]
    assert str(allow) in out["details"]
    assert read(eth0, ARP_NOTIFY) == "0"
    good = conf(eth0, data, sysctl={ARP: "1", "net.ipv4.ip_forward": "1"})
    assert skel.run("tuning", env, json.dumps(good).encode()).code == 0
    assert read(eth0, ARP_NOTIFY) == "1"
    # CHECK does not read the allowlist (as the reference): a config it would refuse checks.
    allow.write_text("^nothing$\n")
    check = skel.run("tuning", env | {"CNI_COMMAND": "CHECK"}, json.dumps(good).encode())
    assert check.code == 0, check
    # A list others could write is not trusted: ADD refuses rather than take what it says.
    allow.write_text(".*\n")
    allow.chmod(0o666)
    again = conf(eth0, data, sysctl={ARP: "0"})
    reply = skel.run("tuning", env | {"CNI_CONTAINERID": "ctr2"}, json.dumps(again).encode())
    assert reply.code == 1 and "writable by others" in json.loads(reply.stdout)["msg"]
    assert read(eth0, ARP_NOTIFY) == "1"


# ---- DEL -------------------------------------------------------------------------------------


def test_del_restores_with_a_config_add_would_refuse(plugins: Plugins, eth0: Netns,
                                                     tmp_path: Path) -> None:
    plugins.ok("tuning", "ADD", conf(eth0, tmp_path, mtu=1400, mac=NEW_MAC), netns=eth0.path)
    junk = conf(eth0, tmp_path, mtu="x", mac=5, sysctl=[1], args={"cni": "x"},
                runtimeConfig={"mac": []})
    plugins.ok("tuning", "DEL", junk, netns=eth0.path, cni_args="UNKNOWN=1")
    assert (state(eth0)["mtu"], state(eth0)["mac"]) == (1500, ORIG_MAC)
    assert list(tmp_path.iterdir()) == []


def test_del_removes_the_backup_of_a_pod_that_is_gone(plugins: Plugins, eth0: Netns,
                                                      host: Netns, tmp_path: Path) -> None:
    """The reference's DEL keeps the file forever once the namespace or link is gone (or
    CNI_NETNS is empty)."""
    cfg = conf(eth0, tmp_path, mtu=1400)
    for cid in ("ctr1", "ctr2", "ctr3"):
        plugins.ok("tuning", "ADD", cfg, netns=eth0.path, container_id=cid)
    plugins.ok("tuning", "DEL", cfg, netns="", container_id="ctr3")  # ctr's DEL, task gone
    eth0.run("ip", "link", "del", "eth0")
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path, container_id="ctr2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctr1_eth0.json"]
    path = eth0.path
    destroy_netns(eth0, host)
    plugins.ok("tuning", "DEL", cfg, netns=path)
    assert list(tmp_path.iterdir()) == []


def test_del_with_an_undecodable_backup_removes_it(plugins: Plugins, eth0: Netns,
                                                   tmp_path: Path) -> None:
    (tmp_path / "ctr1_eth0.json").write_text("{not json")
    plugins.ok("tuning", "DEL", conf(eth0, tmp_path), netns=eth0.path)
    assert list(tmp_path.iterdir()) == [] and state(eth0)["mtu"] == 1500


def test_a_repeated_add_that_fails_leaves_the_first_backup(plugins: Plugins, eth0: Netns,
                                                           tmp_path: Path) -> None:
    plugins.ok("tuning", "ADD", conf(eth0, tmp_path, mtu=1400), netns=eth0.path)
    first = (tmp_path / "ctr1_eth0.json").read_text()
    code, _, _ = plugins.exec("tuning", "ADD", conf(eth0, tmp_path, mtu=70000), netns=eth0.path)
    assert code == 1 and (tmp_path / "ctr1_eth0.json").read_text() == first
    assert state(eth0)["mtu"] == 1400
    plugins.ok("tuning", "DEL", conf(eth0, tmp_path), netns=eth0.path)
    assert state(eth0)["mtu"] == 1500


# ---- promisc: the interface's flag, not the kernel's count of holders ------------------------


def test_check_promisc_false_ignores_a_packet_socket_holding_promiscuity(
        plugins: Plugins, eth0: Netns, tmp_path: Path) -> None:
    """A capture (tcpdump) in the pod makes the kernel's promiscuity count 1 while the flag a
    user sets stays off. v1.9.1 reads the count (its netlink's IFLA_PROMISCUITY), so its CHECK of
    promisc false fails there and its backup would record promisc on; ours reads the flag, as
    the 1.1.1 oracle's netlink did (checked here too)."""
    holder = subprocess.Popen(
        ["ip", "netns", "exec", eth0.name, "python3", "-c", PROMISC_HOLDER],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert eth0.links()["eth0"]["promiscuity"] == 1
        cfg = conf(eth0, tmp_path, mtu=1400)
        plugins.ok("tuning", "ADD", cfg, netns=eth0.path)
        assert '"promisc"' not in (tmp_path / "ctr1_eth0.json").read_text()
        plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)
        plugins.ok("tuning", "DEL", cfg, netns=eth0.path)
        if (REFERENCE_BIN / "tuning").exists():
            plugins.ok("tuning", "ADD", cfg, netns=eth0.path, bin_dir=REFERENCE_BIN)
            code, _, _ = plugins.exec("tuning", "CHECK", cfg, netns=eth0.path,
                                      bin_dir=REFERENCE_BIN)
            assert code == 0  # 1.1.1 reads the flag, as ours
    finally:
        holder.kill()
        holder.wait()


PROMISC_HOLDER = """
import socket, struct, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.bind(("eth0", 0))
# PACKET_ADD_MEMBERSHIP (1), PACKET_MR_PROMISC (1): struct packet_mreq
s.setsockopt(263, 1, struct.pack("iHH8s", socket.if_nametoindex("eth0"), 1, 0, b""))
print("holding", flush=True)
time.sleep(60)
"""


# ---- swapping with the reference binary ------------------------------------------------------


@reference
@pytest.mark.parametrize("adder,deleter", [("ref", "ours"), ("ours", "ref")])
def test_swap_add_by_one_side_check_and_del_by_the_other(plugins: Plugins, eth0: Netns,
                                                         tmp_path: Path, adder: str,
                                                         deleter: str) -> None:
    """The reference v1.1.1 knows no txQLen: the swap covers mac, mtu, promisc, allmulti."""
    bins = {"ref": REFERENCE_BIN, "ours": plugins.bin_dir}
    # 1.1.1's CHECK does not substitute IFNAME (its ADD does): the key names eth0 here.
    cfg = conf(eth0, tmp_path, mac=NEW_MAC, mtu=1400, promisc=True, allmulti=True,
               sysctl={"net.ipv4.conf.eth0.arp_notify": "1"})
    before = state(eth0)
    plugins.ok("tuning", "ADD", cfg, netns=eth0.path, bin_dir=bins[adder])
    assert state(eth0) == before | {"mac": NEW_MAC, "mtu": 1400, "promisc": True,
                                    "allmulti": True, "arp_notify": "1"}
    assert (tmp_path / "ctr1_eth0.json").read_text() == (
        f'{{\n "mac": "{ORIG_MAC}",\n "promisc": false,\n "mtu": 1500,\n "allmulti": false\n}}')
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path, bin_dir=bins[deleter])
    plugins.ok("tuning", "DEL", cfg, netns=eth0.path, bin_dir=bins[deleter])
    assert state(eth0) == before | {"arp_notify": "1"}
    assert list(tmp_path.iterdir()) == []


@reference
def test_reference_differences_mac_case_and_a_gone_pod(plugins: Plugins, eth0: Netns,
                                                       host: Netns, tmp_path: Path) -> None:
    """The reference reports the MAC as written and its CHECK then fails on an upper-case one;
    its DEL of a pod whose namespace is gone keeps the backup file. Ours: canonical MAC, CHECK
    passes, the file goes."""
    cfg = conf(eth0, tmp_path, mac=NEW_MAC.upper())
    ref = plugins.ok("tuning", "ADD", cfg, netns=eth0.path, bin_dir=REFERENCE_BIN)
    assert ref["interfaces"][0]["mac"] == NEW_MAC.upper()
    code, _, _ = plugins.exec("tuning", "CHECK", cfg, netns=eth0.path, bin_dir=REFERENCE_BIN)
    assert code == 1
    plugins.ok("tuning", "CHECK", cfg, netns=eth0.path)
    ours = plugins.ok("tuning", "ADD", cfg, netns=eth0.path, container_id="ctr2")
    assert ours["interfaces"][0]["mac"] == NEW_MAC
    path = eth0.path
    destroy_netns(eth0, host)
    plugins.ok("tuning", "DEL", cfg, netns=path, bin_dir=REFERENCE_BIN)
    plugins.ok("tuning", "DEL", cfg, netns=path, container_id="ctr2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctr1_eth0.json"]  # the reference's


# ---- the chain through libcni (the reference cnitool) ----------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    yield from module_daemon()


def test_bridge_then_tuning_through_cnitool(host: Netns, pod: Netns, daemon: Daemon,
                                            tmp_path: Path) -> None:
    """runtimeConfig.mac through the `mac` capability, mtu and a per-interface sysctl on the
    bridge's veth; the cached result carries the new MAC, CHECK of the whole chain passes, DEL
    restores then the bridge removes the veth: nothing left, no backup file."""
    data = tmp_path / "tuning"
    libcni = Libcni(host, daemon, tmp_path / "libcni")
    network = libcni.write({"cniVersion": "1.1.0", "name": "tune-chain", "plugins": [
        {"type": "bridge", "bridge": "cni-tune0", "isGateway": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.86.0.0/24"}]]}},
        {"type": "tuning", "capabilities": {"mac": True}, "dataDir": str(data), "mtu": 1400,
         "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}]})
    result = json.loads(libcni.ok("add", network, pod, cap_args={"mac": NEW_MAC.upper()}))
    eth0 = next(i for i in result["interfaces"] if i["name"] == "eth0")
    assert eth0["mac"] == NEW_MAC and eth0["sandbox"] == pod.path
    link = pod.links()["eth0"]
    assert (link["address"], link["mtu"]) == (NEW_MAC, 1400)
    assert read(pod, "/proc/sys/net/ipv4/conf/eth0/rp_filter") == "2"
    assert json.loads((data / f"{container_id(pod)}_eth0.json").read_text())["mtu"] == 1500
    pod.run("ping", "-c1", "-W2", "10.86.0.1")
    libcni.ok("check", network, pod, cap_args={"mac": NEW_MAC.upper()})
    libcni.ok("del", network, pod, cap_args={"mac": NEW_MAC.upper()})
    assert leftovers(host, pod, network) == [] and host_leftovers(host) == []
    assert list(data.iterdir()) == []
