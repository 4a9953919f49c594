"""Fixtures for tests against the real control plane (etcd, kube-apiserver, kube-scheduler).

The binaries come from ``hack/k8s/build.sh``. When they (or lightkube, cryptography,
aiohttp) are missing the e2e tests are skipped, unless ``HAMI_E2E_REQUIRED=1`` (CI sets it
after building) makes that a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

REQUIRED = os.environ.get("HAMI_E2E_REQUIRED") == "1"
if not REQUIRED:
    for _module in ("lightkube", "cryptography", "aiohttp"):
        pytest.importorskip(_module)

from hami.testing.controlplane import (  # noqa: E402
    BinariesMissing,
    ControlPlane,
    SchedulerHandle,
)
from hami.testing.scheduler_config import ExtenderConfig  # noqa: E402


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane for the whole session, with the default kube-scheduler.

    Its workdir (certificates, configs, component logs under ``logs/``) is a pytest temp
    directory, kept after the run for debugging.
    """
    try:
        cp = ControlPlane(workdir=tmp_path_factory.mktemp("k8s"))
    except BinariesMissing as err:
        if REQUIRED:
            pytest.fail(str(err))
        pytest.skip(str(err))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube_client(control_plane: ControlPlane) -> Any:
    """A lightkube ``Client`` with cluster-admin rights on :func:`control_plane`."""
    return control_plane.client()


@pytest.fixture
def start_kube_scheduler(
    control_plane: ControlPlane,
) -> Iterator[Callable[..., SchedulerHandle]]:
    """Factory: start a kube-scheduler (stopped after the test).

    Call as ``start_kube_scheduler(extender_url, scheduler_name="hami-scheduler",
    **extender_options)``; ``extender_url=None`` starts one without extender. The extender
    entry is the HAMi chart's (:class:`ExtenderConfig` defaults) unless options say otherwise.
    """
    handles: list[SchedulerHandle] = []

    def start(
        extender_url: str | None,
        scheduler_name: str = "hami-scheduler",
        **extender_options: Any,
    ) -> SchedulerHandle:
        extender = ExtenderConfig(extender_url, **extender_options) if extender_url else None
        handle = control_plane.start_scheduler(scheduler_name=scheduler_name, extender=extender)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


#: Test modules of DRA mode: they need resource.k8s.io/v1 (Kubernetes 1.34+) and
#: consumable capacity; on an older release (make e2e K8S_VERSION=...) hami refuses DRA
#: mode, which tests/e2e/test_compat_e2e.py checks instead.
DRA_MODULES = ("test_dra_", "test_bench_plain_dra")  # the bench baseline asks capacity too


def _minor(version: str) -> int:
    return int(version.lstrip("v").split(".")[1])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from hami.testing.processes import KUBERNETES_VERSION

    if _minor(KUBERNETES_VERSION) >= 36:
        return
    skip = pytest.mark.skip(reason=f"DRA mode needs Kubernetes 1.36+ (consumable capacity on "
                                   f"by default); this run is {KUBERNETES_VERSION}, where hami "
                                   "refuses DRA mode (test_compat_e2e checks the refusal)")
    for item in items:
        if item.path.parent.name == "e2e" and item.path.name.startswith(DRA_MODULES) \
                and item.path.parent.parent.name == "tests":
            item.add_marker(skip)
