"""Option values with a fixed set of choices (``-o table|json``, ``--backend nvml|fake``).

The commands take such an option as a string and check it with :func:`choose`, so that a
bad value is reported as every value hami's commands check themselves: one line,
``error: <flag> must be one of a, b, got 'x'``, exit status 2 (click's status for a usage
error), not typer's boxed usage error. :func:`completer` keeps the choices in shell
completion. Stdlib and typer only: every command imports this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import typer


def choose(value: str, choices: Sequence[str], flag: str) -> str:
    """``value`` when it is one of ``choices`` (exact, case-sensitive); otherwise one line
    on stderr, ``error: <flag> must be one of a, b, got 'x'``, and exit status 2.

    Raises:
        typer.Exit: ``value`` is not among ``choices`` (code 2).
    """
    if value in choices:
        return value
    typer.echo(f"error: {flag} must be one of {', '.join(choices)}, got {value!r}", err=True)
    raise typer.Exit(2)


def completer(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """A typer ``autocompletion`` for an option checked with :func:`choose`: the choices
    that start with what has been typed (typer passes it by the parameter's name,
    ``incomplete``)."""
    def complete(incomplete: str) -> list[str]:
        return [c for c in choices if c.startswith(incomplete)]
    return complete
