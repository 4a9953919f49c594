"""HAMi's ``--default-mem``, ``--default-cores`` and ``--default-gpu`` options, one
definition for ``hami scheduler`` and ``hami schedule`` (they replace the device config's
``defaultMemory``, ``defaultCores`` and ``defaultGPUNum``)."""

from __future__ import annotations

from typing import Annotated

import typer

DefaultMem = Annotated[int | None, typer.Option(
    "--default-mem", help="MiB a GPU container gets when it names no memory "
    "(overrides the device config's defaultMemory; 0: the whole card)")]
DefaultCores = Annotated[int | None, typer.Option(
    "--default-cores", help="core percent a GPU container gets when it names none "
    "(overrides defaultCores)")]
DefaultGpu = Annotated[int | None, typer.Option(
    "--default-gpu", help="GPUs a container asking only for memory or cores gets "
    "(overrides defaultGPUNum)")]
