"""The ``hami`` command: one entry point for every component.

Every subcommand is registered with :class:`hami.cli.compat.HamiCommand` (HAMi's flags,
``-v``/``--debug``/``--log-format``/``--version``, one-line errors); ``-h`` is ``--help``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hami.cli.compat import HamiCommand, HamiGroup

# Shell completion (--install-completion, --show-completion) is offered by the root
# command only; it completes every subcommand and option.
app = typer.Typer(help="hami: GPU sharing for Kubernetes, wire-compatible with HAMi.",
                  no_args_is_help=True, add_completion=True, cls=HamiGroup,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _print_version(value: bool) -> None:
    if value:
        from hami import __version__

        typer.echo(f"hami {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print hami's version and exit")] = False,
) -> None:
    """hami: GPU sharing for Kubernetes, wire-compatible with HAMi v2.10."""


@app.command("version", cls=HamiCommand)
def version() -> None:
    """Print hami's version."""
    _print_version(True)


def _register() -> None:
    """The component commands; each module imports its heavy libraries lazily or is small."""
    from hami.certgen import certgen
    from hami.cli.schedule import schedule_command
    from hami.deviceplugin.command import device_plugin
    from hami.dra.command import dra_plugin
    from hami.monitor.command import monitor
    from hami.scheduler.command import scheduler
    from hami.sim.command import simulate
    from hami.top import top

    app.command("schedule", cls=HamiCommand)(schedule_command)
    app.command("scheduler", cls=HamiCommand)(scheduler)
    app.command("device-plugin", cls=HamiCommand)(device_plugin)
    app.command("dra-plugin", cls=HamiCommand)(dra_plugin)
    app.command("monitor", cls=HamiCommand)(monitor)
    app.command("top", cls=HamiCommand)(top)
    app.command("certgen", cls=HamiCommand)(certgen)
    # The docstring's first paragraph speaks of the table "below" (in its own --help); the
    # command list gets a line of its own.
    app.command("simulate", cls=HamiCommand,
                short_help="Replay a GPU cluster trace through the scheduler core and report "
                           "how well each policy packs GPUs.")(simulate)


_register()
