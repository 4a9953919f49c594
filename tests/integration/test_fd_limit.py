"""Every long-running command raises its soft open-files limit to the hard limit at start
(issue 12 §5: with a soft limit of 1024, a thousand idle connections locked kube-scheduler
out). Each command runs as its own process (``python -m hami.cli``) started with a low
soft limit, against a fake API server; the test reads the child's limit."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .fake_apiserver import FakeApiServer
from .support import node

SRC = Path(__file__).resolve().parents[2] / "src"
LOW_SOFT = 256

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[Path]:
    fake = FakeApiServer()
    with fake.running():
        fake.put("nodes", node("n1"))
        yield fake.kubeconfig(tmp_path)


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT, hard), hard))


def soft_limit_of(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, int]:
    """Start ``python -m hami.cli <argv>`` with a soft limit of 256; the child's
    (soft, hard) once its soft limit moved, or after 20 s."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= LOW_SOFT:
        pytest.skip(f"hard open-files limit {hard} leaves nothing to raise")
    full_env = {**os.environ, **env,
                "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-m", "hami.cli", *argv], env=full_env,
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_low_soft_limit)
    try:
        limits = (LOW_SOFT, hard)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and child.poll() is None:
            limits = resource.prlimit(child.pid, resource.RLIMIT_NOFILE)
            if limits[0] != LOW_SOFT:
                break
            time.sleep(0.05)
        assert child.poll() is None, f"{argv[0]} exited:\n{log.read_text()[-2000:]}"
        return limits
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def test_scheduler_raises_its_soft_limit(apiserver: Path, tmp_path: Path) -> None:
    soft, hard = soft_limit_of(["scheduler", f"--kubeconfig={apiserver}",
                                "--http_bind=127.0.0.1:0", "--metrics-bind-address=0"],
                               {}, tmp_path / "scheduler.log")
    assert soft == hard


def test_monitor_raises_its_soft_limit(apiserver: Path, tmp_path: Path) -> None:
    (tmp_path / "hook" / "containers").mkdir(parents=True)
    soft, hard = soft_limit_of(["monitor", f"--kubeconfig={apiserver}",
                                "--metrics-bind-address=127.0.0.1:0"],
                               {"HOOK_PATH": str(tmp_path / "hook"), "NODE_NAME": "n1"},
                               tmp_path / "monitor.log")
    assert soft == hard


def test_device_plugin_raises_its_soft_limit(apiserver: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"gpus": [
        {"model": "Tesla T4", "memory_mib": 15360, "count": 1, "numa": 0,
         "uuids": ["GPU-bbbbbbbb-1111-2222-3333-444444444444"]}]}))
    plugins = Path(tempfile.mkdtemp(prefix="hfd", dir="/tmp"))  # unix socket path < 108 bytes
    try:
        soft, hard = soft_limit_of(["device-plugin", "--node-name=n1", "--backend=fake",
                                    f"--fake-inventory={inventory}", f"--kubeconfig={apiserver}",
                                    f"--device-plugin-path={plugins}",
                                    f"--hook-path={tmp_path / 'hook'}",
                                    f"--lock-dir={tmp_path / 'lock'}",
                                    f"--node-config-file={tmp_path / 'none.json'}"],
                                   {}, tmp_path / "device-plugin.log")
    finally:
        shutil.rmtree(plugins, ignore_errors=True)
    assert soft == hard
