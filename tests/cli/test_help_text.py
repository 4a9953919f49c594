"""What ``hami --help`` and every command's ``--help`` show: shell completion once, on the
root command only; every option described; defaults that do not depend on where hami is
installed; no type label on on/off flags."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hami.cli import app

COMMANDS = ["schedule", "scheduler", "simulate", "device-plugin", "dra-plugin", "monitor",
            "top", "certgen", "version"]
WIDE = {"COLUMNS": "250"}


def help_of(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_completion_is_offered_once_by_the_root_command() -> None:
    root = help_of()
    assert root.count("--install-completion") == 1 and root.count("--show-completion") == 1
    for name in COMMANDS:
        text = help_of(name)
        assert "--install-completion" not in text and "--show-completion" not in text, name


def test_root_completion_option_is_accepted() -> None:
    result = CliRunner().invoke(app, ["--show-completion", "bash"], env=WIDE)
    assert "No such option" not in result.output, result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_of_every_command_is_described(name: str) -> None:
    """Every visible option has a help text (``--kubeconfig`` had none on device-plugin,
    dra-plugin and certgen)."""
    import typer

    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    ctx = command.make_context(name, [], parent=group.make_context("hami", [name]),
                               resilient_parsing=True)
    for param in command.get_params(ctx):
        if not getattr(param, "hidden", False):
            assert (getattr(param, "help", None) or "").strip(), (name, param.opts)


@pytest.mark.parametrize("name", ["device-plugin", "dra-plugin", "scheduler", "monitor"])
def test_defaults_do_not_show_the_checkout(name: str) -> None:
    from pathlib import Path

    here = str(Path(__file__).resolve().parents[2])
    assert here not in help_of(name).replace("\n", "")


def test_lib_path_default_is_described() -> None:
    text = " ".join(help_of("device-plugin").split())
    assert "native/libvgpu/build/libvgpu.so" in text


def test_flags_show_no_bool_type() -> None:
    for args in ((), ("device-plugin",), ("simulate",)):
        assert "<bool>" not in help_of(*args), args


def test_root_help_lists_each_command_in_its_own_words() -> None:
    """``hami --help`` lists simulate in one sentence; its own help's "described below"
    (the columns under it) means nothing in the command list."""
    root = " ".join(help_of().split())
    assert "described below" not in root
    assert ("Replay a GPU cluster trace through the scheduler core and report how well "
            "each policy packs GPUs.") in root.replace("│ ", "")
    assert "described below" in " ".join(help_of("simulate").split())


def test_vendor_switches_say_what_they_schedule() -> None:
    for name in ("schedule", "scheduler"):
        text = " ".join(help_of(name).replace("│", "").split())
        assert "schedule Ascend NPUs: the chips of the device config's vnpus section" in text
        assert ("schedule Iluvatar GPUs: the chips of the device config's iluvatars section"
                in text)


@pytest.mark.parametrize("name", COMMANDS)
def test_no_option_shows_a_python_type(name: str) -> None:
    """Value placeholders are words (``<name>``), not Python types (``hami top --node``
    showed ``<list[str]>``)."""
    text = help_of(name)
    assert "list[" not in text and "str]" not in text, text


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_things_not_pronouns(name: str) -> None:
    """``--gpu-hook-path`` and ``--hook-path`` said ``<it>/vgpu`` for "this path's"."""
    assert "<it>" not in help_of(name)


@pytest.mark.parametrize("name", COMMANDS)
def test_duration_defaults_are_shown_as_durations(name: str) -> None:
    """A DURATION option's default reads as the value one would type (``30s``), and is
    the option's default (``--register-interval`` showed ``30.0``)."""
    import typer

    from hami.durations import seconds

    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    ctx = command.make_context(name, [], parent=group.make_context("hami", [name]),
                               resilient_parsing=True)
    for param in command.get_params(ctx):
        if getattr(param, "metavar", None) == "DURATION":
            shown = param.show_default  # type: ignore[attr-defined]
            assert isinstance(shown, str) and shown[-1] in "smh", (name, param.opts, shown)
            assert seconds(shown) == param.default, (name, param.opts, shown)


@pytest.mark.parametrize("columns", ["250", "80"])
def test_kube_timeout_help_states_its_default_and_unit(columns: str) -> None:
    """``--kube-timeout`` showed ``(0: 10) [default: 0]``: its default is 10 seconds, and
    the help says so."""
    result = CliRunner().invoke(app, ["scheduler", "--help"], env={"COLUMNS": columns})
    text = " ".join(result.stdout.replace("│", " ").split())
    start = text.index("--kube-timeout")
    entry = text[start:text.index("--kube-max-inflight", start)]
    assert "in seconds" in entry and "[default: 10]" in entry, entry
    assert "default: 0" not in entry and "(0: 10)" not in entry, entry
