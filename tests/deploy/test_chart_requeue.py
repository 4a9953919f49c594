"""The chart's kube-scheduler retries a rejected pod within tens of seconds:
``scheduler.kubeScheduler.podMaxInUnschedulablePodsDuration`` renders kube-scheduler's
``--pod-max-in-unschedulable-pods-duration`` (docs/troubleshooting.md, "Pending for up to
40 s after a GPU was freed"), and every kube-scheduler of the supported range that is
built here accepts the rendered arguments. The retry itself, on a real control plane:
tests/e2e/test_requeue_e2e.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import CHART, NAMESPACE, RELEASE, container, find, helm, render

pytestmark = pytest.mark.usefixtures("require_helm")

FLAG = "--pod-max-in-unschedulable-pods-duration"
HAMI_DEFAULTS = Path(__file__).parent / "hami_values" / "hami-v2.10-defaults.yaml"
#: The releases docs/install.md promises (floor to newest) that hack/k8s pins.
SUPPORTED = ("v1.31.14", "v1.33.13", "v1.35.4", "v1.36.3", "v1.37.2")


def kube_scheduler_args(objs: list[dict[str, Any]]) -> list[str]:
    spec = find(objs, "Deployment", f"{RELEASE}-scheduler")["spec"]["template"]["spec"]
    return list(container(spec, "kube-scheduler")["args"])


def test_the_default_retries_after_10s_before_the_extra_args() -> None:
    args = kube_scheduler_args(render())
    assert args == [f"{FLAG}=10s", "--config=/config/config.yaml", "-v=4"]


def test_empty_leaves_the_flag_out() -> None:
    args = kube_scheduler_args(render(
        {"scheduler": {"kubeScheduler": {"podMaxInUnschedulablePodsDuration": ""}}}))
    assert not [a for a in args if a.startswith(FLAG)]
    assert args == ["--config=/config/config.yaml", "-v=4"]


def test_a_value_is_passed_as_given() -> None:
    args = kube_scheduler_args(render(
        {"scheduler": {"kubeScheduler": {"podMaxInUnschedulablePodsDuration": "1m30s"}}}))
    assert args[0] == f"{FLAG}=1m30s"


def test_hamis_extra_args_keep_the_flag_and_theirs_win() -> None:
    """A HAMi values file sets ``extraNewArgs`` (HAMi's own two): the flag stays; a flag
    an operator puts in ``extraNewArgs`` comes later, and kube-scheduler's flag parser
    takes the last value."""
    args = kube_scheduler_args(render(files=[HAMI_DEFAULTS]))
    assert f"{FLAG}=10s" in args and "--config=/config/config.yaml" in args
    own = kube_scheduler_args(render({"scheduler": {"kubeScheduler": {
        "extraNewArgs": ["--config=/config/config.yaml", f"{FLAG}=2m"]}}}))
    assert [a for a in own if a.startswith(FLAG)] == [f"{FLAG}=10s", f"{FLAG}=2m"]


@pytest.mark.parametrize("bad", ["10", "10x", "-5s", "ten seconds", "10s;rm"])
def test_the_schema_refuses_what_is_no_go_duration(bad: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set-string",
                f"scheduler.kubeScheduler.podMaxInUnschedulablePodsDuration={bad}")
    assert proc.returncode != 0
    assert "podMaxInUnschedulablePodsDuration" in proc.stderr, proc.stderr


def _kube_scheduler(version: str) -> Path:
    cache = Path(os.environ.get("HAMI_CACHE_DIR") or Path.home() / ".cache" / "hami")
    return cache / f"k8s-{version}" / "bin" / "kube-scheduler"


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_supported_kube_scheduler_accepts_the_rendered_args(version: str) -> None:
    """kube-scheduler parses every flag before ``--version`` prints and exits, so an
    unknown flag (a release that dropped it) fails here; a release not built on this
    machine is skipped (``make compat`` builds them)."""
    binary = _kube_scheduler(version)
    if not binary.is_file():
        pytest.skip(f"kube-scheduler {version} not built ({binary})")
    args = kube_scheduler_args(render(kube_version=version))
    assert args[0] == f"{FLAG}=10s"
    ok = subprocess.run([str(binary), *args, "--version"], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert version in ok.stdout
    unknown = subprocess.run([str(binary), *args, "--no-such-flag", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0 and "unknown flag" in unknown.stderr
