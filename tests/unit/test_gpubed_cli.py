"""``python -m hami.testing.gpubed up`` and ``make cluster NODE=real MODE=...``: the options
that choose allocate mode ``cdi`` or DRA mode, and the example each prints (no node is
started here; tests/realnode runs the modes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hami.testing.gpubed_cli import (
    AUTO_PLUGIN_ARGS,
    CDI_PLUGIN_ARGS,
    example_objects,
    parse_args,
    plugin_args,
)

REPO = Path(__file__).resolve().parents[2]


def test_default_is_hamis_protocol() -> None:
    args = parse_args(["up"])
    assert (args.allocate_mode, args.dra, args.node) == ("node-lock", False, "gpu-node-0")
    assert plugin_args(args.allocate_mode) == ()


def test_allocate_mode_cdi_passes_the_plugin_its_sockets() -> None:
    args = parse_args(["up", "--allocate-mode", "cdi"])
    assert plugin_args(args.allocate_mode) == CDI_PLUGIN_ARGS
    assert "--allocate-mode=cdi" in CDI_PLUGIN_ARGS
    assert "--cdi-spec-dir=/run/cdi" in CDI_PLUGIN_ARGS  # the node's containerd reads it


def test_allocate_mode_auto_passes_the_same_sockets() -> None:
    args = parse_args(["up", "--allocate-mode", "auto"])
    assert plugin_args(args.allocate_mode) == AUTO_PLUGIN_ARGS
    assert AUTO_PLUGIN_ARGS[0] == "--allocate-mode=auto"
    assert AUTO_PLUGIN_ARGS[1:] == CDI_PLUGIN_ARGS[1:]  # the same sockets and CDI dir


def test_dra_and_cdi_combine() -> None:
    args = parse_args(["up", "--dra", "--allocate-mode=cdi", "--node", "n1"])
    assert (args.allocate_mode, args.dra, args.node) == ("cdi", True, "n1")


@pytest.mark.parametrize("argv", [["up", "--allocate-mode", "lockless"], ["down"], []])
def test_bad_command_lines_are_usage_errors(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "usage: python -m hami.testing.gpubed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lockless"):
        plugin_args("lockless")


def test_examples() -> None:
    (pod,) = example_objects(dra=False)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "512"
    # it keeps running after its checks, so that the printed curl of the monitor's
    # /metrics shows its series (issue 28: the pod had Completed before anyone scraped)
    assert pod["spec"]["containers"][0]["command"][-1].endswith(" hold")
    *templates, dra_pod = example_objects(dra=True)
    assert templates and {t["kind"] for t in templates} == {"ResourceClaimTemplate"}
    assert dra_pod["kind"] == "Pod" and dra_pod["metadata"]["name"] == "gpu-pod"
    names = {c["resourceClaimTemplateName"] for c in dra_pod["spec"]["resourceClaims"]}
    assert names == {t["metadata"]["name"] for t in templates}
    assert "nvidia.com/" not in json.dumps(dra_pod["spec"]["containers"][0]["resources"])


def test_module_runs_the_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-m", "hami.testing.gpubed", "up", "--help"],
                         capture_output=True, text=True, timeout=60, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert "--allocate-mode" in out.stdout and "--dra" in out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(("mode", "flags"), [("", "--allocate-mode node-lock"),
                                             ("cdi", "--allocate-mode cdi"),
                                             ("dra", "--dra")])
def test_make_cluster_mode(mode: str, flags: str) -> None:
    argv = ["make", "-n", "--no-print-directory", "cluster", "NODE=real"]
    out = subprocess.run([*argv, *([f"MODE={mode}"] if mode else [])], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert f"-m hami.testing.gpubed up {flags}\n" in out.stdout, out.stdout
