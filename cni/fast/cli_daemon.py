"""`pycni daemon`: the click face of cni.fast.daemon (imported only when the command runs)."""

from __future__ import annotations

import os

import click

from cni.fast import protocol as proto


@click.command("daemon")
@click.option("--socket", "socket_path", metavar="PATH", show_default=True,
              default=lambda: os.environ.get(proto.SOCKET_ENV) or proto.DEFAULT_SOCKET,
              help="Unix socket to listen on (ignored under systemd socket activation).")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds a request may run before its child is killed (error 11).")
@click.option("--max-children", type=int, default=64, show_default=True,
              help="Requests run at once; more wait in a queue.")
@click.option("--spares", type=int, default=2, show_default=True,
              help="Children forked and warmed ahead of requests.")
@click.option("-v", "--verbose", is_flag=True, help="Log every request served.")
def command(socket_path: str, timeout: float, max_children: int, spares: int,
            verbose: bool) -> None:
    """Run the forkserver the plugin executables hand their requests to."""
    from cni.fast import daemon

    raise SystemExit(daemon.run_daemon(daemon.Options(
        socket_path=socket_path, timeout=timeout, max_children=max_children,
        spares=spares, verbose=verbose)))
