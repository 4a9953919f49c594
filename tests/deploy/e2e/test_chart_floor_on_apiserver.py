"""The chart's support floor (``kubeVersion`` in Chart.yaml) against the real API server of
this run (``make e2e K8S_VERSION=1.29.6``): below the floor ``helm install`` refuses in
one line naming the server's version and writes nothing; from the floor on the same
install, server-side dry run, passes."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Secret

from hami.testing.controlplane import KUBERNETES_VERSION, ControlPlane, ensure_namespace
from tests.deploy.chart import CHART, chart_floor, chart_range, helm, release_of

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]
NAMESPACE = "hami-floor"
RELEASE = "hami-floor"


def test_helm_install_follows_the_charts_floor_on_this_server(control_plane: ControlPlane,
                                                              kube_client: Any) -> None:
    ensure_namespace(kube_client, NAMESPACE)
    release = release_of(KUBERNETES_VERSION)
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
