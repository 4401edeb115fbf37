"""cni.api, the interface third-party plugins use (docs/PLUGINS.md): every public name listed
here must stay importable from it, with the meaning the docs give; a name that disappears fails
here. Adding a name: add it here, to cni.api.__all__ and to docs/PLUGINS.md (and bump
API_VERSION's minor); removing or changing one needs a new major.

The shape of each name (a function's signature, a class's fields, bases and public methods'
signatures, an enum's members, a constant's value) is recorded per API_VERSION in SNAPSHOT: the
running API must equal its version's record, and a minor's record must hold every name of the
minors before it unchanged. So a changed signature or field fails until a new API_VERSION is
recorded with it (`.venv/bin/python tests/test_public_api.py --record` adds the running
version's record, and never rewrites one already there): a minor if it only adds, else a major."""

from __future__ import annotations

import enum
import inspect
import itertools
import json
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from cnitest import ROOT, VENV_PY

import cni.api as api

SNAPSHOT = ROOT / "tests" / "data" / "public_api.json"

PUBLIC = {
    "API_VERSION", "ENTRY_POINT_GROUP",
    "Request", "valid_attachments",
    "CNIError", "Code", "invalid_config", "unsupported", "HostError", "NamespaceError",
    "Result", "to_current", "from_current", "convert", "require_printable",
    "SUPPORTED_VERSIONS", "CURRENT_VERSION", "at_least",
    "match_keys", "get_key", "CAPABILITIES", "known_args",
    "ConfigModel", "PluginConf", "DNS", "Field", "StrictStr", "StrictInt", "StrictBool",
    "parse_config", "parse_config_lenient",
    "ipam_add", "ipam_check", "ipam_delete", "ipam_delete_lenient", "ipam_gc", "ipam_status",
    "netns_entered", "iproute", "Link", "get_link", "set_link_up", "delete_link",
    "add_address", "has_address", "configure_iface", "add_route", "find_routes",
    "sysctl_read", "sysctl_write",
    "NftError", "nft_run", "nft_check", "nft_list", "nft_quote", "nft_comment",
}
DOC = ROOT / "docs" / "PLUGINS.md"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_name_is_there(name: str) -> None:
    assert name in api.__all__, f"cni.api.{name} is public (docs/PLUGINS.md): keep it"
    assert getattr(api, name) is not None


def test_nothing_public_is_undocumented() -> None:
    """__all__ is exactly the listed names, and the guide names each of them."""
    assert set(api.__all__) == PUBLIC
    assert len(api.__all__) == len(set(api.__all__))
    text = DOC.read_text()
    missing = [n for n in sorted(PUBLIC) if not re.search(rf"`{re.escape(n)}\b", text)]
    assert not missing, f"docs/PLUGINS.md does not document {missing}"


def test_api_version_is_major_minor_and_documented() -> None:
    assert re.fullmatch(r"\d+\.\d+", api.API_VERSION)
    assert f"API_VERSION = \"{api.API_VERSION}\"" in DOC.read_text()
    assert api.ENTRY_POINT_GROUP == "pycni.plugins"


def test_meanings_the_docs_give() -> None:
    """A few names whose identity is the contract: the request skel hands a verb, the error
    skel prints, the codes of the spec."""
    from cni import skel
    from cni.spec import errors

    assert api.Request is skel.Request and api.CNIError is errors.CNIError
    assert (api.Code.INVALID_CONFIG, api.Code.TRY_AGAIN_LATER, api.Code.INTERNAL) == (7, 11, 999)
    assert api.SUPPORTED_VERSIONS[-1] == api.CURRENT_VERSION
    assert api.match_keys({"HostPort": 1}, ("hostPort",)) == {"hostPort": 1}


def test_import_is_cheap() -> None:
    """Importing cni.api loads neither pydantic nor pyroute2 nor libnftables: those come with
    the names that need them."""
    code = ("import sys, cni.api; print(sorted(m for m in ('pydantic', 'pyroute2', 'nftables')"
            " if m in sys.modules))")
    out = subprocess.run([str(VENV_PY), "-c", code], capture_output=True, text=True,
                         cwd=Path(ROOT), check=True).stdout
    assert out.strip() == "[]"


# --- the recorded shape of each name ----------------------------------------------------------

def _text(value: Any) -> str:
    """A value or signature as text without what varies by run (addresses) or by Python
    (a NamedTuple's annotations are ForwardRefs, whose repr is not stable)."""
    if isinstance(value, typing.ForwardRef):
        value = value.__forward_arg__
    return re.sub(r" at 0x[0-9a-f]+", "", value if isinstance(value, str) else repr(value))


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "cni"


def _annotations(cls: type) -> dict[str, str]:
    """The field annotations as written (the modules use `from __future__ import annotations`:
    strings, the same on every Python), nearest class first."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if _ours(klass):
            out.update({k: _text(v) for k, v in vars(klass).get("__annotations__", {}).items()})
    return out


def _fields(cls: type) -> dict[str, Any]:
    written = _annotations(cls)
    if hasattr(cls, "model_fields"):  # a pydantic model: alias, required, default
        fields = {}
        for name, f in cls.model_fields.items():
            entry = {"annotation": written.get(name, "?"), "alias": f.alias,
                     "required": f.is_required()}
            if not f.is_required():
                entry["default"] = _text(f.get_default(call_default_factory=True))
            fields[name] = entry
        return fields
    if hasattr(cls, "_fields"):  # a NamedTuple: order and defaults too
        defaults = getattr(cls, "_field_defaults", {})
        return {name: {"annotation": written.get(name, "?"),
                       **({"default": _text(defaults[name])} if name in defaults else {})}
                for name in cls._fields}
    return {name: {"annotation": ann} for name, ann in written.items()}


def _methods(cls: type) -> dict[str, str]:
    out = {}
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, property):
            out[name] = "property"
        elif isinstance(member, (staticmethod, classmethod)):
            out[name] = f"{type(member).__name__} {_text(inspect.signature(member.__func__))}"
        elif inspect.isfunction(member):
            out[name] = _text(str(inspect.signature(member)))
    return out


def describe(obj: Any) -> dict[str, Any]:
    """What a plugin relies on of a public name, as JSON."""
    if not _ours(obj) and (inspect.isfunction(obj) or inspect.isclass(obj)):
        return {"external": f"{obj.__module__}.{obj.__qualname__}"}  # pydantic's, not ours
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return {"enum": {m.name: m.value for m in obj}}
    if inspect.isclass(obj):
        return {"class": [f"{b.__module__}.{b.__qualname__}" for b in obj.__bases__],
                "fields": _fields(obj), "methods": _methods(obj)}
    if inspect.isfunction(obj):
        return {"function": _text(str(inspect.signature(obj)))}
    return {"value": _text(obj)}


def current() -> dict[str, Any]:
    """Every public name's shape (API_VERSION itself is the record's key)."""
    return {name: describe(getattr(api, name)) for name in sorted(api.__all__)
            if name != "API_VERSION"}


def recorded() -> dict[str, dict[str, Any]]:
    return json.loads(SNAPSHOT.read_text())


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split(".")
    return int(major), int(minor)


def test_the_api_is_what_its_version_recorded() -> None:
    """A signature, a field, a member or a value changed without a new API_VERSION: fails."""
    snapshot = recorded()
    assert api.API_VERSION in snapshot, (
        f"API_VERSION {api.API_VERSION} has no record in {SNAPSHOT.name}: record it "
        "(python tests/test_public_api.py --record)")
    assert max(snapshot, key=_version) == api.API_VERSION, "API_VERSION is not the newest record"
    was, now = snapshot[api.API_VERSION], current()
    changed = sorted(n for n in set(was) | set(now) if was.get(n) != now.get(n))
    assert not changed, (
        f"the public API changed without a new API_VERSION ({api.API_VERSION}): {changed}; "
        "a minor for an added name, a major for a changed or removed one, then --record\n"
        + "\n".join(f"{n}: was {was.get(n)}\n   now {now.get(n)}" for n in changed))


def test_a_minor_only_adds() -> None:
    """Within a major, each record holds every name of the one before, unchanged."""
    snapshot = recorded()
    versions = sorted(snapshot, key=_version)
    for old, new in itertools.pairwise(versions):
        if _version(old)[0] != _version(new)[0]:
            continue  # a new major may change anything
        gone = sorted(n for n, d in snapshot[old].items() if snapshot[new].get(n) != d)
        assert not gone, f"{new} changes or removes {gone} of {old}: that needs a new major"


def test_the_record_sees_a_changed_signature_and_field(monkeypatch) -> None:
    """The guard is not names only: another default, another parameter, another field."""
    from cni.spec import errors

    base = current()

    def unsupported(key: str, value: object, why: str = "unsupported") -> errors.CNIError:
        raise AssertionError

    monkeypatch.setattr(api, "unsupported", unsupported)
    monkeypatch.setattr(errors.CNIError, "to_json", lambda self, version, extra=0: "")
    now = current()
    assert now["unsupported"] != base["unsupported"]
    assert now["CNIError"] != base["CNIError"]
    assert {n for n in base if base[n] != now[n]} == {"unsupported", "CNIError"}


def record() -> None:
    """Add the running API_VERSION's record; one already there is never rewritten."""
    snapshot = recorded() if SNAPSHOT.exists() else {}
    if api.API_VERSION in snapshot:
        if snapshot[api.API_VERSION] != current():
            sys.exit(f"{api.API_VERSION} is recorded with another API: a change needs a new "
                     "API_VERSION (cni/api.py) before it is recorded")
        return
    snapshot[api.API_VERSION] = current()
    SNAPSHOT.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    record()
