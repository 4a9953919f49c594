"""Pod spec -> per-container device requests (HAMi ``GenerateResourceRequests``).

Source: and ``Resourcereqs`` (init containers
first, then regular containers).

Deliberate divergence from HAMi: where HAMi silently turns a malformed value into an
*empty* request (``nvidia.com/gpumem: 16Gi`` makes the container ask for no GPU at all,
so it runs unconfined), we raise :class:`RequestError` with a message. The webhook turns
that into a denial, the extender into a filter error; nothing is scheduled by accident.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from hami.core.config import NvidiaConfig
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, PodRequest
from hami.core.quantity import QuantityError, parse_quantity, to_int_exact, to_mib, to_milli
from hami.core.vendor import AdmissionError, Vendor
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


def _int_value(container: Mapping[str, Any], name: str) -> int | None:
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


def container_request(
    container: Mapping[str, Any], config: NvidiaConfig
) -> ContainerDeviceRequest | None:
    """One container's NVIDIA request, or ``None`` when it asks for no GPU (HAMi v2.10).

    Returns ``ContainerDeviceRequest(nums, "NVIDIA", memory_mib, memory_percent,
    cores_percent)``; memory is multiplied by ``memory_factor``. A percentage above 100
    is clamped to 100 and one of 0 or below counts as unset (field cases B09, B10), so
    that a container never books 0 MiB by accident.

    Raises:
        RequestError: a value is not an integer, is negative, or overflows int32.
    """
    cname = container.get("name", "?")
    nums = _int_value(container, config.resource_count_name)
    if nums is None or nums == 0:
        return None
    if nums < 0 or nums > INT32_MAX:
        raise RequestError(f"{config.resource_count_name} of container {cname} must be "
                           f"between 1 and {INT32_MAX}, got {nums}")
    factor = max(config.memory_factor, 1)
    memory = _int_value(container, config.resource_memory_name) or 0
    if memory < 0 or memory > INT32_MAX // factor:
        raw = resource_value(container, config.resource_memory_name)
        hint = (f" ({raw!r} is {memory} units; {config.resource_memory_name} counts MiB, "
                "e.g. 16384 for 16 GiB)" if isinstance(raw, str) and not raw.isdigit() else "")
        raise RequestError(f"{config.resource_memory_name} of container {cname} must be "
                           f"between 0 and {INT32_MAX // factor} MiB, got {memory}{hint}")
    memory *= factor
    percent = PERCENT_UNSET
    raw_percent = _int_value(container, config.resource_memory_percentage_name)
    if raw_percent is not None and raw_percent > 0:
        percent = min(raw_percent, 100)
    if percent == PERCENT_UNSET and memory == 0:
        if config.default_memory_mib:
            memory = config.default_memory_mib
        else:
            percent = 100
    cores = _int_value(container, config.resource_core_name)
    if cores is None:
        cores = config.default_cores_percent
    if cores < 0 or cores > INT32_MAX:
        raise RequestError(f"{config.resource_core_name} of container {cname} must be "
                           f"a non-negative percentage, got {cores}")
    return ContainerDeviceRequest(nums=nums, memory_mib=memory, memory_percent=percent,
                                  cores_percent=cores)


def _containers(pod: Mapping[str, Any]) -> tuple[Sequence[Any], Sequence[Any]]:
    spec = pod.get("spec") or {}
    return spec.get("initContainers") or [], spec.get("containers") or []


def _pod_cpu_memory(init: Sequence[Any], app: Sequence[Any]) -> tuple[int, int]:
    """Effective CPU (millicores) and memory (MiB) requests as kube-scheduler computes
    them: max(sum over app containers, max over init containers)."""

    def one(c: Mapping[str, Any]) -> tuple[int, int]:
        req = ((c.get("resources") or {}).get("requests")) or {}
        try:
            cpu = to_milli(quantity(req["cpu"])) if "cpu" in req else 0
            mem = to_mib(quantity(req["memory"])) if "memory" in req else 0
        except QuantityError as exc:
            raise RequestError(f"container {c.get('name', '?')}: {exc}") from None
        return cpu, mem

    app_vals = [one(c) for c in app]
    init_vals = [one(c) for c in init] or [(0, 0)]
    cpu = max(sum(v[0] for v in app_vals), max(v[0] for v in init_vals))
    mem = max(sum(v[1] for v in app_vals), max(v[1] for v in init_vals))
    return cpu, mem


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


def pod_request(pod: Mapping[str, Any], config: NvidiaConfig,
                vendors: Mapping[str, Vendor] | None = None) -> PodRequest:
    """A Kubernetes Pod (JSON-shaped mapping) -> :class:`PodRequest`.

    Containers are listed init containers first, then regular containers, each entry
    ``None`` when it asks for no GPU (HAMi ``Resourcereqs``). ``vendors`` (the registry's
    non-NVIDIA backends) fill :attr:`PodRequest.vendors`.

    Raises:
        RequestError: any container's device, CPU or memory value is malformed.
    """
    meta = pod.get("metadata") or {}
    init, app = _containers(pod)
    reqs = tuple(container_request(c, config) for c in [*init, *app])
    cpu, mem = _pod_cpu_memory(init, app)
    return PodRequest(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        containers=reqs,
        n_init=len(init),
        annotations=dict(meta.get("annotations") or {}),
        cpu_milli=cpu,
        memory_mib=mem,
        vendors=vendor_requests(pod, vendors) if vendors else (),
    )
