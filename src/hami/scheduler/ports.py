"""What the scheduler's engine needs from outside it: the API layer
(:class:`KubeApi`, implemented by :class:`hami.kube.Kube` and by the tests' fakes) and
the metrics hooks (:class:`Observer`, implemented by
:class:`hami.scheduler.metrics.SchedulerMetrics`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

JSON = dict[str, Any]
JSONList = list[JSON]


class KubeApi(Protocol):
    """What the engine needs from :class:`hami.kube.Kube` (a fake implements it in tests)."""

    async def list(self, kind: str, on_item: Callable[[JSON], None]) -> str: ...
    def watch(self, kind: str, resource_version: str) -> Any: ...
    async def get_node(self, name: str) -> JSON: ...
    async def get_pod(self, namespace: str, name: str) -> JSON | None: ...
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON: ...
    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON: ...
    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None) -> None: ...
    async def create_event(self, event: Mapping[str, Any]) -> None: ...
    async def list_pdbs(self) -> JSONList: ...
    async def evict(self, namespace: str, name: str, uid: str) -> None: ...
    async def patch_pod_status(self, namespace: str, name: str,
                               patch: Mapping[str, Any]) -> JSON: ...


class Observer(Protocol):
    """Metrics hooks (see :mod:`hami.scheduler.metrics`)."""

    def filter_done(self, seconds: float, outcome: str) -> None: ...
    def bind_done(self, seconds: float, outcome: str) -> None: ...
    def preemption(self, victims: int, refused: bool) -> None: ...
    def preemptor_bound(self, seconds: float) -> None: ...


class NoObserver:
    """The hooks of :class:`Observer`, doing nothing (an engine without metrics)."""

    def filter_done(self, seconds: float, outcome: str) -> None:
        pass

    def bind_done(self, seconds: float, outcome: str) -> None:
        pass

    def preemption(self, victims: int, refused: bool) -> None:
        pass

    def preemptor_bound(self, seconds: float) -> None:
        pass
