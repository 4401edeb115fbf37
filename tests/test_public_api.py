"""cni.api, the interface third-party plugins use (docs/PLUGINS.md): every public name listed
here must stay importable from it, with the meaning the docs give; a name that disappears fails
here. Adding a name: add it here, to cni.api.__all__ and to docs/PLUGINS.md (and bump
API_VERSION's minor); removing or changing one needs a new major."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cnitest import ROOT, VENV_PY

import cni.api as api

PUBLIC = {
    "API_VERSION", "ENTRY_POINT_GROUP",
    "Request", "valid_attachments",
    "CNIError", "Code", "invalid_config", "unsupported", "HostError", "NamespaceError",
    "Result", "to_current", "from_current", "convert",
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
