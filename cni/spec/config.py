"""Config models (pydantic BaseModels) and the translation of their errors into CNI errors.

A validation failure becomes CNI error 7 naming the key path and the value given, e.g.
`invalid network config: ipam.ranges.0.0.subnet: "10.0.0.1/24": host bits set`.

A model declares the keys the reference's Go struct has; every model inherits from `Model`:
- unknown keys are kept (extra="allow": runtimes add their own) and never dumped back out, as a
  Go struct drops them;
- known keys are found however they are cased, as Go's decoder finds them (cni.spec.keys), by a
  before-validator, and errors name the key as the user wrote it;
- strictness is per field, as the reference's: StrictStr / StrictInt / StrictBool where Go's
  decoder refuses a JSON value of another type, the plain types where it was lax.
pydantic builds a model's validator when its class is made; the daemon imports every model
before it forks (cni.fast.preload), so no request builds one.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_serializer,
    model_validator,
)

from cni.spec import keys
from cni.spec.errors import CNIError, Code

__all__ = ["DNS", "Field", "Model", "PluginConf", "StrictBool", "StrictInt", "StrictStr",
           "parse", "parse_lenient"]

M = TypeVar("M", bound="Model")


class Model(BaseModel):
    """Base for config models (see the module doc)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def fold_keys(cls, data: Any) -> Any:
        return keys.match(data, cls.model_fields) if isinstance(data, dict) else data

    @model_serializer(mode="wrap")
    def declared_keys_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        fields = type(self).model_fields
        return {k: v for k, v in handler(self).items() if k in fields}

    @classmethod
    def compile_all(cls) -> list[str]:
        """Complete every model's validator now; returns what failed. pydantic defers a model
        whose annotations name something not defined yet to its first validation, which would
        be each fresh child's first request: the daemon calls this before it forks."""
        failed = []
        for sub in cls.__subclasses__():
            try:
                sub.model_rebuild(raise_errors=True)  # nothing to do once complete
            except Exception as e:  # its requests will fail the same way: not the daemon's start
                failed.append(f"{sub.__module__}.{sub.__qualname__}: {e}")
            failed += sub.compile_all()
        return failed


class DNS(Model):
    nameservers: list[str] = Field(default_factory=list)
    domain: str = ""
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)


class PluginConf(Model):
    """The keys every plugin config carries (spec section 1, as the runtime sends it)."""

    cniVersion: str = ""
    name: str = ""
    type: str = ""
    capabilities: dict[str, bool] = Field(default_factory=dict)
    ipam: dict[str, Any] | None = None
    dns: DNS | None = None
    args: dict[str, Any] | None = None
    runtimeConfig: dict[str, Any] = Field(default_factory=dict)
    prevResult: dict[str, Any] | None = None


def parse(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate `data` into `model`, or raise CNI error 7 naming the first bad key and value."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise to_cni(e, data, prefix) from None


def parse_lenient(model: type[M], data: Any) -> tuple[M, list[str]]:
    """For DEL (and GC): the model from what validates, each top-level key whose value does not
    validate left at its default; -> (model, the dropped keys). A config ADD refuses must still be
    deletable (libcni stops a DEL chain at the first error): DEL finds its objects by container
    ID and ifname, so a bad value elsewhere must not stop it."""
    fields = keys.match(data if isinstance(data, dict) else {}, model.model_fields)
    fields = dict(fields)
    dropped: list[str] = []
    while True:
        try:
            return model.model_validate(fields), dropped
        except ValidationError as e:
            bad = {err["loc"][0] for err in e.errors(include_url=False)
                   if err["loc"] and err["loc"][0] in fields}
            if not bad:  # an error of the whole object: every key at its default
                return model.model_validate({}), dropped + sorted(map(str, fields))
            for key in bad:
                del fields[key]
                dropped.append(str(key))


def to_cni(e: ValidationError, data: Any, prefix: str = "") -> CNIError:
    """Error 7 for a model's validation error: the first error's key path (as `data` spells
    it, under `prefix`), its value and message; the others in the details."""
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
