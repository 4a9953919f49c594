"""Pod spec -> per-container device requests of every registered vendor (HAMi
``Resourcereqs``: init containers first, then regular containers), and the resource
values every vendor's request parser reads (quantities, ``limits`` before ``requests``).

Vendor-neutral: each vendor's ``GenerateResourceRequests`` is its backend's
(``Vendor.request_for_pod``; NVIDIA's is ``hami.devices.nvidia``). Where HAMi silently
turns a malformed value into an *empty* request we raise :class:`RequestError` with a
message; the webhook turns that into a denial, the extender into a filter error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from hami.core.collapse import effective_request, role_of
from hami.core.model import CardFilters, ContainerDeviceRequest, PodRequest
from hami.core.podobjects import sidecar_positions
from hami.core.quantity import QuantityError, parse_quantity, to_int_exact, to_mib, to_milli
from hami.core.vendor import AdmissionError, Vendor, fast_path_vendor
from hami.core.vendors import pod_requests

INT32_MAX = 2**31 - 1


@lru_cache(maxsize=4096)
def _parse(raw: str | int) -> Fraction:
    """``parse_quantity`` memoised: the same few quantity strings recur in every pod."""
    return parse_quantity(raw)


def quantity(raw: Any) -> Fraction:
    """A resource value as an exact fraction (memoised for strings and ints).

    Raises:
        QuantityError: malformed quantity.
    """
    if isinstance(raw, str | int) and not isinstance(raw, bool):
        return _parse(raw)
    return parse_quantity(raw)


class RequestError(ValueError):
    """A container's GPU request cannot be understood (bad number, out of range)."""


def resource_value(container: Mapping[str, Any], name: str) -> Any | None:
    """The raw value of resource ``name`` from ``limits``, falling back to ``requests``."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if name in values:
            return values[name]
    return None


def int_value(container: Mapping[str, Any], name: str) -> int | None:
    """Resource ``name`` of the container as an exact integer, None when absent.

    Raises:
        RequestError: the value is not a quantity or not an integer.
    """
    raw = resource_value(container, name)
    if raw is None:
        return None
    cname = container.get("name", "?")
    try:
        value = to_int_exact(quantity(raw))
    except QuantityError as exc:
        raise RequestError(f"{name} of container {cname}: {exc}") from None
    if value is None:
        raise RequestError(f"{name} of container {cname} must be an integer, got {raw!r}")
    return value


def _containers(pod: Mapping[str, Any]) -> tuple[Sequence[Any], Sequence[Any]]:
    spec = pod.get("spec") or {}
    return spec.get("initContainers") or [], spec.get("containers") or []


def _pod_cpu_memory(init: Sequence[Any], app: Sequence[Any],
                    sidecars: frozenset[int]) -> tuple[int, int]:
    """Effective CPU (millicores) and memory (MiB) requests as kube-scheduler computes
    them: max(sum over app containers, max over init containers), with sidecars
    (positions ``sidecars`` of ``init``) added to every later init container and to the
    app containers (KEP-753)."""

    def one(c: Mapping[str, Any]) -> tuple[int, int]:
        req = ((c.get("resources") or {}).get("requests")) or {}
        try:
            cpu = to_milli(quantity(req["cpu"])) if "cpu" in req else 0
            mem = to_mib(quantity(req["memory"])) if "memory" in req else 0
        except QuantityError as exc:
            raise RequestError(f"container {c.get('name', '?')}: {exc}") from None
        return cpu, mem

    n_init = len(init)
    return effective_request((role_of(pos, n_init, sidecars), *one(c))
                             for pos, c in enumerate([*init, *app]))


def pod_cpu_memory(pod: Mapping[str, Any]) -> tuple[int, int]:
    """A Pod's effective ``(CPU millicores, memory MiB)`` requests, as kube-scheduler
    computes them (:func:`_pod_cpu_memory`).

    Raises:
        RequestError: a container's CPU or memory value is malformed.
    """
    return _pod_cpu_memory(*_containers(pod), sidecar_positions(pod))


def vendor_requests(pod: Mapping[str, Any], vendors: Mapping[str, Vendor]
                    ) -> tuple[Mapping[str, ContainerDeviceRequest], ...]:
    """Per container (init first) the requests of ``vendors`` (non-NVIDIA backends keyed by
    CommonWord), ``()`` when no container asks for any (HAMi v2.10 ``Resourcereqs``, HAMi v2.10
    ``GenerateResourceRequests``).

    Raises:
        RequestError: a vendor value is malformed (the backend's ``AdmissionError``).
    """
    if not vendors:
        return ()
    try:
        per_container = pod_requests(vendors, pod).containers
    except (AdmissionError, QuantityError) as exc:
        raise RequestError(str(exc)) from None
    return per_container if any(per_container) else ()


def pod_request(pod: Mapping[str, Any], registry: Mapping[str, Vendor]) -> PodRequest:
    """A Kubernetes Pod (JSON-shaped mapping) -> :class:`PodRequest`, over the vendors of
    ``registry`` (CommonWord -> backend).

    Containers are listed init containers first, then regular containers; the positions
    of the sidecars (restartable init containers) are :attr:`PodRequest.sidecars`. The share
    fast-path backend's (:func:`~hami.core.vendor.fast_path_vendor`, NVIDIA's with HAMi's
    vendors) requests fill :attr:`PodRequest.containers` (each entry ``None`` when the
    container asks for none of its devices, every entry ``None`` when no registered vendor
    takes that path) and its card filters :attr:`PodRequest.share_filters`; the other
    backends' fill :attr:`PodRequest.vendors`.

    Raises:
        RequestError: any container's device, CPU or memory value is malformed.
    """
    meta = pod.get("metadata") or {}
    init, app = _containers(pod)
    fast = fast_path_vendor(registry)
    fast_word, fast_backend = fast if fast is not None else (None, None)
    try:
        reqs = tuple(fast_backend.container_request(c) if fast_backend is not None else None
                     for c in [*init, *app])
    except (AdmissionError, QuantityError) as exc:
        raise RequestError(str(exc)) from None
    sidecars = sidecar_positions(pod)
    cpu, mem = _pod_cpu_memory(init, app, sidecars)
    others = ({w: v for w, v in registry.items() if w != fast_word}
              if len(registry) > (fast_backend is not None) else None)
    return PodRequest(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        containers=reqs,
        n_init=len(init),
        annotations=dict(meta.get("annotations") or {}),
        cpu_milli=cpu,
        memory_mib=mem,
        vendors=vendor_requests(pod, others) if others else (),
        share_filters=fast_backend.filters if fast_backend is not None else CardFilters(),
        sidecars=sidecars,
    )
