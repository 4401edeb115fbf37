"""cni.spec.config's models, on pydantic-core directly, against pydantic's BaseModel built from
the same annotations: the same values, and the same CNI errors (key path, value, message)."""

from __future__ import annotations

import json
import types
import typing
from typing import Annotated, Any

import pydantic
import pytest
from cnitest import probe_binary
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.ipam.config import NetModel
from cni.plugins.bridge import NetConf
from cni.plugins.portmap import PortMapConf
from cni.spec import config
from cni.spec.config import DNS, Bounds, Model, parse
from cni.spec.errors import CNIError

MODELS = (NetConf, PortMapConf, NetModel)


def twin(model: type[Model], made: dict[type, type] | None = None) -> type[pydantic.BaseModel]:
    """A pydantic BaseModel with `model`'s fields, config and key folding."""
    made = {} if made is None else made
    if model not in made:
        hints = typing.get_type_hints(model, include_extras=True)
        fields = {}
        for name, default in model.__fields__.items():
            if isinstance(default, config._Factory):
                default = pydantic.Field(default_factory=default.make)
            elif default is config._REQUIRED:
                default = ...
            fields[name] = (_twin_type(hints[name], made), default)
        fold = pydantic.model_validator(mode="before")(classmethod(
            lambda cls, data: model.fold_keys(data)))
        made[model] = pydantic.create_model(
            model.__name__, __config__=pydantic.ConfigDict(extra="allow"),
            __validators__={"fold": fold}, **fields)
    return made[model]


def _twin_type(tp: Any, made: dict[type, type]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        meta = [pydantic.Strict() if m == config.STRICT else pydantic.Field(ge=m.ge, le=m.le)
                if isinstance(m, Bounds) else m for m in args[1:]]
        return Annotated[(_twin_type(args[0], made), *meta)]
    if isinstance(tp, type) and issubclass(tp, Model):
        return twin(tp, made)
    if origin in (typing.Union, types.UnionType):
        return _twin_type(next(a for a in args if a is not type(None)), made) | None
    if origin is list:
        return list[_twin_type(args[0], made)]
    if origin is dict:
        return dict[args[0], _twin_type(args[1], made)]
    return tp


def plain(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return {k: plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, Model):
        return {k: plain(getattr(value, k)) for k in type(value).__fields__}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def outcome(model: type, data: Any) -> Any:
    try:
        if issubclass(model, Model):
            return plain(parse(model, data))
        try:
            return plain(model.model_validate(data))
        except pydantic.ValidationError as e:
            raise config._to_cni(e, data, "") from None
    except CNIError as e:
        return ("error", int(e.code), e.msg, e.details)


SCALARS = st.sampled_from([None, True, False, 0, 1, -1, 13, 31, 32, 2**70, 1.0, 1.5, "", "x",
                           "5", "true", "10.0.0.0/24"])
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["a", "subnet", "dst", "minID"]), inner,
                                      max_size=3), max_leaves=8)


def config_for(model: type[Model], depth: int = 0) -> st.SearchStrategy[Any]:
    """Objects with `model`'s keys (some recased, some unknown), values of any JSON shape,
    nested models' keys where a model goes."""
    hints = typing.get_type_hints(model, include_extras=True)

    def value(tp: Any) -> st.SearchStrategy[Any]:
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        nested = [t for t in (inner[0], *typing.get_args(inner[0]))
                  for t in (t, *typing.get_args(t))
                  if isinstance(t, type) and issubclass(t, Model)]
        if nested and depth < 3:
            obj = config_for(nested[0], depth + 1)
            return st.one_of(obj, st.lists(obj, max_size=2), st.lists(st.lists(obj, max_size=2),
                                                                      max_size=2), JSON)
        return JSON

    key = st.sampled_from([*model.__fields__, "unknownKey"]).flatmap(
        lambda k: st.sampled_from([k, k.upper(), k[:1].upper() + k[1:]]).map(lambda c: (k, c)))
    return st.lists(key, max_size=6).flatmap(lambda ks: st.fixed_dictionaries(
        {c: value(hints.get(k, Any)) for k, c in ks}))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_same_values_and_errors_as_pydantic_basemodel(model, data) -> None:
    value = data.draw(config_for(model) | SCALARS)
    assert outcome(model, value) == outcome(twin(model), value)


def test_the_differential_sees_a_difference() -> None:
    """A model and a twin built from other annotations disagree: the comparison above is not
    equal by construction."""

    class Lax(Model):
        markMasqBit: int = 13

    class Strict(Model):
        markMasqBit: Annotated[int, config.STRICT, Bounds(ge=0, le=31)] = 13

    assert outcome(Lax, {"markMasqBit": "5"}) == {"markMasqBit": 5}
    assert outcome(twin(Strict), {"markMasqBit": "5"})[0] == "error"
    assert outcome(Lax, {"markMasqBit": 40}) != outcome(twin(Strict), {"markMasqBit": 40})
    assert outcome(Strict, {"markMasqBit": 40}) == outcome(twin(Strict), {"markMasqBit": 40})

def test_defaults_are_fresh_per_instance_and_dump_keeps_declared_keys_only() -> None:
    a, b = DNS(), parse(DNS, {})
    a.nameservers.append("10.0.0.53")
    assert b.nameservers == [] and DNS().nameservers == []
    dns = parse(DNS, {"Nameservers": ["10.0.0.53"], "sortlist": ["x"], "domain": ""})
    assert dns.dump(exclude_defaults=True) == {"nameservers": ["10.0.0.53"]}
    assert dns.dump() == {"nameservers": ["10.0.0.53"], "domain": "", "search": [],
                          "options": []}


def test_an_annotation_the_layer_does_not_know_is_refused_by_name() -> None:
    class Odd(Model):
        ports: set[int] = frozenset()  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"set\[int\]"):
        Odd.validator()


@pytest.mark.root
def test_bridge_without_the_daemon_loads_only_the_compiled_core() -> None:
    """The `pydantic` package costs an exec ~60 ms more than its core, and the core's package
    ~20 ms more than its compiled module: only that module is on the exec path."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/nonexistent",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent", "PYCNI_SOCKET": "/nonexistent"}
    stdin = json.dumps({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "mtu": "x"})
    out, code, loaded = probe_binary("bridge", env, stdin.encode(),
                                     watch=("pydantic", "pydantic_core", "typing_extensions",
                                            "pydantic_core._pydantic_core"))
    assert code == 1 and json.loads(out)["code"] == 7
    assert json.loads(out)["msg"].startswith('invalid network config: mtu: "x"')
    assert loaded == ["pydantic_core._pydantic_core"]


def test_the_daemon_compiles_every_model_before_it_forks() -> None:
    """Else each fresh child builds a plugin's validators (~0.5 ms a model) on its first request."""
    from cni.fast import preload

    models, todo = [], [Model]
    while todo:
        subs = todo.pop().__subclasses__()
        models += subs
        todo += subs
    assert {NetConf, PortMapConf, NetModel, DNS} <= set(models)
    models = [m for m in models if m.__module__.startswith("cni.")]  # not this file's
    for model in models:  # as if no test had validated a config in this process yet
        model.__validator__ = None
    preload.preimport()
    assert [m.__name__ for m in models if m.__validator__ is None] == []
