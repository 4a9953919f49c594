"""Deploy tests share the e2e control-plane fixtures (skipped when the binaries, lightkube,
cryptography or aiohttp are missing, unless HAMI_E2E_REQUIRED=1)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("HAMI_E2E_REQUIRED") != "1":
    for _module in ("lightkube", "cryptography", "aiohttp"):
        pytest.importorskip(_module)

from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before Kubernetes 1.34 (``make e2e K8S_VERSION=...``) the chart refuses
    ``dra.enabled`` (tests/deploy/test_chart_versions.py checks the message): the DRA
    cases are skipped there. Below the chart's ``kubeVersion`` floor helm refuses the
    chart itself: only test_chart_floor_on_apiserver.py runs."""
    from hami.testing.processes import KUBERNETES_VERSION

    minor = int(KUBERNETES_VERSION.split(".")[1])
    if minor >= 36:
        return
    from tests.deploy.chart import chart_floor

    if (1, minor) < chart_floor():  # helm refuses the chart: only that refusal is tested
        below = pytest.mark.skip(reason=f"helm refuses the chart on {KUBERNETES_VERSION}, "
                                        "below its kubeVersion floor "
                                        "(test_chart_floor_on_apiserver.py checks that)")
        for item in items:
            if (item.path.parent.name == "e2e" and item.path.parent.parent.name == "deploy"
                    and item.path.name != "test_chart_floor_on_apiserver.py"):
                item.add_marker(below)
        return
    if minor >= 34:  # the chart renders DRA mode; the plugin's device taints need 1.36
        taints = pytest.mark.skip(reason=f"{KUBERNETES_VERSION} drops a ResourceSlice's device "
                                         "taints (DRADeviceTaints off), where hami dra-plugin "
                                         "refuses to start (tests/e2e/test_compat_e2e.py)")
        for item in items:
            if item.path.name == "test_dra_policy_on_apiserver.py":
                item.add_marker(taints)
        return
    skip = pytest.mark.skip(reason=f"the chart refuses dra.enabled before Kubernetes 1.34 "
                                   f"(this run: {KUBERNETES_VERSION})")
    for item in items:
        if item.path.parent.name == "e2e" and item.path.parent.parent.name == "deploy" and (
                item.path.name == "test_dra_policy_on_apiserver.py"
                or "[dra" in item.name):
            item.add_marker(skip)
