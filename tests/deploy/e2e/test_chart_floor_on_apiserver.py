"""The chart's support floor (``kubeVersion`` in Chart.yaml) against the real API server of
this run (``make e2e K8S_VERSION=1.29.6``): below the floor ``helm install`` refuses in
one line naming the server's version and writes nothing; from the floor on the same
install, server-side dry run, passes."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from lightkube.resources.core_v1 import Secret

from hami.testing.controlplane import KUBERNETES_VERSION, ControlPlane, ensure_namespace
from tests.deploy.chart import CHART, helm

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]
NAMESPACE = "hami-floor"
RELEASE = "hami-floor"


def chart_range() -> str:
    """The chart's ``kubeVersion`` (``>=1.31.0-0``)."""
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])


def chart_floor() -> tuple[int, int]:
    """``(major, minor)`` of the chart's ``kubeVersion: ">=1.31.0-0"``."""
    wanted = chart_range()
    m = re.fullmatch(r">=\s*v?(\d+)\.(\d+)\.\d+(-0)?", wanted.strip())
    assert m, f"the chart's kubeVersion is no single floor: {wanted!r}"
    return int(m.group(1)), int(m.group(2))


def test_helm_install_follows_the_charts_floor_on_this_server(control_plane: ControlPlane,
                                                              kube_client: Any) -> None:
    ensure_namespace(kube_client, NAMESPACE)
    release = tuple(int(x) for x in KUBERNETES_VERSION.lstrip("v").split(".")[:2])
    proc = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
                "--kubeconfig", str(control_plane.kubeconfig))
    if release < chart_floor():
        assert proc.returncode != 0, proc.stdout[:500]
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
        assert len(errors) == 1, proc.stderr
        assert f"chart requires kubeVersion: {chart_range()}" in errors[0], errors[0]
        assert KUBERNETES_VERSION in errors[0], errors[0]
        proc = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--kubeconfig", str(control_plane.kubeconfig))
        assert proc.returncode != 0 and "requires kubeVersion" in proc.stderr
        assert not list(kube_client.list(Secret, namespace=NAMESPACE,
                                         labels={"owner": "helm"}))  # no release written
    else:
        assert proc.returncode == 0, proc.stderr
        assert "requires kubeVersion" not in proc.stderr
