"""The asking side of a daemon handover (the daemon's side: cni/fast/handover.py): what
`pycni install` does about a running daemon when there are no systemd units to restart it."""

from __future__ import annotations

import json

from cni.fast import protocol as proto
from cni.fast import status
from cni.fast.handover import READY_TIMEOUT


class HandoverError(Exception):
    """The daemon did not hand over (it goes on serving with the code it runs)."""


def request(socket_path: str | None = None, timeout: float = READY_TIMEOUT + 30) -> dict:
    """Ask the daemon on the socket to hand over; its answer ({"pid", "successor"}) once the
    successor serves. HandoverError says why not."""
    answer = status.ask(proto.HANDOVER_MAGIC, socket_path, timeout)
    if answer is None:
        raise HandoverError(f"no pycni daemon answers on {status.socket_path(socket_path)}")
    code, out = answer
    try:
        reply = json.loads(out)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise HandoverError(f"not an answer to a handover: {out[:200]!r}")
    if code != 0:
        msg = str(reply.get("msg", reply))
        if "not a pycni request" in msg:  # a daemon from before handovers
            msg += " (a daemon too old to hand over: restart it)"
        raise HandoverError(msg)
    return reply


def upgrade(version: str, socket_path: str | None = None) -> str:
    """A daemon that runs another version than `version` hands over to a successor, which must
    then run `version`. A line saying what happened; HandoverError if the daemon does not run
    `version` afterwards."""
    path = status.socket_path(socket_path)
    before = status.query(path)
    if before is None:
        return f"no pycni daemon answers on {path} (one started from now on runs {version})"
    if before.get("version") == version:
        return f"the pycni daemon on {path} (pid {before.get('pid')}) runs {version} already"
    answer = request(path)
    after = status.query(path, timeout=30)
    if after is None or after.get("version") != version:
        running = after.get("version") if after else "nothing that answers"
        raise HandoverError(f"the daemon on {path} handed over to pid {answer['successor']}, "
                            f"which runs {running}, not {version}: the daemon's command line "
                            "runs another install (start this venv's `pycni daemon` instead)")
    return (f"the pycni daemon on {path} (pid {answer['pid']}, {before.get('version')}) handed "
            f"over to pid {after.get('pid')} ({version}) after the requests it had accepted")
