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


def test_socket_path_limits() -> None:
    """gRPC listens on paths of at most 105 bytes and connects to paths of at most 107
    (``sun_path`` less its NUL); the check names the path, its size and the limit."""
    import pytest

    from hami.deviceplugin.sockets import (
        MAX_CONNECT_PATH_BYTES,
        MAX_SOCKET_PATH_BYTES,
        SocketPathError,
        check_socket_paths,
    )

    def sized(n: int) -> Path:
        return Path("/tmp/" + "x" * (n - len("/tmp/")))

    check_socket_paths(listen=[sized(MAX_SOCKET_PATH_BYTES)],
                       connect=[sized(MAX_CONNECT_PATH_BYTES)])
    with pytest.raises(SocketPathError, match=r"is 106 bytes; .* at most 105: choose a "):
        check_socket_paths(listen=[sized(106)])
    with pytest.raises(SocketPathError, match=r"is 108 bytes; .* at most 107: give a "):
        check_socket_paths(connect=[sized(108)])
    # bytes as the file system encodes them, not characters
    with pytest.raises(SocketPathError, match="is 106 bytes"):
        check_socket_paths(listen=[Path("/tmp/é" + "x" * 99)])


def _short_dir() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="hsock", dir="/tmp"))


def test_device_plugin_socket_too_long_is_a_clear_error_at_start() -> None:
    """A device-plugin directory whose socket path (``<dir>/nvidia-gpu.sock``) is longer
    than gRPC listens on was gRPC's "Failed to bind" after the API server and the GPUs;
    now one line naming the path and the limit, before the kubeconfig (missing here) is
    read and before the directory is created. A kubelet socket too long to connect to
    likewise."""
    import shutil

    from hami.cli import app as hami

    root = _short_dir()
    try:
        inventory = root / "inv.yaml"
        inventory.write_text("gpus: []\n")
        base = ["device-plugin", "--node-name", "n1", "--backend", "fake",
                "--fake-inventory", str(inventory), "--kubeconfig", str(root / "missing")]
        long_dir = root / ("d" * (106 - len(f"{root}/") - len("/nvidia-gpu.sock")))
        r = CliRunner().invoke(hami, [*base, "--device-plugin-path", str(long_dir)],
                               env={"COLUMNS": "250"})
        assert r.exit_code == 1, r.output
        assert r.stderr.splitlines()[-1] == (
            f"error: socket path {long_dir}/nvidia-gpu.sock is 106 bytes; a unix socket's "
            "path has at most 105: choose a shorter directory"), r.stderr
        assert not long_dir.exists()
        kubelet = root / ("k" * (108 - len(f"{root}/")))
        r = CliRunner().invoke(hami, [*base, "--device-plugin-path", str(root / "dp"),
                                      "--kubelet-socket", str(kubelet)],
                               env={"COLUMNS": "250"})
        assert r.exit_code == 1, r.output
        assert f"error: socket path {kubelet} is 108 bytes" in r.stderr, r.stderr
        assert "at most 107" in r.stderr and not (root / "dp").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_device_plugin_serves_on_a_socket_path_at_the_limit() -> None:
    """At exactly 105 bytes the plugin's socket is served and registered (the limit is
    gRPC's, not a guess); one byte more is refused before anything starts."""
    import shutil
    import threading

    import pytest

    from hami.deviceplugin.command import run_plugin
    from hami.deviceplugin.sockets import MAX_SOCKET_PATH_BYTES, SocketPathError
    from tests.node.conftest import DEFAULT_INVENTORY, NODE
    from tests.node.fakes import FakeKube, FakeKubelet

    root = _short_dir()
    stop = threading.Event()
    thread: threading.Thread | None = None
    kubelet = FakeKubelet(root / ("p" * (MAX_SOCKET_PATH_BYTES - len(f"{root}/")
                                         - len("/nvidia-gpu.sock"))))
    try:
        import yaml

        inventory = root / "inv.yaml"
        inventory.write_text(yaml.safe_dump(DEFAULT_INVENTORY))
        kube = FakeKube()
        kube.add_node(NODE)
        kubelet.start()
        assert len(str(kubelet.dir / "nvidia-gpu.sock")) == MAX_SOCKET_PATH_BYTES
        errors: list[BaseException] = []

        def plugin(plugin_dir: Path) -> None:
            try:
                run_plugin(node_name=NODE, hook_path=str(root / "hook"), plugin_dir=plugin_dir,
                           kubelet_socket=kubelet.socket, config_file=None,
                           node_config_file=None, backend_kind="fake",
                           fake_inventory=inventory, kubeconfig=None,
                           lock_dir=str(root / "lock"), register_interval_s=0.3, stop=stop,
                           kube_api=kube)
            except BaseException as exc:  # noqa: BLE001 - surfaced below
                errors.append(exc)

        thread = threading.Thread(target=plugin, args=(kubelet.dir,), daemon=True)
        thread.start()
        assert kubelet.wait_registered().endpoint == "nvidia-gpu.sock"
        assert not errors
        longer = root / (kubelet.dir.name + "p")
        with pytest.raises(SocketPathError, match="is 106 bytes"):
            run_plugin(node_name=NODE, hook_path=str(root / "hook"), plugin_dir=longer,
                       kubelet_socket=kubelet.socket, config_file=None, node_config_file=None,
                       backend_kind="fake", fake_inventory=inventory, kubeconfig=None,
                       lock_dir=str(root / "lock"), register_interval_s=0.3,
                       stop=threading.Event(), kube_api=kube)
        assert not longer.exists()
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
            assert not thread.is_alive()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
