"""nftables through libnftables, in-process.

Changes are nft text scripts applied as one batch (a failure changes nothing); reads use JSON
output (nft 1.0.6 crashes on some JSON rule *input*, never on output). Every string that reaches
a script goes through `quote` or a validator first: nothing unvalidated gets into the ruleset.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cni.host import netns
from cni.host.errors import HostError

# One libnftables context per network namespace: a context keeps the netlink socket it opened
# in the namespace it was made in, so a context reused after a setns would read and change the
# first namespace's ruleset.
_ctx: dict[tuple[int, int], Any] = {}
# A daemon spare's context for its own namespace, kept from request to request (as nftrecord
# keeps its NFTSockets): making one costs ~0.25 ms of CPU, most of a DEL that has nothing to
# remove. libnftables checks its cache against the ruleset's generation on every command, so a
# kept context reads what another process changed since (as firewalld's long-lived one does).
_home: tuple[tuple[int, int], Any] | None = None
_SAFE_COMMENT = re.compile(r"^[A-Za-z0-9 _.,:/@=+\-]*$")
_UNSAFE_IN_COMMENT = re.compile('[\x00-\x1f\x7f"]')  # control characters and '"'
_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")
# What nft's scanner reads as one unquoted identifier (1.0.6 takes no quoted chain names).
_CHAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")
COMMENT_MAX = 128
FAMILIES = ("ip", "ip6", "inet", "bridge", "arp", "netdev")


class NftError(HostError):
    """nft refused a script or a read; the message is nft's own."""


class NftUnavailable(NftError):
    """libnftables is missing or nftables does not work on this host."""


def _nft():
    key = netns.ns_key()
    ctx = _ctx.get(key)
    if ctx is None:
        try:
            import nftables
            ctx = nftables.Nftables()
        except (ImportError, OSError) as e:
            raise NftUnavailable(f"libnftables is not usable: {e}") from None
        ctx.set_json_output(False)
        ctx.set_handle_output(True)
        _ctx[key] = ctx
    return ctx


def keep_home_context() -> None:
    """Make the context of this process's namespace now, and keep it (drop_contexts leaves
    it). Only for a daemon's spare, in its warm-up (before it records its fds)."""
    global _home
    if _home is None:
        ctx = _nft()
        _home = (netns.ns_key(), ctx)


def drop_contexts() -> None:
    """Free every context and its socket but the kept one (keep_home_context). For a process
    that serves again after a request: a context pins the namespace it was made in, and the
    next request starts as a fresh process would."""
    _ctx.clear()
    if _home is not None:
        _ctx[_home[0]] = _home[1]


def forget_inherited() -> None:
    """In a forked child (netns.forget_inherited): contexts of its own from now on; the
    parent's stay referenced, their sockets unclosed (the parent's too)."""
    global _home
    netns.keep_referenced(_home, dict(_ctx))
    _home = None
    _ctx.clear()


def run(script: str) -> None:
    """Apply a script of nft commands as one atomic transaction."""
    nft = _nft()
    nft.set_json_output(False)
    rc, _out, err = nft.cmd(script)
    if rc != 0:
        raise NftError(f"nft: {err.strip() or 'failed'}")


def check(script: str) -> str | None:
    """nft's verdict on a script without applying it (libnftables dry run: parsed and evaluated,
    nothing committed); None when nft accepts it, else nft's error."""
    import ctypes

    nft = _nft()
    lib = ctypes.CDLL("libnftables.so.1")
    lib.nft_ctx_set_dry_run.argtypes = [ctypes.c_void_p, ctypes.c_bool]
    ctx = nft._Nftables__ctx  # the binding has no dry-run setter; the C API has
    nft.set_json_output(False)
    lib.nft_ctx_set_dry_run(ctx, True)
    try:
        rc, _out, err = nft.cmd(script)
    finally:
        lib.nft_ctx_set_dry_run(ctx, False)
    return None if rc == 0 else (err.strip() or "refused")


def list_json(what: str) -> list[dict[str, Any]]:
    """`nft -j list <what>` as the list of objects; a missing table or chain is []."""
    nft = _nft()
    nft.set_json_output(True)
    try:
        rc, out, err = nft.cmd(f"list {what}")
    finally:
        nft.set_json_output(False)
    if rc != 0:
        if "No such file or directory" in err:
            return []
        raise NftError(f"nft: {err.strip() or 'failed'}")
    return json.loads(out).get("nftables", []) if out.strip() else []


def rules(family: str, table: str, chain: str | None = None) -> list[dict[str, Any]]:
    """The rule objects of a table (or one chain), each with its handle and comment."""
    what = f"chain {family} {table} {chain_name(chain)}" if chain else f"table {family} {table}"
    return [o["rule"] for o in list_json(ident_family(family, table, what)) if "rule" in o]


def chains(family: str, table: str) -> list[str]:
    return [o["chain"]["name"] for o in list_json(ident_family(family, table,
                                                               f"table {family} {table}"))
            if "chain" in o]


def table_exists(family: str, table: str) -> bool:
    """Asked as `list sets` of the table: nft 1.0.6 fetches the table's sets only, where `list
    table` or `list tables` fetch every chain and rule (a cost that grows with the table)."""
    return bool(list_json(ident_family(family, table, f"sets table {family} {table}")))


def delete_rules_script(found: list[dict[str, Any]]) -> str:
    """Commands deleting the given rule objects by handle (for one batch with other work)."""
    return "".join(
        f"delete rule {r['family']} {ident(r['table'])} {chain_name(r['chain'])} "
        f"handle {int(r['handle'])}\n" for r in found)


def available() -> tuple[bool, str]:
    """Whether nftables works here (STATUS, doctor): one read of nf_tables. `list sets`, as
    `list tables` in nft 1.0.6 fetches every chain and rule (~1.5 ms with 300 chains, growing
    with the pods on the node; `list sets` ~0.05 ms)."""
    try:
        list_json("sets")
    except NftError as e:
        return False, str(e)
    return True, ""


def quote(text: str) -> str:
    """A comment or other string literal for a script: refused unless plainly safe."""
    if len(text) > 128 or not _SAFE_COMMENT.match(text):
        raise ValueError(f"unsafe string for an nft rule: {text!r}")
    return f'"{text}"'


def comment(text: str) -> str:
    """A rule comment as written by the reference (any text nft keeps verbatim between double
    quotes): refused if it holds a '"', a control character or more than 128 bytes."""
    if len(text.encode()) > COMMENT_MAX or _UNSAFE_IN_COMMENT.search(text):
        raise ValueError(f"unsafe comment for an nft rule: {text!r}")
    return f'"{text}"'


def chain_name(name: str) -> str:
    """A chain name for a script: nft's unquoted identifier syntax, at most 256 bytes."""
    if not _CHAIN.match(name or "") or len(name) > 256:
        raise ValueError(f"unsafe nft chain name: {name!r}")
    return name


def ident(name: str) -> str:
    if not _IDENT.match(name or "") or len(name) > 64:
        raise ValueError(f"unsafe nft identifier: {name!r}")
    return name


def ident_family(family: str, table: str, what: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown nft family: {family!r}")
    ident(table)
    return what
