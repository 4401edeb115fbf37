"""`pycni daemon`: a forkserver that has the heavy modules imported once.

The parent imports pydantic, nftables and every plugin module (another package's once
cni.plugload has passed its files and its import in a child with a deadline; the table is then
fixed) and builds every config model's validator (preload.py),
then only accepts connections and reads requests (server.py: non-blocking, each with a deadline,
so idle or slow clients block nobody). A complete request gets a forked child (child.py): it
ACKs, enters the caller's mount and network namespaces and working directory, takes the caller's
environment and umask, runs `skel.run(plugin, env, stdin, netns=fd)` and sends the Reply. The
parent kills a child that overruns its timeout and answers for it; a child that crashes gets an
error reply; neither touches the parent or any other request. Children are mostly spares, forked
and warmed ahead by the zygote (zygote.py: a child of the parent at SCHED_IDLE, so that the
parent forks only when no spare is ready) and adopted by the parent, a child subreaper. A spare
serves request after request, up to child.MAX_SERVED, as long as it can show it is back to what
it was before each (child.back_home: fds, threads, children, namespaces, cwd, umask,
environment); a used process runs a plugin's path without a fresh fork's page faults. Under load
the pool grows (a request forked while every spare is busy stays as a spare, up to
--max-spares; then requests wait for one, --spare-wait) and shrinks back to --spares when idle.

Listening (listener.py): an inherited socket (systemd socket activation: LISTEN_FDS/LISTEN_PID),
else a socket it binds itself (default /run/pycni/pycni.sock; directory 0700, socket 0600). Peers
must be root (SO_PEERCRED). SIGTERM: stop accepting, run every request already accepted, let
the children finish, exit; a second SIGTERM kills the running ones. Upgrades (handover.py): a
daemon on its own socket hands it to a successor running the installed code when `pycni install`
asks; under systemd `systemctl restart pycni.service` does it, the socket unit holding the socket.

The one entry: `pycni daemon` (cni/cli loads `command` lazily) and `python -m cni.fast.daemon`.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

import click

from cni.fast import protocol as proto
from cni.fast.child import Runner
from cni.fast.listener import bind, inherited_listener, raise_fd_limit
from cni.fast.preload import preimport, warm_up
from cni.fast.server import Options, Server

log = logging.getLogger("pycni.daemon")


def run_daemon(opts: Options, runner: Runner | None = None) -> int:
    """Listen (inherited or bound), import the heavy modules once, serve until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s[%(process)d]: %(levelname)s %(message)s")
    log.setLevel(logging.DEBUG if opts.verbose else logging.INFO)  # ours only, not pyroute2's
    raise_fd_limit()
    inherited = inherited_listener()
    if inherited is None:
        listener, owned = bind(opts.socket_path, opts.take_over), opts.socket_path
    else:
        listener, owned = inherited  # owned: a predecessor's own socket file (handover.py)
    missing = preimport()
    if missing:
        log.info("not available (requests for them fail as in-process): %s", ", ".join(missing))
    warm_up()  # first-use caches filled once, shared by every child
    gc.collect()
    gc.freeze()  # the imported world stays shared with the children, untouched by their GC
    Server(listener, opts, runner, owned_path=owned).serve()
    return 0


@click.command("daemon")
@click.option("--socket", "socket_path", metavar="PATH", show_default=True,
              default=lambda: os.environ.get(proto.SOCKET_ENV) or proto.DEFAULT_SOCKET,
              help="Unix socket to listen on (ignored under systemd socket activation).")
@click.option("--timeout", type=float, default=Options.timeout, show_default=True,
              help="Seconds a request may run before its child is killed (error 11).")
@click.option("--max-children", type=int, default=Options.max_children, show_default=True,
              help="Requests run at once; more wait in a queue.")
@click.option("--spares", type=int, default=Options.spares, show_default=True,
              help="Children forked and warmed ahead of requests; each serves request after "
                   "request.")
@click.option("--max-spares", type=int, default=Options.max_spares, show_default=True,
              help="Spares at most: while every spare runs a request, a request's child stays "
                   "as one more (unless --spares is 0); those beyond --spares retire after "
                   "--spare-linger idle seconds.")
@click.option("--spare-linger", type=float, default=Options.spare_linger, show_default=True,
              help="Seconds an extra spare stays idle before it retires.")
@click.option("--spare-wait", type=float, default=Options.spare_wait, show_default=True,
              help="Seconds a request with no spare warm waits for one to come back (one "
                   "that has answered its request, or any with --max-spares all busy) before "
                   "the pool grows or it forks a child of its own.")
@click.option("--metrics-listen", metavar="HOST:PORT", envvar="PYCNI_METRICS_LISTEN",
              default="", callback=lambda _ctx, _param, value: _listen(value),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
                   "env PYCNI_METRICS_LISTEN).")
@click.option("--take-over", is_flag=True,
              help="If a daemon listens on --socket, take the path over (bind beside it, rename "
                   "onto it) instead of exiting: a DaemonSet's rolling update "
                   "(deploy/pycni.yaml).")
@click.option("-v", "--verbose", is_flag=True, help="Log every request served.")
def command(socket_path: str, timeout: float, max_children: int, spares: int,
            max_spares: int, spare_linger: float, spare_wait: float, metrics_listen: str,
            take_over: bool, verbose: bool) -> None:
    """Run the forkserver the plugin executables hand their requests to."""
    raise SystemExit(run_daemon(Options(socket_path=socket_path, timeout=timeout,
                                        max_children=max_children, spares=spares,
                                        max_spares=max_spares, spare_linger=spare_linger,
                                        spare_wait=spare_wait,
                                        metrics_listen=metrics_listen, verbose=verbose,
                                        take_over=take_over)))


def _listen(value: str) -> str:
    """--metrics-listen checked before anything starts (prometheus_client only when set)."""
    if value:
        from cni.fast.metrics import parse_listen
        try:
            parse_listen(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


if __name__ == "__main__":
    command(prog_name="python -m cni.fast.daemon")
