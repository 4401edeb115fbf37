"""The daemon's Prometheus metrics (`pycni daemon --metrics-listen HOST:PORT`), off by default.

Served from the daemon's own selector loop, never from a thread: the parent forks children and
spares, and a thread holding a lock at fork time can deadlock them. The endpoint answers GET
/metrics with prometheus_client's text exposition and nothing else (404 for another path, 405
for another method); each connection gets at most MAX_HEAD bytes of request and DEADLINE
seconds, and at most MAX_CONNS are open at once (the oldest goes first).

What the parent cannot see itself, a request's outcome, the child tells it: after sending its
reply to the shim it sends one datagram (pid, CNI result code, objects its GC removed, the
time) on a socketpair made before any fork (`report`, through child.after_reply). The parent
knows plugin and verb from the request, start times from the Job.

Imported by the daemon only when metrics are on: never on the shim's or the executables' path.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Sized
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from cni import registry
from cni.fast import child, procs
from cni.fast.child import EXIT_ANSWERED, EXIT_NOT_STARTED
from cni.fast.fds import accepted
from cni.fast.state import Job

log = logging.getLogger("pycni.daemon")

ENV = "PYCNI_METRICS_LISTEN"
MAX_HEAD = 8192  # bytes of request line and headers
DEADLINE = 5.0  # seconds a scrape connection may take, from accept to the last byte sent
MAX_CONNS = 16
VERBS = ("ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION")
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           120.0)
_OUTCOME = struct.Struct("!IiId")  # pid, CNI result code (0: success), GC removed, monotonic


def parse_listen(value: str) -> tuple[str, int]:
    """'127.0.0.1:9300', '[::1]:9300' or ':9300' (every address) -> (host, port); ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (port 1-65535)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host:
        ipaddress.ip_address(host)  # an address, not a name to resolve: ValueError
    return host, int(port)


# --- the child's side -------------------------------------------------------------------------

def report(sock: socket.socket, reply: Any) -> None:
    """One datagram about the reply just sent; never blocks, never raises (a full queue loses
    one outcome, not a request)."""
    code = 0
    if reply.code != 0:
        try:
            code = int(json.loads(reply.stdout).get("code", 999))
        except (ValueError, TypeError, AttributeError):
            code = 999
    try:
        sock.send(_OUTCOME.pack(os.getpid(), code, max(0, getattr(reply, "removed", 0) or 0),
                                time.monotonic()))
    except (OSError, struct.error):  # struct.error: a code beyond 32 bits (not a CNI one)
        pass


# --- the parent's side ------------------------------------------------------------------------

def _label(value: str, known: tuple[str, ...]) -> str:
    """Labels from a request are bounded to the known names (a client sends any string)."""
    return value if value in known else "other"


class Daemon(Protocol):
    """What the metrics read of the daemon's parent (server.Server)."""

    sel: selectors.BaseSelector  # its loop: the endpoint and the outcomes are served there
    jobs: dict[int, Job]  # running requests, by their child's pid
    queue: Sized  # requests waiting for a child

    def warm_spares(self) -> int: ...


class Metrics:
    """The registry, the outcome socket and the HTTP endpoint, hooked into one daemon."""

    def __init__(self, server: Daemon, listen: str) -> None:
        self.server = server
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("pycni_requests", "Requests answered, by plugin, verb and "
                                "result (0: success, else the CNI error code; abandoned: the "
                                "runtime killed the plugin first)",
                                ("plugin", "verb", "result"), registry=reg)
        self.duration = Histogram("pycni_request_duration_seconds", "From the daemon having "
                                  "a whole request to its reply", ("plugin", "verb"),
                                  buckets=BUCKETS, registry=reg)
        self.forks = Counter("pycni_forked_requests", "Requests that found no warm spare and "
                             "had a child forked for them", registry=reg)
        self.spare_served = Counter("pycni_spare_requests", "Requests served by a warm spare",
                                    registry=reg)
        self.retired = Counter("pycni_spares_retired", "Spares gone (after their last "
                               "request, when not provably back, or at exit)", registry=reg)
        self.gc_removed = Counter("pycni_gc_removed_objects", "Objects GC removed (rules, "
                                  "chains, ifbs, reservations), by plugin", ("plugin",),
                                  registry=reg)
        Gauge("pycni_requests_in_flight", "Requests received and not yet answered",
              registry=reg).set_function(lambda: len(server.jobs) + len(server.queue))
        Gauge("pycni_spares_warm", "Spares warm and waiting for a request",
              registry=reg).set_function(server.warm_spares)
        self.outcomes: dict[int, tuple[int, int, float]] = {}
        self.conns: dict[int, _Conn] = {}
        self.inbox, out = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for s in (self.inbox, out):
            s.setblocking(False)
        child.after_reply = lambda reply: report(out, reply)  # inherited by every fork
        self.outbox = out
        procs.parent_only(self.close_in_child)
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # reuse_port: a successor (handover.py) listens here before its predecessor exits
        # (the kernel allows that only to sockets of the same uid)
        self.listener = socket.create_server((host, port), family=family, backlog=16,
                                             reuse_port=True,
                                             dualstack_ipv6=family == socket.AF_INET6
                                             and not host)
        self.listener.setblocking(False)
        server.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        server.sel.register(self.inbox, selectors.EVENT_READ, lambda _s: self._drain(0))
        log.info("metrics on http://%s/metrics", listen)

    # outcomes ----------------------------------------------------------------------------------
    def _drain(self, finishing: int) -> None:
        """Read the outcomes waiting; keep those of running jobs and of `finishing` (the job
        being finished has already left server.jobs)."""
        while True:
            try:
                data = self.inbox.recv(_OUTCOME.size)
            except (BlockingIOError, InterruptedError):
                return
            if len(data) == _OUTCOME.size:
                pid, code, removed, at = _OUTCOME.unpack(data)
                if pid in self.server.jobs or pid == finishing:
                    self.outcomes[pid] = (code, removed, at)

    def finished(self, job: Job, exit_code: int) -> None:
        """A job is over: count it with the child's outcome, or what the parent saw."""
        self._drain(job.pid)  # sent before the child exited or said it is back
        plugin, verb = _job_labels(job.label)
        outcome = self.outcomes.pop(job.pid, None)
        if outcome is not None:
            code, removed, at = outcome
            result = str(code)
            if removed:
                self.gc_removed.labels(plugin).inc(removed)
        elif exit_code == EXIT_NOT_STARTED:
            return  # nothing ran: the shim runs it in-process
        else:
            at = time.monotonic()
            result = ("abandoned" if job.abandoned else "11" if job.timed_out
                      else "999" if exit_code != EXIT_ANSWERED else "unknown")
        self.requests.labels(plugin, verb, result).inc()
        self.duration.labels(plugin, verb).observe(max(0.0, at - job.received))

    # HTTP --------------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        for conn in accepted(listener):
            if len(self.conns) >= MAX_CONNS:
                self._close(next(iter(self.conns.values())))
            c = self.conns[conn.fileno()] = _Conn(conn, time.monotonic() + DEADLINE)
            self.server.sel.register(conn, selectors.EVENT_READ, lambda _s, c=c: self._read(c))

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(MAX_HEAD)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        if c.answered:
            return  # what a client still sends after the answer is dropped (until EOF)
        c.head += data
        if b"\r\n\r\n" not in c.head and b"\n\n" not in c.head:
            if len(c.head) >= MAX_HEAD:
                self._answer(c, 431, b"request header too large\n")
            return
        self._answer(c, *self._respond(c.head.split(b"\n", 1)[0]))

    def _respond(self, line: bytes) -> tuple[int, bytes]:
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, b"bad request\n"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target != "/metrics":
            return 404, b"only /metrics is served here\n"
        if method != "GET":
            return 405, b"only GET\n"
        return 200, generate_latest(self.registry)

    def _answer(self, c: _Conn, status: int, body: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large"}[status]
        kind = CONTENT_TYPE_PLAIN_0_0_4 if status == 200 else "text/plain; charset=utf-8"
        allow = "Allow: GET\r\n" if status == 405 else ""
        c.out = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                 f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n"
                 ).encode() + body
        self.server.sel.modify(c.sock, selectors.EVENT_WRITE, lambda _s: self._write(c))
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(c.out)  # the client is gone: done with it
        c.out = c.out[sent:]
        if not c.out:
            # Half-close and read on to the client's EOF (within the deadline): closing with
            # its unread bytes would reset the connection before it read the answer.
            c.answered = True
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._close(c)
                return
            self.server.sel.modify(c.sock, selectors.EVENT_READ, lambda _s: self._read(c))

    def _close(self, c: _Conn) -> None:
        if self.conns.pop(c.sock.fileno(), None) is not None:
            self.server.sel.unregister(c.sock)
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.sock.close()

    def expire(self) -> None:
        """Close scrape connections past their deadline (called from the daemon's loop)."""
        now = time.monotonic()
        for c in [c for c in self.conns.values() if c.deadline <= now]:
            self._close(c)

    def close_in_child(self) -> None:
        """A forked child drops the endpoint and the parent's end; it keeps the outbox."""
        for c in list(self.conns.values()):
            c.sock.close()
        self.conns.clear()
        self.listener.close()
        self.inbox.close()


class _Conn:
    __slots__ = ("sock", "deadline", "head", "out", "answered")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.head = b""
        self.out = b""
        self.answered = False


def _job_labels(label: str) -> tuple[str, str]:
    """(plugin, verb) of a Job's label "plugin COMMAND containerid", bounded to known names."""
    words = label.split(" ")
    return (_label(words[0], registry.names()),
            _label(words[1] if len(words) > 1 else "", VERBS))

