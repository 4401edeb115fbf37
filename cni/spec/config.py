"""Config models (pydantic): the common plugin keys, and error translation.

A validation failure becomes CNI error 7 naming the key path and the value given, e.g.
`invalid network config: ipam.ranges.0.0.subnet: "10.0.0.1/24": host bits set`.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cni.spec import keys
from cni.spec.errors import CNIError, Code

M = TypeVar("M", bound=BaseModel)


# Default factories for the models: Python functions, not the list/dict builtins. pydantic reads
# each factory's signature; a builtin's is parsed from its text form by tokenize, whose regexes
# compile on that first use (~4 ms of every exec that imports a model).
def empty_list() -> list[Any]:
    return []


def empty_dict() -> dict[str, Any]:
    return {}


class Model(BaseModel):
    """Base for config models: unknown keys are kept and ignored (runtimes add their own);
    known keys are found however they are cased, as Go's decoder finds them (cni.spec.keys)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=False)

    @model_validator(mode="before")
    @classmethod
    def _fold_keys(cls, data: Any) -> Any:
        return keys.match(data, cls.model_fields) if isinstance(data, dict) else data


class DNS(Model):
    nameservers: list[str] = Field(default_factory=empty_list)
    domain: str = ""
    search: list[str] = Field(default_factory=empty_list)
    options: list[str] = Field(default_factory=empty_list)


class PluginConf(Model):
    """The keys every plugin config carries (spec section 1, as the runtime sends it)."""

    cniVersion: str = ""
    name: str = ""
    type: str = ""
    capabilities: dict[str, bool] = Field(default_factory=empty_dict)
    ipam: dict[str, Any] | None = None
    dns: DNS | None = None
    args: dict[str, Any] | None = None
    runtimeConfig: dict[str, Any] = Field(default_factory=empty_dict)
    prevResult: dict[str, Any] | None = None


def parse(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate `data` into `model`, or raise CNI error 7 naming the first bad key and value."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _to_cni(e, data, prefix) from None


def _to_cni(e: ValidationError, data: Any, prefix: str) -> CNIError:
    first = e.errors(include_url=False)[0]
    path = keys.written_path(data, first["loc"])  # the key as the user cased it
    loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *path))
    value = first.get("input")
    msg = first["msg"].removeprefix("Value error, ")
    shown = json.dumps(value, default=str)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    detail = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[1:]
    )
    key = loc or "config"
    return CNIError(Code.INVALID_CONFIG, f"invalid network config: {key}: {shown}: {msg}", detail)
