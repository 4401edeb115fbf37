"""What the daemon's parent keeps: its options, its counts, and each request as it goes: a
connection still sending (Pending), a complete request waiting for a child (Ready), a request
a child runs (Job). Below the server, the spare pool and the metrics, which all read them."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from cni.fast import protocol as proto


@dataclass
class Options:
    socket_path: str = proto.DEFAULT_SOCKET
    timeout: float = 120.0  # per request, from fork to reply
    read_timeout: float = 10.0  # for a request to arrive completely after connect
    max_request: int = proto.MAX_REQUEST
    max_children: int = 64  # running at once; more wait in a queue
    spares: int = 2  # children forked and warmed ahead, so a request pays neither; reused
    # Under load (every spare busy) a request's child becomes a spare too, up to max_spares:
    # a burst of pods then pays a fork per spare, not per request. The spares beyond `spares`
    # retire once idle for spare_linger seconds.
    max_spares: int = 8
    spare_linger: float = 10.0
    # With no spare warm, a request waits this long for one that has answered its request (or,
    # with max_spares busy, any) to come back before the pool grows or it forks a child of its
    # own (a spare is back within milliseconds; a fork costs more CPU than that). pool.py.
    spare_wait: float = 0.5
    max_pending: int = 4096  # connections still sending; the oldest go first beyond this
    verbose: bool = False  # log every request served
    metrics_listen: str = ""  # HOST:PORT serving GET /metrics (metrics.py); "" = off
    take_over: bool = False  # a live daemon's socket path: renamed onto (listener.bind)


@dataclass
class Counts:
    """The daemon's own figures since it started: the status query's (status.py), for tests
    to prove the daemon served (the shim may fall back to in-process) and for metrics."""

    started: int = 0  # requests handed to a child: a warm spare, or one forked for it
    answered: int = 0  # started requests that got a reply (from their child, or for it)
    forked: int = 0  # started requests that forked a child of their own (no spare was warm)
    # answered, by plugin name (the names cni.registry serves; anything else as "other")
    by_plugin: dict[str, int] = field(default_factory=dict)


@dataclass
class Pending:
    """A connection whose request is still arriving."""

    conn: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    peer: int = 0  # the client's pid (SO_PEERCRED), to tell a nested call
    refused: str = ""  # answered with this error once its request is in (so it reads it)
    watched: bool = False  # registered with the server's selector (it was not all there)


@dataclass
class Ready:
    """A complete request, waiting for a child."""

    conn: socket.socket
    data: bytes
    fds: list[int]
    label: str  # "plugin COMMAND containerid", for logs and error messages
    key: tuple[str, str] | None  # (container ID, ifname): one request at a time per attachment
    parts: tuple[str, bytes, bytes, int, int]  # data decoded (protocol.decode_request)
    peer: int = 0  # the client's pid
    holder: int = 0  # the pid its attachment lock token names (attachlock.ENV), if any
    held: bool = False  # waiting for a request on the same attachment
    inside_job: bool | None = None  # its caller descends from a running job (Server._inside_job)
    fresh: bool = True  # read in this turn of the loop: its caller was there a moment ago
    received: float = field(default_factory=time.monotonic)  # complete (metrics' latency)


@dataclass
class Job:
    """A request a child is running; the parent keeps the connection to answer if it dies."""

    pid: int
    conn: socket.socket
    deadline: float
    label: str
    stdin: bytes
    key: tuple[str, str] | None = None
    timed_out: bool = False
    abandoned: bool = False  # its caller went away (the runtime killed the plugin)
    watched: bool = True  # its connection is in the selector (for the caller hanging up)
    received: float = 0.0  # when its request was complete (Ready.received)
