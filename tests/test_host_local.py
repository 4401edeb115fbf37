"""host-local: config validation, allocation rules, the store on disk, DEL/CHECK/GC/STATUS.

host-local touches no network namespace, so these tests need no root: every store lives in
tmp_path. Most run the real executables (ours: bin/host-local; the reference:
/usr/lib/cni/host-local) as a runtime would; pure validation runs through skel.run, which is what
the executable calls, byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rootskips import missing, skip_unless

from cni import skel

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "bin" / "host-local"
GO = Path("/usr/lib/cni/host-local")
needs_go = skip_unless(os.access(GO, os.X_OK), f"the reference host-local {GO} "
                       "(scripts/setup.sh installs containernetworking-plugins)")


def conf(data_dir: Path | str, version: str = "1.0.0", name: str = "net1",
         **ipam: Any) -> dict[str, Any]:
    if "ranges" not in ipam and "subnet" not in ipam:
        ipam["subnet"] = "10.10.0.0/24"
    return {"cniVersion": version, "name": name,
            "ipam": {"type": "host-local", "dataDir": str(data_dir), **ipam}}


def env(command: str, cid: str = "ctr1", ifname: str = "eth0", cni_args: str = "",
        netns: str = "/var/run/netns/dummy") -> dict[str, str]:
    out = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_PATH": str(ROOT / "bin"),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if cni_args:
        out["CNI_ARGS"] = cni_args
    return out


def call(command: str, config: dict, **kw: Any) -> tuple[int, Any]:
    """In-process: skel.run, what bin/host-local runs."""
    reply = skel.run("host-local", env(command, **kw), json.dumps(config).encode())
    out = reply.stdout.decode()
    return reply.code, (json.loads(out) if out.strip() else None)


def execute(command: str, config: dict, exe: Path = OURS, **kw: Any) -> tuple[int, Any]:
    """A real process of `exe`, as a runtime execs it."""
    proc = subprocess.run([str(exe)], input=json.dumps(config).encode(), env=env(command, **kw),
                          capture_output=True, check=False)
    out = proc.stdout.decode()
    return proc.returncode, (json.loads(out) if out.strip() else None)


def ok(command: str, config: dict, exe: Path | None = None, **kw: Any) -> Any:
    code, out = execute(command, config, exe, **kw) if exe else call(command, config, **kw)
    assert code == 0, out
    return out


def fails(command: str, config: dict, code: int, *needles: str, **kw: Any) -> dict:
    got, out = call(command, config, **kw)
    assert got == 1 and out["code"] == code, out
    for needle in needles:
        assert needle in out["msg"], (needle, out)
    return out


def addresses(result: dict) -> list[str]:
    return [ip["address"] for ip in result["ips"]]


def store_files(data_dir: Path, net: str = "net1") -> dict[str, bytes]:
    d = data_dir / net
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.exists() else {}


def reservations(data_dir: Path, net: str = "net1") -> dict[str, bytes]:
    return {k: v for k, v in store_files(data_dir, net).items()
            if k != "lock" and not k.startswith("last_reserved_ip.")}


# --- validation: every rule, error 7 naming key and value, nothing written --------------------

@pytest.mark.parametrize("ipam, needles", [
    ({"subnet": "10.1.0.1/24"}, ["ipam.subnet", '"10.1.0.1/24"', "host bits", "10.1.0.0"]),
    ({"subnet": "10.1.0.0/31"}, ["ipam.subnet", '"10.1.0.0/31"', "too small"]),
    ({"subnet": "10.1.0.0/32"}, ["ipam.subnet", "too small"]),
    ({"subnet": "fd00::/127"}, ["ipam.subnet", '"fd00::/127"', "too small"]),
    ({"subnet": "nonsense/24"}, ["ipam.subnet", '"nonsense/24"', "not a CIDR"]),
    ({"subnet": "10.1.0.0"}, ["ipam.subnet", '"10.1.0.0"', "not a CIDR"]),
    ({"subnet": "10.1.0.0/24", "rangeStart": "10.2.0.5"},
     ["ipam.rangeStart", '"10.2.0.5"', "not in network 10.1.0.0/24"]),
    ({"subnet": "10.1.0.0/24", "rangeEnd": "10.1.1.0"},
     ["ipam.rangeEnd", '"10.1.1.0"', "not in network"]),
    ({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.50", "rangeEnd": "10.1.0.10"},
     ["ipam.rangeEnd", '"10.1.0.10"', "before rangeStart 10.1.0.50"]),
    ({"subnet": "10.1.0.0/24", "rangeStart": "banana"}, ["ipam.rangeStart", '"banana"']),
    ({"subnet": "10.1.0.0/24", "gateway": "fd00::1"}, ["ipam.gateway", '"fd00::1"']),
    ({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "fd00::/64"}]]},
     ["ipam.ranges.0.1.subnet", '"fd00::/64"', "mixed address families"]),
    ({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.1.0.0/16"}]]},
     ["ipam.ranges.0", "overlap"]),
    ({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.1.0.0/25"}]]},
     ["ipam.ranges.1", "range set 0 overlaps with 1"]),
    ({"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "10.1.0.128/25"}]]},
     ["ipam.ranges.0", "range set 0 overlaps with 1"]),
    ({"ranges": [[]]}, ["ipam.ranges.0", "empty range set"]),
    ({"ranges": [[{"rangeStart": "10.1.0.1"}]]}, ["ipam.ranges.0.0.subnet", "required"]),
    ({"ranges": [[{"subnet": 5}]]}, ["ipam.ranges.0.0.subnet", "5"]),
    ({"ranges": []}, ["ipam.ranges", "no IP ranges specified"]),
    ({"subnet": "10.1.0.0/24", "routes": [{"dst": "0.0.0.0"}]}, ["ipam.routes.0.dst"]),
    ({"subnet": "10.1.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]},
     ["ipam.routes.0.gw", '"x"']),
    ({"subnet": "10.1.0.0/24", "resolvConf": "/nonexistent/resolv.conf"},
     ["ipam.resolvConf", '"/nonexistent/resolv.conf"', "cannot read"]),
])
def test_invalid_config_is_error_7_naming_key_and_value(tmp_path, ipam, needles):
    config = conf(tmp_path, **ipam)
    fails("ADD", config, 7, *needles)
    assert not (tmp_path / "net1").exists()  # nothing written


def test_disjoint_ranges_in_one_subnet_do_not_overlap(tmp_path):
    ranges = [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20"}],
              [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.30", "rangeEnd": "10.1.0.40"}]]
    assert addresses(ok("ADD", conf(tmp_path, ranges=ranges))) == ["10.1.0.10/24", "10.1.0.30/24"]


def test_missing_ipam_key(tmp_path):
    fails("ADD", {"cniVersion": "1.0.0", "name": "n"}, 7, "missing 'ipam'")


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_0_2_0_allows_one_v4_and_one_v6_set(tmp_path, version):
    two_v4 = [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/24"}]]
    fails("ADD", conf(tmp_path, version, ranges=two_v4), 7, version,
          "more than 1 address per family")
    assert not (tmp_path / "net1").exists()
    dual = [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00::/64"}]]
    out = ok("ADD", conf(tmp_path, version, ranges=dual))
    assert out["ip4"]["ip"] == "10.1.0.2/24" and out["ip6"]["ip"] == "fd00::2/64"
    assert ok("ADD", conf(tmp_path, "0.3.0", ranges=two_v4), cid="c2")


@pytest.mark.parametrize("source, code, needle", [
    ({"cni_args": "IP=10.10.0.x"}, 4, "CNI_ARGS IP"),
    ({"cni_args": "FOO=bar"}, 4, 'unknown args ["FOO=bar"]'),
    ({"args": {"cni": {"ips": ["nope"]}}}, 7, "args.cni.ips.0"),
    ({"runtimeConfig": {"ips": ["1.2.3"]}}, 7, "runtimeConfig.ips.0"),
])
def test_invalid_requested_ip(tmp_path, source, code, needle):
    config = conf(tmp_path)
    kw = {}
    if "cni_args" in source:
        kw["cni_args"] = source["cni_args"]
    else:
        config.update(source)
    fails("ADD", config, code, needle, **kw)
    assert reservations(tmp_path) == {}


def test_unknown_cni_args_ignored_with_ignore_unknown(tmp_path):
    out = ok("ADD", conf(tmp_path), cni_args="IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.10.0.7")
    assert addresses(out) == ["10.10.0.7/24"]


def test_requested_ip_outside_every_range(tmp_path):
    fails("ADD", conf(tmp_path), 7, "failed to allocate all requested IPs: 10.99.0.5",
          cni_args="IP=10.99.0.5")
    assert reservations(tmp_path) == {}


def test_requested_gateway_refused(tmp_path):
    fails("ADD", conf(tmp_path, gateway="10.10.0.9"), 7,
          "requested ip 10.10.0.9 is subnet's gateway", cni_args="IP=10.10.0.9")
    assert reservations(tmp_path) == {}


def test_network_name_cannot_escape_data_dir(tmp_path):
    data = tmp_path / "data"
    for name in ("../escape", "/abs", "a/b", ".."):
        config = conf(data, name=name)
        fails("ADD", config, 7, "network name")
        # in-process callers (bridge) reach the plugin without skel's name check
        from cni.ipam import config as ipam_config
        with pytest.raises(skel.CNIError) as e:
            ipam_config.load(config, "1.0.0", [])
        assert e.value.code == 7 and name in e.value.msg
    assert not (tmp_path / "escape").exists() and not data.exists()


@pytest.mark.parametrize("cid", ["../../etc", "/abs", "a/b"])
def test_container_id_cannot_escape(tmp_path, cid):
    fails("ADD", conf(tmp_path), 4, "containerID", cid=cid)
    assert not (tmp_path / "net1").exists()
    from cni.plugins import host_local
    req = skel.Request(plugin="host-local", command="ADD", container_id=cid, netns="",
                       ifname="eth0", args=[], path=[], config=conf(tmp_path), version="1.0.0",
                       stdin=b"", env={})
    with pytest.raises(skel.CNIError):
        host_local.add(req)
    assert not (tmp_path / "net1").exists()


# --- allocation rules ------------------------------------------------------------------------

def test_v4_result_store_and_file_format(tmp_path):
    out = ok("ADD", conf(tmp_path, routes=[{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16",
                                                                    "gw": "10.10.0.254"}]),
             exe=OURS)
    assert out == {"cniVersion": "1.0.0",
                   "ips": [{"address": "10.10.0.2/24", "gateway": "10.10.0.1"}],
                   "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.10.0.254"}]}
    files = store_files(tmp_path)
    assert files["10.10.0.2"] == b"ctr1\r\neth0"
    assert files["last_reserved_ip.0"] == b"10.10.0.2"
    assert files["lock"] == b""
    for name in files:
        assert stat.S_IMODE((tmp_path / "net1" / name).stat().st_mode) & 0o077 == 0
    assert "interfaces" not in out


def test_v6_and_dual_stack(tmp_path):
    out = ok("ADD", conf(tmp_path, ranges=[[{"subnet": "fd00:1::/64"}]]))
    assert out["ips"] == [{"address": "fd00:1::2/64", "gateway": "fd00:1::1"}]
    dual = conf(tmp_path, name="dual", ranges=[[{"subnet": "10.20.0.0/24"}],
                                               [{"subnet": "fd00:2::/120"}]])
    out = ok("ADD", dual)
    assert addresses(out) == ["10.20.0.2/24", "fd00:2::2/120"]
    assert set(reservations(tmp_path, "dual")) == {"10.20.0.2", "fd00:2::2"}
    assert store_files(tmp_path, "dual")["last_reserved_ip.1"] == b"fd00:2::2"


def test_round_robin_from_last_reserved_and_wrap_skipping_gateway(tmp_path):
    config = conf(tmp_path, subnet="10.30.0.0/29")  # .1 gateway, .2-.6 usable
    got = [addresses(ok("ADD", config, cid=f"c{i}"))[0] for i in range(5)]
    assert got == [f"10.30.0.{i}/29" for i in range(2, 7)]
    fails("ADD", config, 999, "no IP addresses available", cid="c5")
    ok("DEL", config, cid="c1")  # frees .3; round-robin continues after .6 and wraps
    assert addresses(ok("ADD", config, cid="c6")) == ["10.30.0.3/29"]
    ok("DEL", config, cid="c0")
    ok("DEL", config, cid="c3")
    (tmp_path / "net1" / "last_reserved_ip.0").write_text("10.30.0.4")
    assert addresses(ok("ADD", config, cid="c7")) == ["10.30.0.5/29"]
    # after .5: .6 is taken, the end wraps to the start, .1 is the gateway, .2 is free
    assert addresses(ok("ADD", config, cid="c8")) == ["10.30.0.2/29"]


def test_round_robin_does_not_reuse_released_ip_at_once(tmp_path):
    config = conf(tmp_path, subnet="10.31.0.0/24")
    assert addresses(ok("ADD", config, cid="a")) == ["10.31.0.2/24"]
    ok("DEL", config, cid="a")
    assert addresses(ok("ADD", config, cid="b")) == ["10.31.0.3/24"]


def test_last_reserved_outside_the_set_starts_at_range_start(tmp_path):
    config = conf(tmp_path, subnet="10.32.0.0/24", rangeStart="10.32.0.100")
    (tmp_path / "net1").mkdir()
    (tmp_path / "net1" / "last_reserved_ip.0").write_text("192.168.0.7")
    assert addresses(ok("ADD", config)) == ["10.32.0.100/24"]


def test_last_reserved_written_over_and_truncated_only_when_shorter(tmp_path, monkeypatch):
    """Each ADD rewrites last_reserved_ip.N: over its content when the address is as long or
    longer (no O_TRUNC: ext4 frees the file's block and allocates another), truncated first
    when shorter; the file holds exactly the address every time."""
    from cni.ipam import store

    truncated: list[str] = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        if str(path).startswith(store.LAST_IP_PREFIX) and flags & os.O_TRUNC:
            truncated.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store.os, "open", spy)
    config = conf(tmp_path, subnet="10.32.0.0/24")
    last = tmp_path / "net1" / "last_reserved_ip.0"
    assert addresses(ok("ADD", config, cid="a")) == ["10.32.0.2/24"]  # made
    assert addresses(ok("ADD", config, cid="b")) == ["10.32.0.3/24"]  # as long
    assert last.read_bytes() == b"10.32.0.3"
    last.write_text("10.32.0.99")
    assert addresses(ok("ADD", config, cid="c")) == ["10.32.0.100/24"]  # longer
    assert last.read_bytes() == b"10.32.0.100"
    assert truncated == []
    last.write_text("10.32.0.254")  # the pool's end: wraps to .2, .3 taken, .4 (shorter)
    assert addresses(ok("ADD", config, cid="d")) == ["10.32.0.4/24"]
    assert last.read_bytes() == b"10.32.0.4"
    assert truncated == []  # ftruncate on the open fd, not O_TRUNC
    assert last.stat().st_size == len(b"10.32.0.4")


def test_range_start_on_gateway_skips_it_and_custom_gateway(tmp_path):
    config = conf(tmp_path, subnet="10.33.0.0/24", rangeStart="10.33.0.1", gateway="10.33.0.2")
    out = ok("ADD", config)
    assert out["ips"] == [{"address": "10.33.0.1/24", "gateway": "10.33.0.2"}]
    assert addresses(ok("ADD", config, cid="c2")) == ["10.33.0.3/24"]


def test_multiple_ranges_in_a_set_walked_in_order(tmp_path):
    ranges = [[{"subnet": "10.40.0.0/30"}, {"subnet": "10.41.0.0/30"}]]  # .2 usable in each
    config = conf(tmp_path, ranges=ranges)
    got = [addresses(ok("ADD", config, cid=f"c{i}"))[0] for i in range(2)]
    assert got == ["10.40.0.2/30", "10.41.0.2/30"]
    fails("ADD", config, 999, "no IP addresses available in range set: "
          "10.40.0.1-10.40.0.2,10.41.0.1-10.41.0.2", cid="c3")


def test_requested_ips_from_every_source(tmp_path):
    dual = [[{"subnet": "10.50.0.0/24"}], [{"subnet": "fd00:50::/64"}]]
    config = conf(tmp_path, ranges=dual)
    assert addresses(ok("ADD", config, cni_args="IP=10.50.0.9,fd00:50::9")) == [
        "10.50.0.9/24", "fd00:50::9/64"]
    config["args"] = {"cni": {"ips": ["10.50.0.10/24"]}}
    assert addresses(ok("ADD", config, cid="c2"))[0] == "10.50.0.10/24"
    del config["args"]
    config["runtimeConfig"] = {"ips": ["fd00:50::11"]}
    assert addresses(ok("ADD", config, cid="c3")) == ["10.50.0.11/24", "fd00:50::11/64"]


def test_requested_ip_taken_fails_and_releases_the_others(tmp_path):
    dual = [[{"subnet": "10.51.0.0/24"}], [{"subnet": "fd00:51::/64"}]]
    config = conf(tmp_path, ranges=dual)
    ok("ADD", config, cid="owner", cni_args="IP=fd00:51::5")
    before = reservations(tmp_path)
    fails("ADD", config, 999, "failed to allocate for range 1",
          "requested IP address fd00:51::5 is not available", cid="c2",
          cni_args="IP=fd00:51::5")
    assert reservations(tmp_path) == before  # the v4 address taken for c2 was released


def test_runtime_ip_ranges_come_first(tmp_path):
    config = conf(tmp_path, subnet="10.60.0.0/24")
    config["runtimeConfig"] = {"ipRanges": [[{"subnet": "10.61.0.0/24"}]]}
    assert addresses(ok("ADD", config)) == ["10.61.0.2/24", "10.60.0.2/24"]


def test_duplicate_attachment_refused_other_ifname_allowed(tmp_path):
    config = conf(tmp_path)
    ok("ADD", config)
    before = reservations(tmp_path)
    fails("ADD", config, 999, "10.10.0.2 has been allocated to ctr1",
          "duplicate allocation is not allowed")
    assert reservations(tmp_path) == before
    assert addresses(ok("ADD", config, ifname="net1")) == ["10.10.0.3/24"]


def test_duplicate_found_for_old_id_only_files(tmp_path):
    config = conf(tmp_path)
    (tmp_path / "net1").mkdir()
    (tmp_path / "net1" / "10.10.0.7").write_bytes(b"ctr1")
    fails("ADD", config, 999, "duplicate allocation")


def test_resolv_conf_parsed_like_the_reference(tmp_path):
    rc = tmp_path / "resolv.conf"
    rc.write_text("# comment\n; other\nnameserver 1.1.1.1\nnameserver fd00::53\ndomain ex.org\n"
                  "search a.org b.org\noptions ndots:2 edns0\nnameserver\n")
    out = ok("ADD", conf(tmp_path, resolvConf=str(rc)))
    assert out["dns"] == {"nameservers": ["1.1.1.1", "fd00::53"], "domain": "ex.org",
                          "search": ["a.org", "b.org"], "options": ["ndots:2", "edns0"]}


@needs_go
@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0", "1.0.0"])
def test_same_results_as_the_reference(tmp_path, version):
    ranges = [[{"subnet": "10.70.0.0/24", "rangeStart": "10.70.0.10"}],
              [{"subnet": "fd00:70::/64"}]]
    rc = tmp_path / "resolv.conf"
    rc.write_text("nameserver 9.9.9.9\nsearch x.org\n")
    for exe, data in ((OURS, tmp_path / "ours"), (GO, tmp_path / "go")):
        config = conf(data, version, ranges=ranges, resolvConf=str(rc),
                      routes=[{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:70::1"}])
        results = [ok("ADD", config, exe=exe, cid=f"c{i}") for i in range(3)]
        if exe == OURS:
            ours, ours_files = results, store_files(data)
        else:
            assert results == ours
            assert store_files(data) == ours_files


# --- DEL -------------------------------------------------------------------------------------

def test_del_releases_by_attachment_and_is_idempotent(tmp_path):
    config = conf(tmp_path)
    ok("ADD", config, ifname="eth0")
    ok("ADD", config, ifname="eth1")
    ok("ADD", config, cid="other")
    ok("DEL", config, ifname="eth0", netns="")
    assert reservations(tmp_path) == {"10.10.0.3": b"ctr1\r\neth1", "10.10.0.4": b"other\r\neth0"}
    ok("DEL", config, ifname="eth0", netns="")
    ok("DEL", config, cid="never-seen")
    assert len(reservations(tmp_path)) == 2
    assert "last_reserved_ip.0" in store_files(tmp_path) and "lock" in store_files(tmp_path)


def test_del_accepts_old_id_only_files_only_when_no_new_match(tmp_path):
    config = conf(tmp_path)
    d = tmp_path / "net1"
    d.mkdir()
    (d / "10.10.0.50").write_bytes(b"old")
    (d / "10.10.0.51").write_bytes(b"old\n")
    ok("DEL", config, cid="old")
    assert reservations(tmp_path) == {}


def test_del_without_netns_env(tmp_path):
    config = conf(tmp_path)
    ok("ADD", config)
    e = env("DEL")
    del e["CNI_NETNS"]
    proc = subprocess.run([str(OURS)], input=json.dumps(config).encode(), env=e,
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stdout
    assert reservations(tmp_path) == {}


@needs_go
def test_interop_go_reserves_ours_releases_and_vice_versa(tmp_path):
    config = conf(tmp_path, ranges=[[{"subnet": "10.80.0.0/24"}], [{"subnet": "fd00:80::/64"}]])
    ok("ADD", config, exe=GO, cid="by-go")
    ok("ADD", config, exe=OURS, cid="by-us")
    assert reservations(tmp_path) == {
        "10.80.0.2": b"by-go\r\neth0", "fd00:80::2": b"by-go\r\neth0",
        "10.80.0.3": b"by-us\r\neth0", "fd00:80::3": b"by-us\r\neth0"}
    # each sees the other's reservation as a duplicate
    assert execute("ADD", config, exe=OURS, cid="by-go")[0] == 1
    assert execute("ADD", config, exe=GO, cid="by-us")[0] == 1
    ok("CHECK", config, exe=OURS, cid="by-go")
    ok("CHECK", config, exe=GO, cid="by-us")
    ok("DEL", config, exe=OURS, cid="by-go")
    ok("DEL", config, exe=GO, cid="by-us")
    assert reservations(tmp_path) == {}


# --- CHECK -----------------------------------------------------------------------------------

def test_check(tmp_path):
    config = conf(tmp_path)
    result = ok("ADD", config)
    ok("CHECK", config)
    fails("CHECK", config, 999, "Failed to find address added by container other", cid="other")
    config["prevResult"] = result
    ok("CHECK", config)
    (tmp_path / "net1" / "10.10.0.2").unlink()
    (tmp_path / "net1" / "10.10.0.9").write_bytes(b"ctr1\r\neth0")
    fails("CHECK", config, 999, "10.10.0.2", "not reserved")


# --- GC and STATUS (1.1.0) -------------------------------------------------------------------

def test_gc_leaves_exactly_the_valid_attachments(tmp_path):
    config = conf(tmp_path, "1.1.0", subnet="10.90.0.0/22")
    attachments = [(f"c{i}", "eth0" if i % 3 else "net1") for i in range(30)]
    for cid, ifname in attachments:
        ok("ADD", config, cid=cid, ifname=ifname)
    (tmp_path / "net1" / "10.90.3.200").write_bytes(b"c1")  # old id-only file, c1 valid
    (tmp_path / "net1" / "10.90.3.201").write_bytes(b"c2")  # old id-only file, c2 not valid
    valid = attachments[::3][:7] + [("c1", "eth0")]
    gc_conf = dict(config)
    gc_conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": i} for c, i in valid]
    ok("GC", gc_conf)
    left = reservations(tmp_path)
    held = {tuple(v.decode().split("\r\n")) for v in left.values()}
    assert held == set(valid) | {("c1",)}
    assert len(left) == len(valid) + 1
    assert {"lock", "last_reserved_ip.0"} <= set(store_files(tmp_path))
    # the legacy key works too; an empty list releases everything
    gc_conf = dict(config)
    gc_conf["cni.dev/attachments"] = []
    ok("GC", gc_conf)
    assert reservations(tmp_path) == {}
    assert {"lock", "last_reserved_ip.0"} <= set(store_files(tmp_path))


def test_gc_without_the_valid_list_releases_nothing_and_succeeds(tmp_path):
    """libcni's GC without args (cnitool gc) sends no list: the reference succeeds. Releasing
    on a missing list is how addresses vanish under live pods, so nothing is released."""
    config = conf(tmp_path, "1.1.0")
    ok("ADD", config, cid="c1")
    before = reservations(tmp_path)
    reply = skel.run("host-local", env("GC"), json.dumps(config).encode())
    assert reply.code == 0 and reply.stdout == b"", reply
    assert b"no reservation released" in reply.stderr
    assert reservations(tmp_path) == before and len(before) == 1


def test_gc_refuses_old_versions(tmp_path):
    fails("GC", conf(tmp_path, "1.0.0") | {"cni.dev/valid-attachments": []}, 1, "GC")


def test_status(tmp_path):
    ok("STATUS", conf(tmp_path, "1.1.0"))
    assert not [n for n in store_files(tmp_path) if n.startswith(".status")]
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = fails("STATUS", conf(blocker / "sub", "1.1.0"), 50, "store unusable", str(blocker))
    assert "Not a directory" in out["msg"]


def test_status_read_only_store(tmp_path):
    """Root writes through file modes: the store is a read-only mount, made in a mount namespace
    of the plugin process alone (unshare), so the machine's mounts are never touched."""
    ro = tmp_path / "ro"
    ro.mkdir()
    config = conf(ro, "1.1.0")
    if os.geteuid() != 0:
        ro.chmod(0o555)
        fails("STATUS", config, 50, "store unusable", str(ro))
        return
    if not shutil.which("unshare"):
        missing("unshare (util-linux: scripts/setup.sh installs it)")
    script = f'mount -t tmpfs -o ro pycni-ro "{ro}" && exec "{OURS}"'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          input=json.dumps(config).encode(), env=env("STATUS"),
                          capture_output=True, check=False)
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["code"] == 50, out
    assert str(ro) in out["msg"] and "Read-only file system" in out["msg"]
    ok("STATUS", config)  # the same directory, writable outside that namespace


# --- symlinks planted in the store -----------------------------------------------------------

def test_network_dir_symlink_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "net1").symlink_to(target)
    fails("ADD", conf(data), 5, "symlink")
    assert list(target.iterdir()) == []


def test_planted_symlinks_never_followed(tmp_path):
    config = conf(tmp_path, subnet="10.95.0.0/29")
    d = tmp_path / "net1"
    d.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"ctr1\r\neth0")
    (d / "10.95.0.2").symlink_to(victim)        # looks like ours if followed
    (d / "last_reserved_ip.0").symlink_to(tmp_path / "lri-target")
    out = ok("ADD", config)                      # .2 is "taken" by the symlink, not read
    assert addresses(out) == ["10.95.0.3/29"]
    assert not (tmp_path / "lri-target").exists()
    assert not (d / "last_reserved_ip.0").is_symlink()
    ok("DEL", config)
    assert victim.read_bytes() == b"ctr1\r\neth0" and (d / "10.95.0.2").is_symlink()
    gc_conf = conf(tmp_path, "1.1.0", subnet="10.95.0.0/29") | {"cni.dev/valid-attachments": []}
    ok("GC", gc_conf)
    assert victim.exists() and (d / "10.95.0.2").is_symlink()


def test_lock_symlink_refused(tmp_path):
    d = tmp_path / "net1"
    d.mkdir()
    (d / "lock").symlink_to(tmp_path / "lock-target")
    fails("ADD", conf(tmp_path), 5, "lock")
    assert not (tmp_path / "lock-target").exists()
