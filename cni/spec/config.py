"""Config models on pydantic's validation engine (pydantic-core), and error translation.

A validation failure becomes CNI error 7 naming the key path and the value given, e.g.
`invalid network config: ipam.ranges.0.0.subnet: "10.0.0.1/24": host bits set`.

A model is a class whose annotations are its keys, as with pydantic's BaseModel; the first
validation compiles them into a core schema of the same shape BaseModel would build (same
checks, same messages, same error locations). pydantic-core is driven directly because the
`pydantic` package costs every exec that validates a config ~60 ms more to import than the
core does (bridge and portmap without the daemon; bench/RESULTS.md), and only the core's compiled
module is loaded (`_engine`). The types understood are the ones the configs use: str, int, bool,
Any, models, `X | None`, `list[X]`, `dict[str, X]`, and Annotated with STRICT and Bounds.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, NamedTuple, TypeVar, cast

from cni.spec import keys
from cni.spec.errors import CNIError, Code

if TYPE_CHECKING:
    from pydantic_core import SchemaValidator, ValidationError


def _engine() -> types.ModuleType:
    """pydantic-core's compiled module (validators, errors), loaded without its package's
    __init__: that one imports typing_extensions (inspect) and defines the schema TypedDicts,
    ~20 ms of an exec that needs none of them. It is registered under its own name, so a later
    `import pydantic_core` (the tests, pydantic) reuses it: a compiled module loads only once."""
    name = "pydantic_core._pydantic_core"
    if name in sys.modules:
        return sys.modules[name]
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    package = PathFinder.find_spec("pydantic_core")
    spec = package and PathFinder.find_spec(name, package.submodule_search_locations)
    if spec is None or spec.loader is None:  # not installed as a package dir: the usual way
        import pydantic_core._pydantic_core as module

        return module
    module = module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_core = _engine()
SchemaValidator = _core.SchemaValidator  # the very classes `pydantic_core` exports
ValidationError = _core.ValidationError

M = TypeVar("M", bound="Model")
T = TypeVar("T")

STRICT = "strict"  # Annotated metadata: no coercion (pydantic's Strict())


class Bounds(NamedTuple):
    """Annotated metadata: inclusive bounds of an int (pydantic's Field(ge=, le=))."""

    ge: int
    le: int


StrictStr = Annotated[str, STRICT]
StrictInt = Annotated[int, STRICT]
StrictBool = Annotated[bool, STRICT]


class _Factory(NamedTuple):
    make: Callable[[], Any]


def new(factory: Callable[[], T]) -> T:
    """A default made afresh for each instance (pydantic's Field(default_factory=...))."""
    return cast(T, _Factory(factory))


class Model:
    """Base for config models: unknown keys are kept and ignored (runtimes add their own);
    known keys are found however they are cased, as Go's decoder finds them (cni.spec.keys)."""

    # Where pydantic-core puts what it validated: the fields in __dict__, the rest here.
    __slots__ = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__",
                 "__pydantic_private__")
    __fields__: ClassVar[dict[str, Any]]  # name -> default (or _REQUIRED), in declared order
    __validator__: ClassVar[SchemaValidator | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = {}
        for klass in reversed(cls.__mro__):
            for name in klass.__dict__.get("__annotations__", {}):
                if not name.startswith("_"):
                    fields[name] = klass.__dict__.get(name, _REQUIRED)
        cls.__fields__ = fields
        cls.__validator__ = None

    def __init__(self, **data: Any) -> None:
        type(self).validator().validate_python(data, self_instance=self)

    @classmethod
    def validator(cls) -> SchemaValidator:
        if cls.__validator__ is None:
            cls.__validator__ = SchemaValidator(_model_schema(cls))
        return cls.__validator__

    @classmethod
    def compile_all(cls) -> list[str]:
        """Build every model's validator now (the daemon, before it forks: ~0.5 ms a model that
        each fresh child would otherwise pay on its first request); returns what failed."""
        failed = []
        for sub in cls.__subclasses__():
            try:
                sub.validator()
            except Exception as e:  # its requests will fail the same way: not the daemon's start
                failed.append(f"{sub.__module__}.{sub.__qualname__}: {e}")
            failed += sub.compile_all()
        return failed

    @classmethod
    def fold_keys(cls, data: Any) -> Any:
        return keys.match(data, cls.__fields__) if isinstance(data, dict) else data

    def dump(self, exclude_none: bool = False, exclude_defaults: bool = False) -> dict[str, Any]:
        """The declared keys and their values, nested models as dicts (unknown keys dropped, as
        a Go struct drops them)."""
        out = {}
        for name, default in type(self).__fields__.items():
            value = getattr(self, name)
            if exclude_none and value is None:
                continue
            if exclude_defaults and value == _default_of(default):
                continue
            out[name] = value.dump(exclude_none, exclude_defaults) if isinstance(
                value, Model) else value
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the models are

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__fields__)
        return f"{type(self).__name__}({shown})"


_REQUIRED = object()


def _default_of(default: Any) -> Any:
    return default.make() if isinstance(default, _Factory) else default


def _model_schema(cls: type[Model]) -> dict[str, Any]:
    """The core schema pydantic's BaseModel builds for such a class (extra="allow", keys folded
    before validation)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {}
    for name, default in cls.__fields__.items():
        schema = _schema(hints[name])
        if isinstance(default, _Factory):
            schema = {"type": "default", "schema": schema, "default_factory": default.make,
                      "default_factory_takes_data": False}
        elif default is not _REQUIRED:
            schema = {"type": "default", "schema": schema, "default": default}
        fields[name] = {"type": "model-field", "schema": schema}
    return {
        "type": "model", "cls": cls,
        "config": {"title": cls.__name__, "extra_fields_behavior": "allow"},
        "schema": {
            "type": "function-before",
            "function": {"type": "no-info", "function": cls.fold_keys},
            "schema": {"type": "model-fields", "fields": fields, "model_name": cls.__name__},
        },
    }


_SCALARS = {str: "str", int: "int", bool: "bool"}


def _schema(tp: Any) -> dict[str, Any]:
    """The core schema of one annotation (a TypeError names an annotation not understood)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        schema = _schema(args[0])
        for meta in args[1:]:
            if meta == STRICT:
                schema["strict"] = True
            elif isinstance(meta, Bounds):
                schema.update(ge=meta.ge, le=meta.le)
            else:
                raise TypeError(f"unsupported Annotated metadata {meta!r}")
        return schema
    if tp is Any:
        return {"type": "any"}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if isinstance(tp, type) and issubclass(tp, Model):
        return _model_schema(tp)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return {"type": "nullable", "schema": _schema(inner)}
    if origin is list:
        return {"type": "list", "items_schema": _schema(args[0])}
    if origin is dict and args[0] is str:
        return {"type": "dict", "keys_schema": {"type": "str"}, "values_schema": _schema(args[1])}
    raise TypeError(f"unsupported annotation {tp!r}")


class DNS(Model):
    nameservers: list[str] = new(list)
    domain: str = ""
    search: list[str] = new(list)
    options: list[str] = new(list)


class PluginConf(Model):
    """The keys every plugin config carries (spec section 1, as the runtime sends it)."""

    cniVersion: str = ""
    name: str = ""
    type: str = ""
    capabilities: dict[str, bool] = new(dict)
    ipam: dict[str, Any] | None = None
    dns: DNS | None = None
    args: dict[str, Any] | None = None
    runtimeConfig: dict[str, Any] = new(dict)
    prevResult: dict[str, Any] | None = None


def parse(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate `data` into `model`, or raise CNI error 7 naming the first bad key and value."""
    try:
        return model.validator().validate_python(data)
    except ValidationError as e:
        raise _to_cni(e, data, prefix) from None


def _to_cni(e: ValidationError, data: Any, prefix: str) -> CNIError:
    # Without include_url: the URL makes pydantic-core import `pydantic` for its version.
    errors = e.errors(include_url=False)
    first = errors[0]
    path = keys.written_path(data, first["loc"])  # the key as the user cased it
    loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *path))
    value = first.get("input")
    msg = first["msg"].removeprefix("Value error, ")
    shown = json.dumps(value, default=str)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    detail = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in errors[1:]
    )
    key = loc or "config"
    return CNIError(Code.INVALID_CONFIG, f"invalid network config: {key}: {shown}: {msg}", detail)
