"""tuning's sysctl allowlist read as the reference reads it: each line a Go regexp (RE2), tried
with MatchString (unanchored). The oracle is Go itself: a stdlib program built here runs
regexp.MatchString on every (line, key) pair and our verdicts must be its verdicts, errors with
Go's text. Then the plugin end to end: ADD admits what Go's regexp admits and refuses with the
reference's messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cnitest import Netns
from test_daemon import start_daemon  # noqa: F401 (a fixture)

from cni.plugins import tuning_allowlist
from cni.plugins.tuning_allowlist import PatternError

GO_ORACLE = """\
package main

import (
	"encoding/json"
	"os"
	"regexp"
)

type verdict struct {
	Match bool    `json:"match"`
	Err   *string `json:"err"`
}

func main() {
	var pairs [][2]string
	if err := json.NewDecoder(os.Stdin).Decode(&pairs); err != nil {
		panic(err)
	}
	out := []verdict{}
	for _, p := range pairs {
		m, err := regexp.MatchString(p[0], p[1])
		v := verdict{Match: m}
		if err != nil {
			s := err.Error()
			v.Err = &s
		}
		out = append(out, v)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}
"""

KEYS = ["net.ipv4.conf.eth0.rp_filter", "net.ipv4.conf.IFNAME.arp_notify",
        "net/ipv6/conf/eth0.100/accept_ra", "net.core.somaxconn", "NET.IPV4.IP_FORWARD"]

# Lines whose verdict Python's re and Go's regexp disagree on, lines both refuse, and lines both
# take. Left out: `(?<name>...)` and `(?<!...)`, whose verdict changed between Go versions (Go
# 1.22 took named groups in that form; the reference is built with a later Go than this test's).
LINES = [
    r"^net\.ipv4\.conf\.[[:alnum:]]+\.rp_filter$", r"rp_filter\z", r"^net\.core\.\w+\z",
    r"(?=rp)", r"(?!x)", r"(?P<x>rp)_filter", r"\Crp", r"[\C]", r"\Q\C\E", r"a**", "(", "a)",
    "x{2000}", r"\8", r"\1", "[a", "\\", r"\Z", r"\G", r"\e", r"\N{x}", r"(?#c)", r"(?i)ip_FORWARD",
    r"(?i:IPV4)", r"\v", r"\pL+\.\pN", r"\p{Greek}", r"[[:foo:]]", r"[z-a]", r"\Qnet.ipv4\E",
    r"(?U)n+", r"\b\w+\b", r"a{,3}", r"x*?+", r"(?s).", r"(?P<>a)", r"(?P<x>a)(?P<x>b)",
    r"\x{110000}", r"(?m)^net", r"a++", r"\Anet", r"[\d-z]", r"x{2}{3}", "eth0|", r"\.100/",
    r"^net/ipv6/conf/[^/]+/accept_ra$", r"^net\.ipv4\.conf\.IFNAME\.", r"IP_FORWARD$",
]


@pytest.fixture(scope="module")
def go_verdicts(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    go = shutil.which("go")
    assert go, "go (golang-go, scripts/setup.sh) is this test's oracle"
    src = tmp_path_factory.mktemp("oracle") / "main.go"
    src.write_text(GO_ORACLE)
    exe = src.with_name("oracle")
    env = dict(os.environ)
    if not any(env.get(k) for k in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(src.with_name("gocache"))  # go build needs a cache somewhere
    subprocess.run([go, "build", "-o", str(exe), str(src)], check=True, cwd=src.parent,
                   capture_output=True, timeout=600, env=env)
    pairs = [[line, key] for line in LINES for key in KEYS]
    out = subprocess.run([str(exe)], input=json.dumps(pairs), capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return [dict(v, line=p[0], key=p[1]) for p, v in zip(pairs, json.loads(out), strict=True)]


def test_each_line_matches_as_go_regexp_matches_it(go_verdicts: list[dict]) -> None:
    wrong = []
    for v in go_verdicts:
        try:
            ours = {"match": tuning_allowlist.match_string(v["line"].encode(), v["key"]),
                    "err": None}
        except PatternError as e:
            ours = {"match": False, "err": str(e)}
        if ours != {"match": v["match"], "err": v["err"]}:
            wrong.append((v["line"], v["key"], "go:", v["match"], v["err"], "ours:", ours))
    assert not wrong, "\n".join(map(repr, wrong))
    # the oracle is not trivial: it takes some lines, refuses others, matches some keys
    assert any(v["match"] for v in go_verdicts) and any(v["err"] for v in go_verdicts)
    assert any(not v["match"] and not v["err"] for v in go_verdicts)


@pytest.fixture
def eth0(pod: Netns) -> Netns:
    pod.run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
    return pod


def _add(eth0: Netns, tmp_path: Path, sysctl: dict[str, str], cid: str = "ctr1") -> dict:
    from cni import skel

    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": eth0.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    conf = {"cniVersion": "1.0.0", "name": "t", "type": "tuning", "sysctl": sysctl,
            "dataDir": str(tmp_path / "data"),
            "prevResult": {"cniVersion": "1.0.0",
                           "interfaces": [{"name": "eth0", "sandbox": eth0.path}]}}
    reply = skel.run("tuning", env, json.dumps(conf).encode())
    return {"code": reply.code, **(json.loads(reply.stdout) if reply.code else {})}


@pytest.mark.root
def test_add_admits_and_refuses_as_the_reference(eth0: Netns, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    allow = tmp_path / "allowlist.conf"
    monkeypatch.setattr(tuning_allowlist, "ALLOWLIST", str(allow))
    rp = "/proc/sys/net/ipv4/conf/eth0/rp_filter"
    # a POSIX class and \z: Go takes both (Python's re took neither as meant)
    allow.write_text("^net\\.ipv4\\.conf\\.[[:alnum:]]+\\.rp_filter\\z\n")
    assert _add(eth0, tmp_path, {"net.ipv4.conf.eth0.rp_filter": "2"})["code"] == 0
    assert eth0.run("cat", rp).stdout.strip() == "2"
    # a key no line matches: the reference's message, the list as Go's %+v prints it
    allow.write_text("^net\\.core\\.somaxconn$\n  \n"
                     "^net\\.ipv4\\.conf\\.[[:alnum:]]+\\.rp_filter\\z\n")
    out = _add(eth0, tmp_path, {"net.ipv4.conf.eth0.rp_filter": "1",
                                "net.ipv4.conf.eth0.arp_notify": "1"}, "ctr2")
    assert out["code"] == 7 and out["msg"] == (
        "Sysctl net.ipv4.conf.eth0.arp_notify is not allowed. Only the following sysctls are "
        "allowed: [^net\\.core\\.somaxconn$ ^net\\.ipv4\\.conf\\.[[:alnum:]]+\\.rp_filter\\z]"), out
    assert eth0.run("cat", rp).stdout.strip() == "2"  # nothing written
    # a line RE2 refuses (a lookahead), reached before any line matches: Go's compile error
    allow.write_text("(?=x)\n^net\\.core\\.somaxconn$\n")
    out = _add(eth0, tmp_path, {"net.core.somaxconn": "512"}, "ctr3")
    assert out["code"] == 7, out
    assert out["msg"] == "error parsing regexp: invalid or unsupported Perl syntax: `(?=`", out
    # ... and, as MatchString runs line by line, never reached after a line that matched
    allow.write_text("^net\\.core\\.somaxconn$\n(?=x)\n")
    assert _add(eth0, tmp_path, {"net.core.somaxconn": "512"}, "ctr4")["code"] == 0
    assert eth0.run("cat", "/proc/sys/net/core/somaxconn").stdout.strip() == "512"


@pytest.mark.root
@pytest.mark.skipif(not os.path.isdir("/etc/cni"), reason="no /etc/cni to mount over")
def test_through_the_daemon_the_callers_allowlist_and_the_spare_comes_back(
        host: Netns, eth0: Netns, start_daemon, tmp_path: Path) -> None:  # noqa: F811
    """The executable as a runtime runs it, through the daemon: the allowlist at its real path
    as the caller's mount namespace has it (a tmpfs over /etc/cni in the caller's own mount
    namespace), read by the spare that entered it; RE2 imported before the fork, so the
    request imports nothing and the spare serves again (a spare whose request imported a
    module exits, and the next request pays for a fork and a warm-up)."""
    from cnitest import BIN
    from test_daemon import wait_for
    from test_spare_reuse import NOT_BACK

    daemon = start_daemon(host, "--spares", "1", "--max-spares", "1")
    wait_for(lambda: len(daemon.named("pycni-spare")) == 1, "the spare")
    spare = daemon.named("pycni-spare")
    daemon.wait_warm(spare)
    rp = "/proc/sys/net/ipv4/conf/eth0/rp_filter"
    line = "^net\\.ipv4\\.conf\\.[[:alnum:]]+\\.rp_filter\\z"
    caller = ("mount -t tmpfs -o mode=0755 pycni-test /etc/cni && mkdir /etc/cni/tuning && "
              'printf "%s\\n" "$1" > /etc/cni/tuning/allowlist.conf && '
              'exec ip netns exec "$2" "$3"')

    def add(cid: str, sysctl: dict[str, str]) -> tuple[int, dict]:
        conf = {"cniVersion": "1.0.0", "name": "t", "type": "tuning", "sysctl": sysctl,
                "dataDir": str(tmp_path / "data"),
                "prevResult": {"cniVersion": "1.0.0",
                               "interfaces": [{"name": "eth0", "sandbox": eth0.path}]}}
        env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
               "CNI_NETNS": eth0.path, "CNI_IFNAME": "eth0", "CNI_PATH": str(BIN),
               **daemon.env}
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               caller, "sh", line, host.name, str(BIN / "tuning")],
                              input=json.dumps(conf).encode(), env=env, capture_output=True)
        return proc.returncode, json.loads(proc.stdout or b"{}")

    code, out = add("ctr1", {"net.ipv4.conf.eth0.arp_notify": "1"})
    assert code == 1 and out["code"] == 7, out
    assert out["msg"].startswith("Sysctl net.ipv4.conf.eth0.arp_notify is not allowed"), out
    code, out = add("ctr2", {"net.ipv4.conf.eth0.rp_filter": "2"})
    assert code == 0 and out["interfaces"][0]["name"] == "eth0", out
    assert eth0.run("cat", rp).stdout.strip() == "2"
    daemon.wait_served(2)
    wait_for(lambda: daemon.named("pycni-spare") == spare, "the spare back")
    log = daemon.log.read_text()
    assert NOT_BACK not in log and "imported" not in log, log
    assert daemon.status()["spares"]["retired"] == 0
