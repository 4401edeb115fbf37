"""cni.spec.config's models: pydantic BaseModels that read keys as Go's decoder does (any case,
the exact spelling winning), keep unknown keys, and fail with CNI error 7 naming the key as the
user wrote it and the value."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
from cnitest import probe_binary
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.ipam.config import NetModel
from cni.plugins.bandwidth import BandwidthEntry
from cni.plugins.bridge import NetConf, VlanTrunk
from cni.plugins.portmap import PortMapConf
from cni.spec.config import DNS, Model, parse, parse_lenient
from cni.spec.errors import CNIError

MODELS = (NetConf, PortMapConf, NetModel, BandwidthEntry)
ROOT = Path(__file__).resolve().parent.parent


def plain(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return {k: plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def outcome(model: type[Model], data: Any) -> Any:
    try:
        return plain(parse(model, data))
    except CNIError as e:
        return ("error", int(e.code), e.msg, e.details)


def error(model: type[Model], data: Any) -> str:
    with pytest.raises(CNIError) as e:
        parse(model, data)
    assert e.value.code == 7
    return e.value.msg


def test_every_config_model_is_a_pydantic_model_keeping_unknown_keys() -> None:
    for model in (*MODELS, DNS, VlanTrunk):
        assert issubclass(model, pydantic.BaseModel)
        assert model.model_config.get("extra") == "allow"
    conf = parse(NetConf, {"bridge": "br0", "vendorKey": {"x": 1}})
    assert conf.model_extra == {"vendorKey": {"x": 1}}


@pytest.mark.parametrize("model,data,msg", [
    (NetConf, {"mtu": "x"}, 'invalid network config: mtu: "x": Input should be a valid integer'),
    (NetConf, {"MTU": "1500"}, 'invalid network config: MTU: "1500": Input should be a valid '
                               "integer"),  # strict, as Go's decoder: no string for an int
    (NetConf, {"isGateway": "true"}, 'invalid network config: isGateway: "true": Input should '
                                     "be a valid boolean"),
    (NetConf, {"VlanTrunk": [{"minID": 1}, {"MaxId": 1.5}]},
     "invalid network config: VlanTrunk.1.MaxId: 1.5: Input should be a valid integer"),
    (PortMapConf, {"markMasqBit": 32}, "invalid network config: markMasqBit: 32: Input should "
                                       "be less than or equal to 31"),
    (NetModel, {"IPAM": {"Ranges": [[{"Subnet": 5}]]}},
     "invalid network config: IPAM.Ranges.0.0.Subnet: 5: Input should be a valid string"),
    (NetModel, {"ipam": {"routes": [{"gw": "10.0.0.1"}]}},
     'invalid network config: ipam.routes.0.dst: {"gw": "10.0.0.1"}: Field required'),
    (NetModel, [], "invalid network config: config: []: Input should be a valid dictionary or "
                   "instance of NetModel"),
    (BandwidthEntry, {"IngressRate": 8000, "ingressBurst": None},  # a rule across two keys
     "invalid network config: IngressRate: 8000: if rate is set, ingressBurst must also be set"),
    (BandwidthEntry, {"EGRESSRATE": 1, "egressburst": 2**35},
     "invalid network config: egressburst: 34359738368: burst cannot be more than 4GB"),
    (BandwidthEntry, {"egressRate": True}, "invalid network config: egressRate: true: Input "
                                           "should be a valid integer"),  # uint64: strict
])
def test_errors_name_the_key_as_written_and_the_value(model, data, msg) -> None:
    assert error(model, data) == msg


def test_keys_in_any_case_the_exact_spelling_winning() -> None:
    conf = parse(NetConf, {"Bridge": "br1", "MTU": 9000, "mtu": 1500, "IsGateway": True})
    assert (conf.bridge, conf.mtu, conf.isGateway) == ("br1", 1500, True)
    assert parse(NetConf, {"mtu": 1500, "MTU": "x"}).mtu == 1500  # the loser is not validated
    route = parse(NetModel, {"ipam": {"routes": [{"DST": "0.0.0.0/0", "mtu": "1400"}]}})
    assert route.ipam is not None and route.ipam.routes is not None
    assert route.ipam.routes[0].dst == "0.0.0.0/0"
    assert route.ipam.routes[0].mtu == 1400  # lax where the reference is (a json.Number)


def test_defaults_are_fresh_per_instance_and_dump_keeps_declared_keys_only() -> None:
    a, b = DNS(), parse(DNS, {})
    a.nameservers.append("10.0.0.53")
    assert b.nameservers == [] and DNS().nameservers == []
    dns = parse(DNS, {"Nameservers": ["10.0.0.53"], "sortlist": ["x"], "domain": ""})
    assert dns.model_extra == {"sortlist": ["x"]}
    assert dns.model_dump(exclude_defaults=True) == {"nameservers": ["10.0.0.53"]}
    assert dns.model_dump() == {"nameservers": ["10.0.0.53"], "domain": "", "search": [],
                                "options": []}


SCALARS = st.sampled_from([None, True, False, 0, 1, -1, 13, 31, 32, 2**70, 1.0, 1.5, "", "x",
                           "5", "true", "10.0.0.0/24"])
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["a", "subnet", "dst", "minID"]), inner,
                                      max_size=3), max_leaves=8)
CASINGS = (str.upper, lambda k: k[:1].upper() + k[1:], str.lower)


def config_for(model: type[Model], casing: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Pairs of objects: some of `model`'s keys as declared and an unknown one, and the same
    with the known keys (nested models' too) spelled by `casing`; values of any JSON shape."""
    hints = typing.get_type_hints(model, include_extras=True)

    def value(tp: Any) -> st.SearchStrategy[Any]:
        nested = [t for t in (tp, *typing.get_args(tp))
                  for t in (t, *typing.get_args(t), *(a for u in typing.get_args(t)
                                                      for a in typing.get_args(u)))
                  if isinstance(t, type) and issubclass(t, Model)]
        same = JSON.map(lambda v: (v, v))
        if not nested or depth >= 3:
            return same
        obj = config_for(nested[0], casing, depth + 1)
        return st.one_of(obj, st.lists(obj, max_size=2).map(unzip),
                         st.lists(st.lists(obj, max_size=2).map(unzip), max_size=2).map(unzip),
                         same)

    def pairs(names: list[str]) -> st.SearchStrategy[Any]:
        return st.tuples(*(value(hints.get(k, Any)) for k in names)).map(lambda vs: (
            {k: v[0] for k, v in zip(names, vs, strict=True)},
            {k if k not in hints else casing(k): v[1] for k, v in zip(names, vs, strict=True)}))

    names = st.lists(st.sampled_from([*model.model_fields, "unknownKey"]), max_size=6,
                     unique=True)
    return names.flatmap(pairs)


def unzip(pairs: list[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    return [a for a, _ in pairs], [b for _, b in pairs]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_recased_keys_read_and_fail_as_the_declared_spelling(model, data) -> None:
    """Any casing of every key gives the same values, or the same error with the key path
    spelled as the input spells it."""
    casing = data.draw(st.sampled_from(CASINGS))
    declared, written = data.draw(config_for(model, casing))
    want, got = outcome(model, declared), outcome(model, written)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and got[:2] == want[:2]
        assert got[2].lower() == want[2].lower()
        path, declared_path = (m.split(": ")[1].split(".") for m in (got[2], want[2]))
        assert len(path) == len(declared_path)  # a required key not given keeps its name:
        assert all(p in (d, casing(d)) for p, d in zip(path, declared_path, strict=True))
    else:
        assert got == want


@pytest.mark.root
def test_bridge_without_the_daemon_fails_a_bad_key_with_error_7() -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/nonexistent",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent", "PYCNI_SOCKET": "/nonexistent"}
    stdin = json.dumps({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "mtu": "x"})
    out, code, loaded = probe_binary("bridge", env, stdin.encode(), watch=("pydantic",))
    assert code == 1 and json.loads(out)["code"] == 7
    assert json.loads(out)["msg"].startswith('invalid network config: mtu: "x"')
    assert loaded == ["pydantic"]


# A daemon after its warm-up, as a forked child finds it: no schema may be built any more.
CHILD = """
import json
from cni.fast import preload
preload.preimport()
from pydantic._internal import _generate_schema
from cni.spec.config import Model, parse

def refuse(*args, **kwargs):
    raise AssertionError("a schema is being built")

_generate_schema.GenerateSchema.__init__ = refuse
from cni.ipam.config import NetModel
from cni.plugins.bridge import NetConf
from cni.plugins.portmap import PortMapConf
from cni.plugins.bandwidth import BandwidthEntry
from cni.spec.errors import CNIError
ipam = {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}],
        "ranges": [[{"subnet": "10.1.0.0/24", "gateway": "10.1.0.1"}]]}
parse(NetConf, {"Bridge": "cni0", "vlanTrunk": [{"id": 5}], "ipam": ipam,
                "dns": {"nameservers": ["10.0.0.53"]}})
parse(PortMapConf, {"snat": True, "conditionsV4": ["-s", "1.2.3.4"]})
parse(NetModel, {"ipam": ipam, "runtimeConfig": {"ips": ["10.1.0.9"]},
                 "args": {"cni": {"ips": ["10.1.0.9"]}}})
parse(BandwidthEntry, {"IngressRate": 8000, "IngressBurst": 800})
try:
    parse(BandwidthEntry, {"egressRate": 8000})  # the cross-key rule's error, too
except CNIError:
    pass
todo, models = [Model], []
while todo:
    todo += todo.pop().__subclasses__()
    models += todo
print(json.dumps(sorted({m.__name__ for m in models if not m.__pydantic_complete__})))
"""


def test_the_daemon_builds_every_validator_before_it_forks() -> None:
    """After preload.preimport (the daemon, before its forks) every model is complete and a
    config validates without pydantic building a schema: no child pays for one."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_schema_guard_above_can_fail() -> None:
    """A model defined after the guard needs a schema: the same guard stops it."""
    code = CHILD.replace("from cni.ipam.config import NetModel",
                         "class Late(Model):\n    x: int = 0\nfrom cni.ipam.config import NetModel")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "a schema is being built" in out.stderr


def test_lenient_parse_keeps_what_validates_for_del() -> None:
    """DEL's parse: a key of the wrong type (however cased) falls back to its default, the
    others are kept; a model-level error (bandwidth's rate without burst) drops its key too."""
    conf, dropped = parse_lenient(NetConf, {"IPMasq": "yes", "mtu": "x", "bridge": "br9",
                                            "ipam": {"type": "host-local"}, "custom": 1})
    assert (conf.ipMasq, conf.mtu, conf.bridge, conf.ipam_type) == (False, 0, "br9",
                                                                    "host-local")
    assert sorted(dropped) == ["ipMasq", "mtu"]
    entry, dropped = parse_lenient(BandwidthEntry, {"ingressRate": 1000, "egressRate": "x",
                                                    "egressBurst": 8})
    assert dropped == ["egressRate", "ingressRate", "egressBurst"]  # each error in its turn
    assert entry.model_dump() == {"ingressRate": 0, "ingressBurst": 0, "egressRate": 0,
                                  "egressBurst": 0}
    assert parse_lenient(PortMapConf, "not an object")[0].snat is True


def _bandwidth_request(config: dict) -> Any:
    from cni.skel import Request

    return Request(plugin="bandwidth", command="CHECK", container_id="c1", netns="/x",
                   ifname="eth0", args=[], path=["/x"], config=config, version="1.0.0",
                   stdin=b"", env={})


CRIO_BANDWIDTH = {"cniVersion": "1.0.0", "name": "pycni", "type": "bandwidth",
                  "capabilities": {"bandwidth": True},
                  "runtimeConfig": {"bandwidth": {"ingressRate": 100_000_000,
                                                  "ingressBurst": 34359738359,
                                                  "egressRate": 100_000_000,
                                                  "egressBurst": 34359738359}},
                  "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "veth1"}]}}


def test_bandwidth_validates_a_runtime_only_config_once(monkeypatch) -> None:
    """A config without the four limit keys at its top (CRI-O's, containerd's: the runtime
    gives them) is validated once, as runtimeConfig.bandwidth, not first as a whole config
    that has nothing to check; one with them (however cased) as before."""
    from cni.plugins import bandwidth

    asked: list[str] = []
    real = bandwidth.parse
    monkeypatch.setattr(bandwidth, "parse", lambda model, data, prefix="": (
        asked.append(prefix), real(model, data, prefix))[1])
    lim = bandwidth.limits(_bandwidth_request(CRIO_BANDWIDTH))
    assert asked == ["runtimeConfig.bandwidth"]
    assert lim.ingress.rate == lim.egress.rate == 100_000_000
    asked.clear()
    lim = bandwidth.limits(_bandwidth_request(CRIO_BANDWIDTH | {"IngressRate": 8000,
                                                                "ingressBURST": 80}))
    assert asked == [""] and lim.ingress.rate == 8000 and lim.egress is None


def _limits_validating_first(req: Any) -> Any:
    """bandwidth.limits as it was: the whole config validated as a BandwidthEntry first."""
    from cni.plugins import bandwidth

    top = parse(BandwidthEntry, req.config)
    if top.model_fields_set.intersection(bandwidth.KEYS):
        return bandwidth._limits(top, req.config, "", sentinel=False)
    runtime = req.runtime_config
    entry = runtime.get("bandwidth")
    if entry is not None:
        prefix = f"runtimeConfig.{runtime.written('bandwidth')}"
        return bandwidth._limits(parse(BandwidthEntry, entry, prefix), entry, prefix + ".",
                                 sentinel=True)
    return bandwidth._from_annotations(runtime.get(bandwidth.ANNOTATIONS))


_BW_KEYS = st.sampled_from(["ingressRate", "INGRESSRATE", "ingressBurst", "egressrate",
                            "egressBurst", "EgressBurst", "ingressRat", "name", "other"])
_BW_VALUES = st.one_of(st.none(), st.integers(-1, 2**40), st.sampled_from(["1", 1.5, True]))


@settings(max_examples=300, deadline=None)
@given(top=st.dictionaries(_BW_KEYS, _BW_VALUES, max_size=4),
       runtime=st.one_of(st.none(), st.dictionaries(_BW_KEYS, _BW_VALUES, max_size=4)))
def test_bandwidth_limits_are_what_validating_the_config_first_gave(top, runtime) -> None:
    from cni.plugins import bandwidth

    config = {"cniVersion": "1.0.0", "type": "bandwidth", **top}
    if runtime is not None:
        config["runtimeConfig"] = {"bandwidth": runtime}
    req = _bandwidth_request(config)

    def result(fn: Any) -> Any:
        try:
            return ("ok", fn(req))
        except CNIError as e:
            return ("error", e.code, e.msg)

    assert result(bandwidth.limits) == result(_limits_validating_first)
