"""`pycni`, one command tree. Each subcommand lives in the module that names its area and is
imported only when it runs, so `pycni add` never pays for install, doctor or the daemon:

- cni/cli/runner.py: add, check, del, gc, status, version (cnitool-compatible, libcni's cache);
- cni/cli/node.py: install, uninstall, doctor, attachments;
- cni/fast/daemon.py: daemon (the plugins' forkserver);
- demo, below (cni/demo.py does the work).
"""

from __future__ import annotations

import importlib
import sys

import click


class LazyCommand(click.Command):
    """A placeholder that imports the real command ("module:attr") only when it runs."""

    def __init__(self, name: str, target: str, help: str = "") -> None:
        super().__init__(name, help=help, short_help=help)
        self.target = target

    def load(self) -> click.Command:
        module, _, attr = self.target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command):
            raise click.ClickException(f"{self.target} is not a click command")
        return cmd


def lazy(name: str, target: str, help: str = "") -> LazyCommand:
    return LazyCommand(name, target, help)


class LazyGroup(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        return cmd.load() if isinstance(cmd, LazyCommand) else cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing uses the placeholders' own help, so `pycni --help` imports nothing extra.
        rows = [(name, cmd.get_short_help_str(formatter.width - 6 - len(name)))
                for name in self.list_commands(ctx)
                if (cmd := self.commands.get(name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pycni", prog_name="pycni",
                      message="%(prog)s %(version)s")  # the installed distribution's version
def main() -> None:
    """CNI plugins in Python, and a cnitool-compatible runner."""


@main.command()
def demo() -> None:
    """Two throwaway pods through the conflists in conf/: ADD, show, DEL, show it is clean."""
    from cni import demo as demo_module

    rc = demo_module.main()
    sys.exit(rc if isinstance(rc, int) else 0)


COMMANDS = (
    ("add", "cni.cli.runner:add", "ADD the network's plugins to NETNS, in order."),
    ("check", "cni.cli.runner:check", "CHECK the attachment against the cached ADD result."),
    ("del", "cni.cli.runner:delete", "DEL the attachment, plugins in reverse order."),
    ("gc", "cni.cli.runner:gc", "GC the network: stale cached attachments, then each plugin."),
    ("status", "cni.cli.runner:status", "STATUS of every plugin of the network."),
    ("version", "cni.cli.runner:version", "What each plugin in CNI_PATH supports."),
    ("install", "cni.cli.node:install", "Install the plugins and a conflist."),
    ("uninstall", "cni.cli.node:uninstall", "Remove what install wrote."),
    ("doctor", "cni.cli.node:doctor", "Check this host for what plugins need."),
    ("attachments", "cni.cli.node:attachments", "Every attachment on this node, what it owns, "
     "orphans."),
    ("daemon", "cni.fast.daemon:command", "Run the plugins' forkserver."),
)
for _name, _target, _help in COMMANDS:
    main.add_command(lazy(_name, _target, _help))
