"""Pod accepts in the host's iptables FORWARD chain, for a host whose iptables drops forwarded
traffic (Docker sets `iptables -P FORWARD DROP`).

Every base chain at a hook must accept a packet: an accept in pycni's own nft table does not
override a drop in `ip filter FORWARD`, nor in x_tables' filter FORWARD (iptables-legacy, which
nft cannot see). So where a backend's filter table exists, in either family, the firewall
plugin also writes the reference's iptables layout there, in each of the pod's families (as the
reference, which makes both families' chains), with that backend's own iptables (rules written
in nft syntax into iptables' table would list as garbage in iptables-save):

    -A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD      (first)
    -A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
    -A CNI-FORWARD -d P/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    -A CNI-FORWARD -s P/32 -j ACCEPT

the very rules the reference's iptables backend writes (through whichever `iptables` the host
has), so each side's DEL and CHECK handle the other's. A host with neither filter table
(nftables only) gets no iptables table. One `iptables-{nft,legacy}-restore --noflush` per
backend, family and change: atomic, one at a time (a lock in /run/pycni). No verb lists the
filter table once the host has the chains: ADD reads CNI-FORWARD alone, DEL deletes by spec
(`-D`), CHECK asks by spec (`-C`); only a host's first ADD lists it (and retries if the table
changed meanwhile). Nothing here knows CNI.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import NamedTuple

from cni.host import nft, procfs
from cni.host.errors import HostError

NFT_FAMILY = {4: "ip", 6: "ip6"}
NFT, LEGACY = "nft", "legacy"
TOOLS = {NFT: {4: ("iptables-nft", "iptables-nft-restore"),
               6: ("ip6tables-nft", "ip6tables-nft-restore")},
         LEGACY: {4: ("iptables-legacy", "iptables-legacy-restore"),
                  6: ("ip6tables-legacy", "ip6tables-legacy-restore")}}
# x_tables' tables of this network namespace (the calling thread's): "filter" once anything
# (iptables-legacy, the reference through it) has used it here
LEGACY_TABLES = {4: "/proc/thread-self/net/ip_tables_names",
                 6: "/proc/thread-self/net/ip6_tables_names"}
PRIV = "CNI-FORWARD"
DEFAULT_ADMIN = "CNI-ADMIN"
FILTER_COMMENT = "CNI firewall plugin rules"
ADMIN_COMMENT = "CNI firewall plugin admin overrides"
# names an admin chain cannot have: the built-in chains, the verdicts, our own chain
RESERVED = frozenset(("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING", "ACCEPT",
                      "DROP", "RETURN", "QUEUE", "CNI-FORWARD"))
CHAIN_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,27}")  # XT_EXTENSION_MAXNAMELEN - 1
_TIMEOUT = 30
_RETRIES = 3
LOCK_DIR = "/run/pycni"
LOCK = "xtforward.lock"
LOCK_WAIT = 60.0  # for another's iptables run (each bounded by _TIMEOUT): then error 11


class XtablesError(HostError):
    """iptables refused or is missing; the message is its own."""


class XtablesIncompatible(XtablesError):
    """iptables-nft cannot read the host's filter table: it holds rules written with nft that
    iptables has no syntax for."""


class Filter(NamedTuple):
    """One iptables filter table: a backend's, of one family."""

    backend: str  # NFT or LEGACY
    family: int

    def tool(self, which: int) -> str:
        """The path of its iptables (0) or iptables-restore (1), from the system's own dirs."""
        name = TOOLS[self.backend][self.family][which]
        path = shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
        if path is None:
            raise XtablesError(f"{name} not found: the host has an iptables filter table "
                               f"({self.where}) the pod rules must go into")
        return path

    @property
    def where(self) -> str:
        if self.backend == LEGACY:
            return f"{TOOLS[LEGACY][self.family][0]}'s filter, x_tables"
        return f"nftables {NFT_FAMILY[self.family]} filter"


def in_use() -> list[str]:
    """The iptables backends whose filter table the host has, in either family: iptables-nft's
    (`ip`/`ip6 filter` with its FORWARD chain, seen through nft) and x_tables' (iptables-legacy;
    nft cannot see it, the kernel names it in /proc/net/ip{,6}_tables_names)."""
    out = []
    if any(nft.list_json(f"chain {NFT_FAMILY[f]} filter FORWARD") for f in NFT_FAMILY):
        out.append(NFT)
    if any(b"filter" in procfs.read(path).split() for path in LEGACY_TABLES.values()
           if os.path.exists(path)):
        out.append(LEGACY)
    return out


def filters(families: list[int]) -> list[Filter]:
    """The filter tables a pod of these families needs its accepts in."""
    return [Filter(b, f) for b in in_use() for f in families]


def _failure(tool: str, stderr: str) -> XtablesError:
    text = f"{tool}: {stderr.strip() or 'failed'}"
    return XtablesIncompatible(text) if "is incompatible" in stderr else XtablesError(text)


def listing(where: Filter) -> list[str]:
    """`iptables -t filter -S`: the filter table as rule specs."""
    proc = subprocess.run([where.tool(0), "-w", "-t", "filter", "-S"], capture_output=True,
                          text=True, timeout=_TIMEOUT)
    if proc.returncode != 0:
        raise _failure(f"{TOOLS[where.backend][where.family][0]} -S", proc.stderr)
    return proc.stdout.splitlines()


def _restore(where: Filter, script: str) -> None:
    proc = subprocess.run([where.tool(1), "-w", "--noflush"], input=script,
                          capture_output=True, text=True, timeout=_TIMEOUT)
    if proc.returncode != 0:
        raise _failure(TOOLS[where.backend][where.family][1], proc.stderr)


def _prefix(ip: str) -> str:
    addr = ipaddress.ip_address(ip)
    return f"{addr}/{addr.max_prefixlen}"


def pod_specs(ip: str) -> list[str]:
    """The address's accepts in CNI-FORWARD, as `-S` prints them."""
    p = _prefix(ip)
    return [f"-A {PRIV} -d {p} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            f"-A {PRIV} -s {p} -j ACCEPT"]


def entry_specs(admin: str) -> list[str]:
    return [f'-A FORWARD -m comment --comment "{FILTER_COMMENT}" -j {PRIV}',
            f'-A {PRIV} -m comment --comment "{ADMIN_COMMENT}" -j {admin}']


def _as(spec: str, command: str) -> str:
    return command + spec[2:]  # "-A CHAIN ..." as "-C CHAIN ..." / "-D CHAIN ..."


def add(where: Filter, ips: list[str], admin: str) -> None:
    """The chains, the entry jumps (first in their chains) and each address's accepts, as far
    as they are missing; one transaction. Reads CNI-FORWARD alone (the FORWARD jump is asked by
    spec, `-C`, in the same transaction as the new accepts); only a host without the chains or
    jumps yet (its first pod) has its filter table listed."""
    forward, to_admin = entry_specs(admin)
    with _locked():
        have = chain_specs(where, PRIV)
        if have is not None and to_admin in have:
            lines = [_as(forward, "-C")] + [s for ip in ips for s in pod_specs(ip)
                                            if s not in have]
            try:
                _restore(where, _script(lines))
                return
            except XtablesError:  # the FORWARD jump is missing, or another writer raced
                pass
        _apply(where, lambda listed: _add_lines(listed, ips, admin))


def chain_specs(where: Filter, chain: str) -> list[str] | None:
    """`iptables -S <chain>`: one chain's rules as specs; None when there is no such chain."""
    proc = subprocess.run([where.tool(0), "-w", "-t", "filter", "-S", chain],
                          capture_output=True, text=True, timeout=_TIMEOUT)
    return proc.stdout.splitlines() if proc.returncode == 0 else None


def _add_lines(have: list[str], ips: list[str], admin: str) -> list[str]:
    lines = [f"-N {c}" for c in (PRIV, admin) if f"-N {c}" not in have]
    forward, to_admin = entry_specs(admin)
    if forward not in have:
        lines.append(forward.replace("-A FORWARD", "-I FORWARD 1", 1))
    if to_admin not in have:
        lines.append(to_admin.replace(f"-A {PRIV}", f"-I {PRIV} 1", 1))
    return lines + [s for ip in ips for s in pod_specs(ip) if s not in have]


def delete(where: Filter, ips: list[str], owned: Callable[[str], bool] = lambda _ip: False
           ) -> list[str]:
    """Each address's accepts, where present, unless owned(address) says another attachment
    still needs them (asked under the lock, after which no ADD of it is half done); by spec
    (`-D`), no listing. The chains and jumps stay (as the reference's). -> the addresses
    released."""
    with _locked():
        gone = [ip for ip in ips if not owned(ip)]
        specs = [_as(s, "-D") for ip in gone for s in pod_specs(ip)]
        _failing(where, specs)  # a rule already gone is no error
    return gone


_LINE = re.compile(r"line (\d+) failed")


def _failing(where: Filter, lines: list[str]) -> list[int]:
    """Restore `lines` as one transaction, leaving out each line that fails (a `-C` of a rule
    that is not there, a `-D` of one already gone) until the rest pass; -> the indexes left
    out. A failed transaction applies nothing, so each try starts from the same table.
    XtablesError when a failure names no line."""
    failed: list[int] = []
    todo = list(range(len(lines)))
    while todo:
        try:
            _restore(where, _script([lines[i] for i in todo]))
            break
        except XtablesError as e:
            m = _LINE.search(str(e))
            n = int(m.group(1)) - 2 if m else -1  # line 1 is "*filter"
            if not 0 <= n < len(todo):
                raise  # no line named (a chain is missing, say): nothing to leave out
            failed.append(todo.pop(n))
    return sorted(failed)


def _script(lines: list[str]) -> str:
    return "*filter\n" + "\n".join(lines) + "\nCOMMIT\n"


def _apply(where: Filter, script: Callable[[list[str]], list[str]]) -> None:
    """Restore the lines script(listing) makes from a fresh listing; again if the table changed
    in between (a concurrent ADD made a chain, a DEL removed a rule: the batch fails whole,
    since `-N` of an existing chain and `-D` of a missing rule are errors; a `:chain` line would
    flush another ADD's rules instead). Under the caller's lock."""
    for attempt in range(_RETRIES):
        lines = script(listing(where))
        if not lines:
            return
        try:
            _restore(where, _script(lines))
            return
        except XtablesError:
            if attempt == _RETRIES - 1:
                raise


def _locked() -> contextlib.AbstractContextManager[None]:
    """pycni's iptables changes one at a time: iptables-nft-restore replays a batch whose
    table changed while it ran, so two first ADDs racing could each insert the FORWARD jump."""
    from cni.host import lockfile

    return lockfile.held(os.path.join(LOCK_DIR, LOCK), LOCK_WAIT)


def missing(where: Filter, ips: list[str], admin: str) -> str | None:
    """The first expected rule that is not there (None: all are), asked by spec; listed
    only when iptables names no line (a chain is missing)."""
    specs = entry_specs(admin) + [s for ip in ips for s in pod_specs(ip)]
    try:
        failed = _failing(where, [_as(s, "-C") for s in specs])
    except XtablesError:
        have = listing(where)
        failed = [i for i, s in enumerate(specs) if s not in have]
    return specs[failed[0]] if failed else None
