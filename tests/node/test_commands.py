"""The typer entry points as ``hami.cli`` will register them."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from hami.deviceplugin.command import device_plugin
from hami.monitor.command import _duration_s, monitor


def app() -> typer.Typer:
    a = typer.Typer()
    a.command("device-plugin")(device_plugin)
    a.command("monitor")(monitor)
    return a


def test_flags() -> None:
    cmd = typer.main.get_command(app())
    opts = {name: {o for p in sub.params for o in p.opts}
            for name, sub in cmd.commands.items()}  # type: ignore[attr-defined]
    assert {"--node-name", "--backend", "--fake-inventory", "--install-lib", "--kubelet-socket",
            "--device-config-file", "--node-config-file", "--hook-path"} <= opts["device-plugin"]
    assert {"--metrics-bind-address", "--legacy-metrics"} <= opts["monitor"]
    assert CliRunner().invoke(app(), ["monitor", "--help"]).exit_code == 0


def test_install_lib_command(tmp_path: Path) -> None:
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"ELF")
    r = CliRunner().invoke(app(), ["device-plugin", "--install-lib", str(tmp_path / "h"),
                                   "--lib-path", str(lib)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "h" / "ld.so.preload").read_text() == f"{tmp_path / 'h'}/libvgpu.so\n"
    r = CliRunner().invoke(app(), ["device-plugin", "--install-lib", str(tmp_path / "h"),
                                   "--lib-path", str(tmp_path / "missing")])
    assert r.exit_code == 2


def test_required_env(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("HOOK_PATH", raising=False)
    assert CliRunner().invoke(app(), ["device-plugin"]).exit_code == 2
    assert CliRunner().invoke(app(), ["monitor"]).exit_code == 2
    monkeypatch.setenv("HOOK_PATH", "")
    assert CliRunner().invoke(app(), ["monitor"]).exit_code == 2      # NODE_NAME missing


def test_go_durations() -> None:
    assert _duration_s("5m") == 300 and _duration_s("1h30m") == 5400
    assert _duration_s("250ms") == 0.25
