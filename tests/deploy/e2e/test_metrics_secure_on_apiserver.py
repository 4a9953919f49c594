"""``metrics.secure.enabled``: the chart's RBAC applied on the real kube-apiserver, and the
metrics guard of each component run with a real token of the chart's own account
(issue 25 §5). The scheduler's (async, ``hami.kube.Kube``) and the monitor's (sync,
``hami.deviceplugin.kube.KubeApi``) reviews then answer a token of an account the chart
binds to ``<release>-metrics-reader`` (``metrics.secure.readerServiceAccounts``) 200, a
tenant's token 403 and a forged one 401; with the value off the chart gives the accounts
no review rights, and every scrape is refused 503 (fail closed), never served."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ServiceAccount

from hami.deviceplugin.kube import KubeApi
from hami.kube import Kube
from hami.metricsauth import MetricsGuard
from hami.testing.controllers import (
    TOKEN_CONTROLLER,
    start_controller_manager,
    token_controller_args,
)
from hami.testing.controlplane import ControlPlane, wait_until
from tests.deploy.chart import NAMESPACE, render
from tests.deploy.e2e import accounts

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]

READER, TENANT = "prometheus-e2e", "tenant-e2e"
RBAC = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def chart_rbac(secure: bool) -> list[dict[str, Any]]:
    objs = render({"metrics": {"secure": {"enabled": secure, "readerServiceAccounts": [
        {"name": READER, "namespace": NAMESPACE}]}}})
    return [o for o in objs if o["kind"] in RBAC]


@pytest.fixture(scope="module")
def tokens(kube_client: Any) -> Iterator[dict[str, str]]:
    accounts.apply(kube_client, [])  # the release namespace
    for name in (READER, TENANT):
        try:
            kube_client.create(ServiceAccount(metadata=ObjectMeta(name=name,
                                                                  namespace=NAMESPACE)))
        except ApiError as err:
            if err.status.code != 409:
                raise
    yield {"reader": accounts.token(kube_client, READER),
           "tenant": accounts.token(kube_client, TENANT),
           "forged": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.forged"}
    for name in (READER, TENANT):
        kube_client.delete(ServiceAccount, name, namespace=NAMESPACE)


@pytest.fixture
def applied(kube_client: Any, request: pytest.FixtureRequest) -> Iterator[None]:
    """The chart's accounts and RBAC with ``metrics.secure.enabled`` = ``request.param``."""
    done = accounts.apply(kube_client, chart_rbac(request.param))
    try:
        yield
    finally:
        accounts.remove(kube_client, done)


def monitor_answers(kube_client: Any, cp: ControlPlane, tokens: Mapping[str, str]
                    ) -> dict[str, int]:
    """The monitor's guard with the device plugin's own token (chart account)."""
    kube = KubeApi(accounts.token_client(kube_client, cp, "hami-device-plugin"))
    guard, reviewer = MetricsGuard(), (kube.review_token, kube.review_access)
    return {who: guard.check(f"Bearer {t}", reviewer).status for who, t in tokens.items()}


def scheduler_answers(kube_client: Any, cp: ControlPlane, tokens: Mapping[str, str],
                      work: Path) -> dict[str, int]:
    """The scheduler's guard with the scheduler's own token (chart account)."""
    config = accounts.kubeconfig(cp, "hami-scheduler",
                                 accounts.token(kube_client, "hami-scheduler"),
                                 work / "scheduler.kubeconfig")

    async def run() -> dict[str, int]:
        kube = Kube.connect(config)
        try:
            guard, reviewer = MetricsGuard(), (kube.review_token, kube.review_access)
            return {who: (await guard.check_async(f"Bearer {t}", reviewer)).status
                    for who, t in tokens.items()}
        finally:
            await kube.close()
    return asyncio.run(run())


@pytest.mark.parametrize("applied", [True], indirect=True)
@pytest.mark.usefixtures("applied")
def test_chart_rbac_lets_the_components_ask_and_the_reader_read(
        kube_client: Any, control_plane: ControlPlane, tokens: dict[str, str],
        tmp_path: Path) -> None:
    want = {"reader": 200, "tenant": 403, "forged": 401}
    assert monitor_answers(kube_client, control_plane, tokens) == want
    assert scheduler_answers(kube_client, control_plane, tokens, tmp_path) == want


@pytest.mark.parametrize("applied", [False], indirect=True)
@pytest.mark.usefixtures("applied")
def test_without_the_value_the_accounts_cannot_ask_and_nobody_is_served(
        kube_client: Any, control_plane: ControlPlane, tokens: dict[str, str],
        tmp_path: Path) -> None:
    refused = {"reader": 503, "tenant": 503, "forged": 503}
    assert monitor_answers(kube_client, control_plane, tokens) == refused
    assert scheduler_answers(kube_client, control_plane, tokens, tmp_path) == refused


def test_the_service_monitors_token_secret_is_served_by_both_components(
        kube_client: Any, control_plane: ControlPlane, tmp_path: Path) -> None:
    """The ServiceMonitors' ``authorization`` names a Secret the chart renders: applied
    with the chart's scraper account and binding, kube-controller-manager's token
    controller fills in the key the endpoints read, and both components' metrics guards
    (their own chart accounts) answer that token 200. Deleting the Secret revokes it."""
    import base64

    from lightkube.resources.core_v1 import Secret

    objs = render({"metrics": {"secure": {"enabled": True}}, "prometheus": {"enabled": True}})
    refs = [e["authorization"]["credentials"] for o in objs if o["kind"] == "ServiceMonitor"
            for e in o["spec"]["endpoints"]]
    assert len(refs) == 2 and all(r == refs[0] for r in refs), refs
    secret = next(o for o in objs if o["kind"] == "Secret"
                  and o["metadata"]["name"] == refs[0]["name"])
    done = accounts.apply(kube_client, [o for o in objs if o["kind"] in RBAC])
    manager = start_controller_manager(control_plane, (TOKEN_CONTROLLER,),
                                       extra_args=token_controller_args(control_plane))
    try:
        kube_client.create(Secret.from_dict(secret))

        def filled() -> str | None:
            data = kube_client.get(Secret, refs[0]["name"], namespace=NAMESPACE).data or {}
            value = data.get(refs[0]["key"])
            return base64.b64decode(value).decode() if value else None

        wait_until(lambda: filled() is not None, timeout_s=60,
                   what=f"the token controller fills in {refs[0]['name']}")
        scraper = {"scraper": str(filled())}
        assert monitor_answers(kube_client, control_plane, scraper) == {"scraper": 200}
        assert scheduler_answers(kube_client, control_plane, scraper, tmp_path) == \
            {"scraper": 200}
        kube_client.delete(Secret, refs[0]["name"], namespace=NAMESPACE)
        # a fresh guard (no cached verdict): the token died with its Secret
        wait_until(lambda: monitor_answers(kube_client, control_plane, scraper)
                   == {"scraper": 401}, timeout_s=30, what="the deleted Secret's token refused")
    finally:
        manager.component.stop()
        try:
            kube_client.delete(Secret, refs[0]["name"], namespace=NAMESPACE)
        except ApiError as err:
            if err.status.code != 404:
                raise
        accounts.remove(kube_client, done)
