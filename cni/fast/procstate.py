"""What a daemon's spare checks of itself after a request and does not restore (child.back_home):
the process state a plugin of anyone's could change and pass on to the next caller's request."""

from __future__ import annotations

import os
import signal
from _signal import getsignal as _getsignal

from cni.host import procfs

# The signals process_state reads the handler of, with their names (an enum lookup each costs
# more than the rest of process_state: looked up once)
_SIGNALS = tuple((sig, signal.Signals(sig).name) for sig in signal.valid_signals()
                 if sig not in (signal.SIGKILL, signal.SIGSTOP)
                 and sig in signal.Signals._value2member_map_)


def process_state() -> dict[str, object]:
    """What a request may change in the process that outlives it and that back_home does not
    restore: Python's signal handlers, and from our own /proc the kernel's signal sets (what a
    C extension or ctypes sigaction changes too), credentials, capabilities, no_new_privs,
    seccomp, and the nice value, CPU affinity and resource limits. A plugin of anyone's runs
    in the spare: one that drops a capability or a group, or lowers a limit, must not pass it
    on to the next caller's request."""
    # (_signal's getsignal: signal.getsignal's value before it turns SIG_DFL / SIG_IGN into
    # signal.Handlers, a lookup that cost ~1 us a signal, ~25 us cold on a spare's path; the
    # same comparison, since Handlers.SIG_DFL == 0; _shown names them for the log)
    state: dict[str, object] = {name: _getsignal(sig) for sig, name in _SIGNALS}
    status = procfs.read("/proc/thread-self/status")
    for key, tag in _STATUS:  # these lines of ~55: found, not the whole file split and decoded
        at = status.find(tag)
        if at >= 0:
            end = status.find(b"\n", at + len(tag))
            state[key] = status[at + len(tag):end if end >= 0 else None].decode().strip()
    state["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    state["affinity"] = os.sched_getaffinity(0)
    state["limits"] = procfs.read("/proc/thread-self/limits")  # (compared as is: one read)
    return state


_STATUS = tuple((key, f"\n{key}:".encode()) for key in (
    "SigBlk", "SigIgn", "SigCgt", "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff",
    "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"))


def describe_change(key: str, before: object, after: object) -> str:
    """One process_state key's change, for the log: SIG_DFL and SIG_IGN by name, the limits by
    the lines of /proc's limits file that differ."""
    if isinstance(before, bytes) and isinstance(after, bytes):
        was, now = before.decode().splitlines(), after.decode().splitlines()
        return "; ".join(f"{' '.join(a.split())} -> {' '.join(b.split())}"
                         for a, b in zip(was, now, strict=False) if a != b)
    return f"{key} {_shown(before)} -> {_shown(after)}"


def _shown(value: object) -> object:
    """A signal handler as signal.getsignal shows it (SIG_DFL, SIG_IGN by name)."""
    try:
        return signal.Handlers(value)
    except ValueError:
        return value
