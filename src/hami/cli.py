"""The ``hami`` command: one entry point for every component."""

from __future__ import annotations

import typer

app = typer.Typer(help="hami: GPU sharing for Kubernetes, wire-compatible with HAMi.",
                  no_args_is_help=True, add_completion=False)


@app.callback()
def main() -> None:
    """hami: GPU sharing for Kubernetes, wire-compatible with HAMi v2.10."""


def _register() -> None:
    from hami.sim.command import simulate

    app.command("simulate")(simulate)


_register()
