"""`pycni install --containerd-template PATH --cluster-cidr ... --conflist FILE
--containerd-config DIR` (deploy/pycni.yaml's init container): the template always, the conflist
only where the node's containerd config sets no CRI conf_template (containerd renders a template
only while no CNI config is loaded: the conflist would pre-empt the node's own pod CIDR), a
conflist an earlier install wrote removed once the template takes over; all recorded, so
uninstall removes exactly that. Refusals name the value and write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_install import cli, snapshot

from cni import install as inst

TMPL = "pycni-containerd.conflist.tmpl"
V2 = '[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_template = "{}"\n'  # 1.6, 1.7
V3 = "[plugins.'io.containerd.cri.v1.runtime'.cni]\n  conf_template = '{}'\n"  # 2.x


@pytest.fixture(autouse=True)
def no_daemon(tmp_path: Path, monkeypatch) -> None:
    """Install asks a running daemon of another version to hand over: never the machine's."""
    monkeypatch.setenv("PYCNI_SOCKET", str(tmp_path / "no-daemon.sock"))


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """The node's dirs as the init container sees them, and the ConfigMap's conflist."""
    conflist = tmp_path / "configmap" / "10-pycni.conflist"
    conflist.parent.mkdir()
    conflist.write_bytes((inst.CONF_SRC / inst.DEFAULT_CONFLIST).read_bytes())
    containerd = tmp_path / "etc-containerd"
    containerd.mkdir()
    return {"bin": tmp_path / "bin", "conf": tmp_path / "net.d", "conflist": conflist,
            "containerd": containerd}


def install(node: dict[str, Path], *more: str, cluster: str | None = "10.244.0.0/16"
            ) -> tuple[int, str]:
    return cli("install", "--no-compile", "--bin-dir", str(node["bin"]), "--conf-dir",
               str(node["conf"]), "--conflist", str(node["conflist"]), "--containerd-template",
               str(node["conf"] / TMPL), "--containerd-config", str(node["containerd"]),
               *(["--cluster-cidr", cluster] if cluster is not None else []), *more)


def recorded(node: dict[str, Path]) -> set[str]:
    return {e["path"] for e in json.loads((node["bin"] / inst.MANIFEST).read_text())["entries"]
            if not e["path"].startswith(str(node["bin"]))}


def nonmasq(template: Path) -> str:
    return next(line.strip() for line in template.read_text().splitlines()
                if "nonMasqueradeCIDRs" in line)


@pytest.mark.parametrize("files,renders", [
    ({"config.toml": "version = 2\n" + V2}, True),
    ({"config.toml": "version = 3\n", "conf.d/10-cni.toml": V3}, True),
    # a drop-in read after config.toml overrides it: containerd's default, no template
    ({"config.toml": V2, "conf.d/99-off.toml": V2.replace('"{}"', '""')}, False),
    ({"config.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n'
                     '  conf_dir = "/etc/cni/net.d"\n'}, False),
    ({}, False),  # a node without containerd (CRI-O): the mounted dir is empty
], ids=["1.6-1.7", "2.x-drop-in", "overridden", "no-template", "no-containerd"])
def test_the_conflist_only_where_containerd_renders_no_template(node, files, renders) -> None:
    for name, text in files.items():
        path = node["containerd"] / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text.format(node["conf"] / TMPL))
    code, out = install(node)
    assert code == 0, out
    template, conflist = node["conf"] / TMPL, node["conf"] / inst.DEFAULT_CONFLIST
    assert nonmasq(template) == '"nonMasqueradeCIDRs": [{{range .Routes}}{{if eq . ' \
        '"0.0.0.0/0"}}"10.244.0.0/16"{{end}}{{end}}],'
    assert conflist.exists() is not renders
    if not renders:  # the ConfigMap's, as it is
        assert conflist.read_bytes() == node["conflist"].read_bytes()
    else:
        assert f"containerd's conf_template is {template}: no conflist written" in out
    assert recorded(node) == {str(template)} | (set() if renders else {str(conflist)})
    code, out = cli("uninstall", "--bin-dir", str(node["bin"]))
    assert code == 0, out
    assert not node["conf"].exists()  # install made it, and all it wrote there is gone


def test_the_template_taking_over_removes_the_conflist_install_wrote(node) -> None:
    """An operator sets conf_template on a node that had the fallback: the next install (the
    DaemonSet pod's restart) removes its conflist, or containerd would never render; a conflist
    not install's stays."""
    code, out = install(node)
    assert code == 0, out
    conflist = node["conf"] / inst.DEFAULT_CONFLIST
    assert conflist.exists()
    admins = node["conf"] / "99-other.conflist"
    admins.write_text('{"cniVersion": "1.0.0", "name": "other", "plugins": []}\n')
    (node["containerd"] / "config.toml").write_text(V2.format(node["conf"] / TMPL))
    code, out = install(node, cluster="10.96.0.0/12")  # and an upgraded ConfigMap
    assert code == 0, out
    assert f"removed {conflist} (containerd renders its conf_template)" in out
    assert not conflist.exists() and admins.exists()
    assert '"10.96.0.0/12"' in nonmasq(node["conf"] / TMPL)
    assert recorded(node) == {str(node["conf"] / TMPL)}
    assert cli("uninstall", "--bin-dir", str(node["bin"]))[0] == 0
    assert sorted(node["conf"].iterdir()) == [admins]


def test_a_fallback_edited_since_is_left_and_said(node) -> None:
    code, out = install(node)
    assert code == 0, out
    conflist = node["conf"] / inst.DEFAULT_CONFLIST
    conflist.write_text(conflist.read_text().replace("cni0", "cni1"))  # an admin's edit
    (node["containerd"] / "config.toml").write_text(V2.format(node["conf"] / TMPL))
    code, out = install(node)
    assert code == 0, out
    assert f"left {conflist}: changed since install" in out and conflist.exists()
    assert recorded(node) == {str(node["conf"] / TMPL)}  # not install's to remove any more


@pytest.mark.parametrize("more,cluster,named", [
    ([], "10.244.0.1/16", "--cluster-cidr '10.244.0.1/16'"),
    ([], "pods", "--cluster-cidr 'pods'"),
    ([], "", "--cluster-cidr ''"),  # an empty ConfigMap key: $(CLUSTER_CIDR) is ""
    (["--pod-cidr", "10.244.1.0/24"], "10.244.0.0/16", "--pod-cidr '10.244.1.0/24'"),
], ids=["host-bits", "not-a-cidr", "empty", "pod-cidr"])
def test_refusals_name_the_value_and_write_nothing(node, tmp_path, more, cluster, named) -> None:
    (node["containerd"] / "config.toml").write_text(V2.format(node["conf"] / TMPL))
    before = snapshot(tmp_path)
    code, out = install(node, *more, cluster=cluster)
    assert code == 2 and named in out, out
    assert snapshot(tmp_path) == before


def test_the_cluster_cidrs_from_the_env(node, monkeypatch) -> None:
    """The DaemonSet gives them as PYCNI_CLUSTER_CIDR (a ConfigMap key): space-separated."""
    (node["containerd"] / "config.toml").write_text(V2.format(node["conf"] / TMPL))
    monkeypatch.setenv("PYCNI_CLUSTER_CIDR", "fd00:10:244::/56 10.244.0.0/16")
    code, out = install(node, cluster=None)
    assert code == 0, out
    line = nonmasq(node["conf"] / TMPL)
    assert '"10.244.0.0/16"' in line and '"fd00:10:244::/56"' in line, line


@pytest.mark.parametrize("value,named", [
    ("10.244.0.0/16 10.245.0.0/16", "--cluster-cidr '10.245.0.0/16': a second IPv4 one"),
    ("10.244.0.0", "--cluster-cidr '10.244.0.0'"),
    ("", "--containerd-template needs --cluster-cidr"),  # an empty ConfigMap key
], ids=["two-v4", "no-prefix", "empty"])
def test_bad_cluster_cidrs_from_the_env_write_nothing(node, tmp_path, monkeypatch, value,
                                                      named) -> None:
    monkeypatch.setenv("PYCNI_CLUSTER_CIDR", value)
    before = snapshot(tmp_path)
    code, out = install(node, cluster=None)
    assert code == 2 and named in out, out
    assert snapshot(tmp_path) == before


def test_a_containerd_config_that_is_not_toml_is_refused(node, tmp_path) -> None:
    bad = node["containerd"] / "conf.d" / "10-cni.toml"
    bad.parent.mkdir()
    bad.write_text('[plugins."io.containerd.grpc.v1.cri".cni\n')
    before = snapshot(tmp_path)
    code, out = install(node)
    assert code == 1 and f"containerd config '{bad}': not TOML" in out, out
    assert snapshot(tmp_path) == before


def test_the_config_dir_goes_only_with_the_template(node, tmp_path) -> None:
    before = snapshot(tmp_path)
    code, out = cli("install", "--no-compile", "--bin-dir", str(node["bin"]), "--conf-dir",
                    str(node["conf"]), "--containerd-config", str(node["containerd"]))
    assert code == 2 and f"--containerd-config '{node['containerd']}' needs " \
        "--containerd-template" in out, out
    assert snapshot(tmp_path) == before
    node["containerd"].rmdir()
    before = snapshot(tmp_path)
    code, out = install(node)
    assert code == 1 and f"--containerd-config '{node['containerd']}': not a directory" in out
    assert snapshot(tmp_path) == before


@pytest.mark.root
def test_a_containerd_config_root_does_not_own_is_refused(node, tmp_path) -> None:
    """Who can write the config decides whether the conflist is written: root's alone."""
    import os

    config = node["containerd"] / "config.toml"
    config.write_text(V2.format(node["conf"] / TMPL))
    os.chown(config, 65534, 65534)  # nobody
    before = snapshot(tmp_path)
    code, out = install(node)
    assert code == 1 and "containerd config" in out and str(config) in out, out
    assert snapshot(tmp_path) == before
