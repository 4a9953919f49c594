"""HAMi's command-line vocabulary on every ``hami`` command.

:class:`HamiCommand` is the click command class every subcommand is registered with. It

* adds the options every command has: ``-v/--v N`` (klog verbosity), ``--debug``,
  ``--log-format keyvalue|json`` and ``--version``, and sets up logging from them before
  the command runs (:func:`hami.logs.setup_logging`);
* accepts Go's flag spellings HAMi's chart and users pass: ``-v=4``, ``--flag=true`` /
  ``--flag=false`` for on/off options;
* accepts the HAMi flags hami has no use for (:data:`HAMI_FLAGS`, hidden), each with a
  one-line warning that it has no effect, unless the command declares the flag itself
  (then it is honoured);
* accepts the older spellings of renamed options (:data:`ALIASES`, hidden);
* turns a missing kubeconfig or an unreachable API server into one line with what to do
  (:func:`kube_hint`) instead of a traceback.
"""

from __future__ import annotations

import inspect
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from hami.cliargs import choose, completer
from hami.kubehint import kube_hint

log = logging.getLogger("hami.cli")

TRUE = {"true", "1", "t", "yes", "y", "on"}
FALSE = {"false", "0", "f", "no", "n", "off"}


@dataclass(frozen=True)
class HamiFlag:
    """A flag of HAMi v2.10's binaries that hami accepts without using it.

    ``takes_value``: Go ``--name=value`` / ``--name value`` (else an on/off flag);
    ``why``: the rest of the warning line (what to do instead)."""

    name: str
    takes_value: bool
    why: str


_KLOG = "hami's logs go to stderr; -v and --log-format set them"
_NV = "an NVIDIA device plugin option hami does not implement"
_FROM_CONFIG = "set it in the device config (HAMi reads it from there too)"
_VENDOR = "set vendor resource names in the device config"

#: HAMi's flags accepted by every command; a command that declares one honours it.
HAMI_FLAGS: tuple[HamiFlag, ...] = (
    HamiFlag("--kube-qps", True, "hami bounds API requests in flight with "
             "--kube-max-inflight (hami scheduler) instead of a request rate"),
    HamiFlag("--kube-burst", True, "hami bounds API requests in flight with "
             "--kube-max-inflight (hami scheduler) instead of a request rate"),
    HamiFlag("--default-mem", True, "only hami scheduler and hami schedule use it"),
    HamiFlag("--default-cores", True, "only hami scheduler and hami schedule use it"),
    HamiFlag("--default-gpu", True, "only hami scheduler and hami schedule use it"),
    HamiFlag("--profiling", False, "hami serves no /debug/pprof"),
    HamiFlag("--device-plugin-namespace", True, "hami's device plugins do not call the "
             "scheduler"),
    HamiFlag("--device-plugin-service-account", True, "hami's device plugins do not call "
             "the scheduler"),
    HamiFlag("--mig-strategy", True, "MIG is chosen per node by operatingmode in the node "
             "config"),
    HamiFlag("--disable-core-limit", False, _FROM_CONFIG + " (disableCoreLimit)"),
    HamiFlag("--device-split-count", True, _FROM_CONFIG + " (deviceSplitCount)"),
    HamiFlag("--device-memory-scaling", True, _FROM_CONFIG + " (deviceMemoryScaling)"),
    HamiFlag("--device-cores-scaling", True, _FROM_CONFIG + " (deviceCoreScaling)"),
    HamiFlag("--resource-name", True, _FROM_CONFIG + " (resourceCountName)"),
    *(HamiFlag(f"--{n}", False, _NV) for n in (
        "fail-on-init-error", "pass-device-specs", "gdrcopy-enabled", "gds-enabled",
        "mofed-enabled")),
    *(HamiFlag(f"--{n}", True, _NV) for n in (
        "nvidia-driver-root", "device-list-strategy", "device-id-strategy",
        "cdi-annotation-prefix", "nvidia-cdi-hook-path", "device-discovery-strategy",
        "imex-channel-ids")),
    *(HamiFlag(f"--{n}", True, _VENDOR) for n in (
        "cambricon-mlu-name", "cambricon-mlu-memory", "cambricon-mlu-cores", "dcu-name",
        "dcu-memory", "dcu-cores", "mthreads-name", "mthreads-memory", "mthreads-cores",
        "metax-name", "metax-vcount", "metax-vcore", "metax-vmemory", "kunlun-name",
        "kunlun-vcount", "kunlun-vmemory")),
    HamiFlag("--sgpu-topology-aware", False, _VENDOR),
    *(HamiFlag(f"--{n}", False, _KLOG) for n in (
        "logtostderr", "alsologtostderr", "skip_headers", "skip_log_headers",
        "add_dir_header", "one_output")),
    *(HamiFlag(f"--{n}", True, _KLOG) for n in (
        "log_dir", "log_file", "log_file_max_size", "stderrthreshold", "vmodule",
        "log_backtrace_at")),
)

#: Older or HAMi spellings -> the name every command uses now (hidden aliases).
ALIASES: dict[str, str] = {
    "--node-policy": "--node-scheduler-policy",
    "--gpu-policy": "--gpu-scheduler-policy",
    "--device-config": "--device-config-file",
    "--config-file": "--device-config-file",
}

_COMMON = ("verbosity", "debug", "log_format")


class LogFormat(StrEnum):
    """``--log-format`` values (:data:`hami.logs.LOG_FORMATS`)."""

    keyvalue = "keyvalue"
    json = "json"


def _version(value: bool) -> None:
    if value:
        from hami import __version__

        typer.echo(f"hami {__version__}")
        raise typer.Exit()


def _common(
    verbosity: Annotated[int, typer.Option(
        "-v", "--v", metavar="N",
        help="log verbosity, klog style: 4 or more logs per-node detail")] = 0,
    debug: Annotated[bool, typer.Option("--debug", help="debug logs (same as -v 4)")] = False,
    log_format: Annotated[str, typer.Option(
        "--log-format", metavar="[" + "|".join(LogFormat) + "]",
        autocompletion=completer(list(LogFormat)),
        help="each log record as one key=value line (keyvalue) or one JSON object")
    ] = LogFormat.keyvalue.value,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print hami's version and exit")] = False,
) -> None:
    """The options every command has (their parameters are taken from here)."""


def _params_of(func: Callable[..., None]) -> list[Any]:
    """The click parameters typer makes of ``func``'s signature (typer's own click),
    without typer's completion options (the root ``hami`` command has those)."""
    sub = typer.Typer(add_completion=False)
    sub.command()(func)
    return list(typer.main.get_command(sub).params)


def _compat_function(flags: Sequence[HamiFlag]) -> Callable[..., None]:
    """A function whose keyword parameters are ``flags`` as hidden options."""
    def accept(**_: Any) -> None:
        """HAMi's flags."""

    params = []
    for flag in flags:
        if flag.takes_value:
            default: Any = typer.Option(None, flag.name, hidden=True)
            annotation: Any = list[str] | None
        else:
            default, annotation = typer.Option(False, flag.name, hidden=True), bool
        params.append(inspect.Parameter(_dest(flag), inspect.Parameter.KEYWORD_ONLY,
                                        default=default, annotation=annotation))
    accept.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return accept


def _dest(flag: HamiFlag) -> str:
    return "hami_compat_" + flag.name.lstrip("-").replace("-", "_")


def _names(params: Sequence[Any]) -> set[str]:
    return {o for p in params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}


def untyped_flags(params: list[Any]) -> list[Any]:
    """``params`` with on/off options shown without a type in ``--help`` (typer labels
    them ``<bool>``, which reads as if the option took a value)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


#: Narrower terminals get click's plain help (see :class:`NarrowHelp`).
RICH_HELP_MIN_COLUMNS = 120


class NarrowHelp:
    """Mixin for typer's command classes: Rich's option table on wide terminals; below
    :data:`RICH_HELP_MIN_COLUMNS` click's plain layout, which wraps every text instead of
    cutting words longer than the table's help column with an ellipsis
    (``cluster-trace-gpu-v202…`` at 80 columns)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if shutil.get_terminal_size((80, 24)).columns < RICH_HELP_MIN_COLUMNS:
            # the plain Command below typer's (typer carries its own click)
            TyperCommand.__mro__[1].format_help(self, ctx, formatter)  # type: ignore[attr-defined]
        else:
            super().format_help(ctx, formatter)  # type: ignore[misc]


class HamiGroup(NarrowHelp, TyperGroup):
    """The root ``hami`` command: its on/off options (``--version``, ``--help``, the
    completion options) shown without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return untyped_flags(super().get_params(ctx))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list of click's plain layout (narrow terminals): each command's
        first sentence, wrapped; click cut it at the terminal's width with ``...``."""
        rows = [(name, cmd.get_short_help_str(limit=10_000))
                for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class HamiCommand(NarrowHelp, TyperCommand):
    """A typer command with HAMi's flags, the common options and one-line errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        own = _names(self.params)
        self.params.extend(o for o in _params_of(_common) if not set(o.opts) & own)
        self.hami_flags = {f.name: f for f in HAMI_FLAGS if f.name not in own}
        self.params.extend(_params_of(_compat_function(list(self.hami_flags.values()))))
        self.aliases = {a: c for a, c in ALIASES.items() if a not in own and c in own}

    def get_params(self, ctx: Any) -> list[Any]:
        return untyped_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, normalize(args, self.params, self.aliases))

    def invoke(self, ctx: Any) -> Any:
        from hami.logs import setup_logging

        common = {k: ctx.params.pop(k) for k in _COMMON if k in ctx.params}
        ctx.params.pop("version", None)
        given = {k: ctx.params.pop(k) for k in [k for k in ctx.params
                                                if k.startswith("hami_compat_")]}
        log_format = choose(str(common.get("log_format", LogFormat.keyvalue)),
                            list(LogFormat), "--log-format")
        setup_logging(common.get("verbosity", 0), common.get("debug", False), log_format)
        for flag in self.hami_flags.values():
            if given.get(_dest(flag)):
                log.warning("%s has no effect in hami %s: %s", flag.name, ctx.info_name,
                            flag.why)
        try:
            return super().invoke(ctx)
        except Exception as exc:
            hint = kube_hint(exc)
            if hint is None:
                raise
            typer.echo(f"error: {hint}", err=True)
            raise typer.Exit(2) from None


def normalize(args: Sequence[str], params: Sequence[Any],
              aliases: dict[str, str] | None = None) -> list[str]:
    """Rewrite Go flag spellings into click's: ``-v=4`` -> ``-v 4``; ``--x=true`` ->
    ``--x`` and ``--x=false`` -> ``--no-x`` (or nothing) for on/off options; aliases to
    their current name. Everything after ``--`` is left alone.

    Raises:
        typer.BadParameter: ``--x=<not a boolean>`` for an on/off option.
    """
    flags: dict[str, Any] = {}
    for p in params:
        if getattr(p, "is_flag", False) and not getattr(p, "count", False):
            for name in p.opts:
                flags[name] = p
    aliases = aliases or {}
    out: list[str] = []
    rest: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            rest = list(args[i:])
            break
        name, eq, value = arg.partition("=")
        if name in aliases:
            name = aliases[name]
            arg = name + eq + value
        if name in ("-v", "--v") and eq:
            out += [name, value]
        elif eq and name in flags and name.startswith("--"):
            lowered = value.lower()
            if lowered in TRUE:
                out.append(name)
            elif lowered in FALSE:
                off = flags[name].secondary_opts
                if off:
                    out.append(off[0])
            else:
                raise typer.BadParameter(f"{name}={value}: expected true or false")
        else:
            out.append(arg)
    return out + rest
