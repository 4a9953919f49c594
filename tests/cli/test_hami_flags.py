"""HAMi's flags, the common options and one vocabulary on every ``hami`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hami import __version__
from hami.cli import app

SRC = str(Path(__file__).resolve().parents[2] / "src")

#: HAMi v2.10's chart: the extender's arguments with its default values and extraArgs.
SCHEDULER_CHART_ARGS = [
    "--http_bind=0.0.0.0:9443", "--cert_file=/tls/tls.crt", "--key_file=/tls/tls.key",
    "--scheduler-name=hami-scheduler", "--metrics-bind-address=:9395",
    "--node-scheduler-policy=binpack", "--gpu-scheduler-policy=spread",
    "--force-overwrite-default-scheduler=true", "--device-config-file=/device-config.yaml",
    "--leader-elect=true", "--leader-elect-resource-name=hami-scheduler",
    "--leader-elect-resource-namespace=kube-system",
    "--device-plugin-namespace=kube-system",
    "--device-plugin-service-account=hami-device-plugin", "--enable-ascend=true",
    "--enable-iluvatar=true", "--node-label-selector=gpu=on", "--legacy-metrics=true",
    "--kube-qps=5", "--kube-burst=10", "--kube-timeout=10", "--node-lock-retry-timeout=28s",
    "--debug", "-v=4"]
DEVICE_PLUGIN_CHART_ARGS = ["--config-file=/device-config.yaml", "--mig-strategy=none",
                            "--disable-core-limit=false", "-v=4"]
MONITOR_CHART_ARGS = ["--legacy-metrics=true", "-v=4", "--high-priority-namespaces=inference"]
COMMON_HAMI_FLAGS = ["-v=2", "--v=3", "-v", "4", "--debug", "--kube-qps=5", "--kube-burst",
                     "10", "--default-mem=1024", "--default-cores=10", "--default-gpu=1",
                     "--profiling"]
COMMANDS = ["schedule", "scheduler", "simulate", "device-plugin", "monitor", "top", "certgen",
            "version"]


def parse(name: str, args: list[str]) -> dict:
    """Parse ``hami <name> args`` exactly as the command line would, without running it."""
    group = typer.main.get_command(app)
    cmd = group.commands[name]  # type: ignore[attr-defined]
    ctx = cmd.make_context(name, list(args), parent=group.make_context("hami", [name]))
    return dict(ctx.params)


@pytest.mark.parametrize(("name", "args"), [("scheduler", SCHEDULER_CHART_ARGS),
                                            ("device-plugin", DEVICE_PLUGIN_CHART_ARGS),
                                            ("monitor", MONITOR_CHART_ARGS)])
def test_hami_chart_arguments_parse(name: str, args: list[str]) -> None:
    params = parse(name, args)
    assert params["verbosity"] == 4


def test_chart_values_reach_the_scheduler() -> None:
    params = parse("scheduler", SCHEDULER_CHART_ARGS)
    assert params["leader_elect"] is True and params["enable_ascend"] is True
    assert params["force_overwrite_default_scheduler"] is True
    assert params["debug"] is True and params["legacy_metrics"] is True
    assert params["device_config_file"] == "/device-config.yaml"
    off = parse("scheduler", ["--force-overwrite-default-scheduler=false", "--leader-elect=0"])
    assert off["force_overwrite_default_scheduler"] is False and off["leader_elect"] is False


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_takes_hamis_common_flags(name: str) -> None:
    required = {"schedule": ["-f", "x"], "certgen": ["--namespace", "ns"]}.get(name, [])
    params = parse(name, [*COMMON_HAMI_FLAGS, *required])
    assert params["verbosity"] == 4 and params["debug"] is True


def test_bad_boolean_value_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["monitor", "--legacy-metrics=maybe"])
    assert result.exit_code == 2
    assert "--legacy-metrics=maybe: expected true or false" in result.output


def test_flag_without_effect_warns_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOK_PATH", raising=False)
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("HOOK_PATH", None)
    proc = subprocess.run([sys.executable, "-m", "hami.cli", "monitor", "--profiling",
                           "--kube-qps=5", "-v=4"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2
    warnings = [line for line in proc.stderr.splitlines() if "has no effect" in line]
    assert len(warnings) == 2, proc.stderr
    assert any("--profiling has no effect in hami monitor" in w for w in warnings)
    assert all("level=warning" in w for w in warnings)
    assert "HOOK_PATH" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr


def _one_node_cluster(tmp_path: Path, namespace: str, limits: str) -> Path:
    """A cluster file: node n1 with one 16000 MiB T4 and a pod ``namespace/p`` whose one
    container has ``limits`` (a YAML flow mapping)."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"""
kind: Node
metadata:
  name: n1
  annotations:
    hami.io/node-handshake: "Requesting_2024.01.01 00:00:00"
    hami.io/node-nvidia-register: '[{{"id":"GPU-a","count":10,"devmem":16000,"devcore":100,"type":"NVIDIA-T4","health":true,"numa":0,"mode":"hami-core","index":0}}]'
---
kind: Pod
metadata: {{name: p, namespace: {namespace}, uid: u1}}
spec:
  containers:
  - name: c
    resources: {{limits: {limits}}}
""")
    return cluster


def test_default_flags_are_honoured_by_schedule(tmp_path: Path) -> None:
    cluster = _one_node_cluster(tmp_path, "default", "{nvidia.com/gpu: 1, nvidia.com/gpucores: 20}")
    out = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", "json",
                                   "--default-mem=1234", "--default-cores=7"])
    assert out.exit_code == 0, out.output
    assert "GPU-a,NVIDIA,1234,20:;" in out.stdout, out.stdout
    plain = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", "json"])
    assert "GPU-a,NVIDIA,16000,20:;" in plain.stdout, plain.stdout


def test_schedule_follows_the_priority_zero_grant(tmp_path: Path) -> None:
    cluster = _one_node_cluster(
        tmp_path, "serving",
        "{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000, nvidia.com/priority: 0}")
    refused = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", "json"])
    assert "--high-priority-namespaces" in refused.stdout, refused.stdout
    assert "GPU-a,NVIDIA,1000" not in refused.stdout
    granted = CliRunner().invoke(app, ["schedule", "-f", str(cluster), "-o", "json",
                                       "--high-priority-namespaces=serving"])
    assert "GPU-a,NVIDIA,1000" in granted.stdout, granted.stdout


def test_version_everywhere_and_h_is_help() -> None:
    runner = CliRunner()
    for args in (["--version"], ["version"], *([c, "--version"] for c in COMMANDS)):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert result.stdout.strip() == f"hami {__version__}", args
    for args in (["-h"], ["scheduler", "-h"], ["device-plugin", "-h"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.stdout, args


def test_one_vocabulary_old_spellings_still_work() -> None:
    for cmd, old, new, value, key in [
            ("schedule", "--node-policy", "--node-scheduler-policy", "spread",
             "node_scheduler_policy"),
            ("schedule", "--gpu-policy", "--gpu-scheduler-policy", "binpack",
             "gpu_scheduler_policy"),
            ("schedule", "--device-config", "--device-config-file", "d.yaml",
             "device_config_file"),
            ("top", "--device-config", "--device-config-file", "d.yaml", "device_config_file"),
            ("device-plugin", "--config-file", "--device-config-file", "d.yaml", "config_file"),
            ("scheduler", "--config-file", "--device-config-file", "d.yaml",
             "device_config_file"),
            ("scheduler", "--node-policy", "--node-scheduler-policy", "spread",
             "node_scheduler_policy")]:
        extra = ["-f", "x"] if cmd == "schedule" else []
        for spelling in ([f"{old}={value}"], [old, value], [new, value]):
            assert str(parse(cmd, [*spelling, *extra])[key]) == value, (cmd, spelling)
    group = typer.main.get_command(app)
    help_text = CliRunner().invoke(app, ["schedule", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--node-scheduler-policy" in help_text and "--node-policy " not in help_text
    assert group is not None


def test_durations_take_go_units_or_seconds() -> None:
    for text in ("30s", "30", "30.0", "0.5m"):
        assert parse("device-plugin", ["--register-interval", text])["register_interval"] == 30.0
    assert parse("device-plugin", ["--watch-idle-timeout=2m"])["watch_idle_timeout"] == 120.0
    assert parse("monitor", ["--resync-interval=90"])["resync_interval"] == 90.0
    bad = CliRunner().invoke(app, ["device-plugin", "--register-interval", "soon"])
    assert bad.exit_code == 2 and "is not a duration" in bad.output


def test_monitor_help_names_its_environment() -> None:
    text = CliRunner().invoke(app, ["monitor", "--help"], env={"COLUMNS": "200"}).stdout
    for word in ("HOOK_PATH", "NODE_NAME", "--metrics-bind-address", "--legacy-metrics",
                 "HAMI_RESYNC_INTERVAL"):
        assert word in text, word


#: One command of each kind that reads a kubeconfig before it does anything else.
KUBE_COMMANDS = [
    ["scheduler", "--metrics-bind-address=", "--http_bind=127.0.0.1:0"],
    ["top"],
    ["certgen", "--namespace", "x", "--secret", "s", "--service", "svc"],
    ["monitor"],
    ["device-plugin", "--backend", "fake", "--node-name", "n"],
]


def run_without_cluster(argv: list[str], tmp_path: Path, **extra_env: str
                        ) -> subprocess.CompletedProcess[str]:
    """``python -m hami.cli ARGV`` with no in-cluster or kubeconfig variables of the host
    (``extra_env`` added), HOME and HOOK_PATH in ``tmp_path``; the device plugin gets an
    empty fake inventory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    env.update({"PYTHONPATH": SRC, "HOME": str(tmp_path), "HOOK_PATH": str(tmp_path),
                "NODE_NAME": "n", **extra_env})
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("gpus: []\n")
    if argv[0] == "device-plugin":
        argv = [*argv, "--fake-inventory", str(inventory)]
    return subprocess.run([sys.executable, "-m", "hami.cli", *argv], capture_output=True,
                          text=True, env=env, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("argv", KUBE_COMMANDS)
def test_no_kubeconfig_is_one_line_with_what_to_do(argv: list[str], tmp_path: Path) -> None:
    proc = run_without_cluster(argv, tmp_path)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "level=" not in line]
    assert len(errors) == 1, proc.stderr
    assert "KUBECONFIG" in errors[0] and "--kubeconfig" in errors[0], errors
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", KUBE_COMMANDS)
@pytest.mark.parametrize(("content", "words"), [
    (b"apiVersion: v1\nclusters: [\n", "is not valid YAML (line 3, column 1)"),
    (b"apiVersion: v1\n\xff\xfe\n", "is not UTF-8 text (byte 15)"),
    (b"- just\n- a list\n", "is not a kubeconfig (a mapping of clusters, users and contexts)"),
])
def test_broken_kubeconfig_is_one_line_naming_the_file(argv: list[str], content: bytes,
                                                       words: str, tmp_path: Path) -> None:
    """A kubeconfig that is not YAML, not UTF-8 or not a mapping was the YAML parser's
    multi-line error or a UnicodeDecodeError, neither naming the file."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    proc = run_without_cluster(argv, tmp_path, KUBECONFIG=str(kubeconfig))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "level=" not in line]
    assert errors == [f"error: kubeconfig {kubeconfig} {words}: fix it, or name another "
                      "file with KUBECONFIG / --kubeconfig"], proc.stderr


@pytest.mark.parametrize(("given", "seconds"), [([], 10.0), (["--kube-timeout=0"], 10.0),
                                                (["--kube-timeout", "25"], 25.0)])
def test_kube_timeout_is_seconds_and_hamis_zero_is_ten(
        monkeypatch: pytest.MonkeyPatch, given: list[str], seconds: float) -> None:
    """The scheduler gets the timeout the help promises: 10 s by default, HAMi's 0 taken
    as 10 s, any other value as seconds."""
    import hami.scheduler.server as server

    seen = []

    async def fake_serve(settings: object) -> None:
        seen.append(settings)

    monkeypatch.setattr(server, "serve", fake_serve)
    result = CliRunner().invoke(app, ["scheduler", *given])
    assert result.exit_code == 0, result.output
    assert seen[0].kube_timeout.total_seconds() == seconds  # type: ignore[attr-defined]


def test_negative_kube_timeout_is_one_line() -> None:
    result = CliRunner().invoke(app, ["scheduler", "--kube-timeout=-5"])
    assert result.exit_code == 2, result.output
    assert "error: --kube-timeout must be 0 or more seconds, got -5" in result.stderr
