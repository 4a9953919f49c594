"""The collector of hami's unused ResourceClaimTemplates (:mod:`hami.dra.templategc`)
and the refusal Event's fixed name. The API client is a lightkube-level stub holding
templates; the real control plane path (pods created and deleted) is
tests/e2e/test_dra_churn_e2e.py."""

from __future__ import annotations

import asyncio
from typing import Any

from hami.dra import translate as tr
from hami.dra.templategc import TemplateCollector
from hami.dra.templates import refusal_event_name
from tests.dra.test_webhook import _api_error, _Listing

NAME = tr.template_for(tr.claim_spec(1, 1000, 0, []))[0]
OTHER = tr.template_for(tr.claim_spec(1, 2000, 0, []))[0]


class _Api:
    def __init__(self, *keys: tuple[str, str]) -> None:
        self.templates = {k: {"metadata": {"namespace": k[0], "name": k[1], "uid": f"u-{k}",
                                           "labels": {tr.TEMPLATE_LABEL: "true"}}}
                          for k in keys}
        self.deletes: list[tuple[str, str]] = []

    def list(self, res: Any, namespace: str | None = None, labels: Any = None) -> _Listing:
        assert namespace == "*" and labels == {tr.TEMPLATE_LABEL: "true"}
        listing = _Listing(list(self.templates.values()))

        class _Typed(_Listing):
            async def __aiter__(self) -> Any:
                for d in listing.docs:
                    yield res.from_dict({"apiVersion": "resource.k8s.io/v1",
                                         "kind": "ResourceClaimTemplate", **d,
                                         "spec": {"spec": {}}})
        return _Typed(listing.docs)

    async def delete(self, res: Any, name: str, namespace: str | None = None) -> None:
        self.deletes.append((str(namespace), name))
        if self.templates.pop((str(namespace), name), None) is None:
            raise _api_error(404)


def _pod(uid: str, template: str, *, claimed: bool = False, **spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"resourceClaims": [{"name": "gpu-0", "resourceClaimTemplateName": template}],
                 "containers": [{"name": "c"}], **spec},
        "status": {"phase": "Pending"}}
    if claimed:
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu-0",
                                                   "resourceClaimName": f"{uid}-gpu-0"}]
    return pod


def test_a_template_is_deleted_once_no_pod_needs_it_for_the_idle_time() -> None:
    now = [1000.0]
    api = _Api(("ns", NAME), ("ns", OTHER))
    forgot: list[tuple[str, str]] = []
    gc = TemplateCollector(api, lambda: True, lambda n, t: forgot.append((n, t)),
                           idle_s=60, clock=lambda: now[0])

    async def scenario() -> None:
        gc.observe(_pod("a", NAME))
        gc.observe(_pod("b", NAME))
        assert await gc.sweep() == []  # ready for less than the idle time
        now[0] += 61
        # OTHER: no pod ever named it since this replica started -> deleted
        assert await gc.sweep() == [("ns", OTHER)] and forgot == [("ns", OTHER)]
        gc.observe(_pod("a", NAME, claimed=True))  # a's claim is made
        gc.observe(_pod("b", NAME), deleted=True)  # b is gone
        assert not gc.in_use("ns", NAME)
        now[0] += 30
        assert await gc.sweep() == []  # released 30 s ago
        now[0] += 31
        assert await gc.sweep() == [("ns", NAME)]
        assert api.templates == {} and gc.deleted == 2

    asyncio.run(scenario())


def test_a_bound_or_finished_pod_does_not_keep_a_template_and_a_pending_one_does() -> None:
    now = [0.0]
    api = _Api(("ns", NAME))
    gc = TemplateCollector(api, lambda: True, idle_s=10, clock=lambda: now[0])

    async def scenario() -> None:
        gc.observe(_pod("p", NAME))
        await gc.sweep()
        now[0] += 100
        assert await gc.sweep() == [] and api.templates  # p still waits for its claim
        gc.observe({**_pod("p", NAME), "status": {"phase": "Failed"}})
        now[0] += 11
        assert await gc.sweep() == [("ns", NAME)]

    asyncio.run(scenario())


def test_a_replica_that_does_not_lead_or_has_not_synced_deletes_nothing() -> None:
    now, ready = [0.0], [False]
    api = _Api(("ns", NAME))
    gc = TemplateCollector(api, lambda: ready[0], idle_s=10, clock=lambda: now[0])

    async def scenario() -> None:
        now[0] += 1000
        assert await gc.sweep() == [] and api.deletes == []
        ready[0] = True  # became leader: waits the idle time from now
        assert await gc.sweep() == []
        now[0] += 11
        assert await gc.sweep() == [("ns", NAME)]

    asyncio.run(scenario())


def test_the_refusal_event_name_is_fixed_by_pod_and_refusal() -> None:
    meta = {"name": "p" * 300, "uid": "u1", "namespace": "ns"}
    one = refusal_event_name(meta, "DraTemplateRefused", "m")
    assert one == refusal_event_name(dict(meta), "DraTemplateRefused", "m")
    assert one != refusal_event_name({**meta, "uid": "u2"}, "DraTemplateRefused", "m")
    assert one != refusal_event_name(meta, "DraTemplateRefused", "other")
    assert len(one) <= 253


def test_a_pod_deleted_while_the_watch_was_down_releases_its_templates() -> None:
    """No DELETED event comes for it: the relist's UIDs tell."""
    now = [0.0]
    api = _Api(("ns", NAME))
    gc = TemplateCollector(api, lambda: True, idle_s=10, clock=lambda: now[0])

    async def scenario() -> None:
        gc.observe(_pod("p", NAME))
        gc.observe(_pod("q", NAME))
        await gc.sweep()
        gc.relisted({"q"})
        assert gc.in_use("ns", NAME)
        gc.relisted(set())
        assert not gc.in_use("ns", NAME)
        now[0] += 11
        assert await gc.sweep() == [("ns", NAME)]

    asyncio.run(scenario())
