"""Device scores and GPU policies: in which order a node's GPUs are tried.

Source (HAMi v2.10): (device score; the weights
annotation is parsed by :func:`hami.core.codec.parse_scoring_weights`), (GPU-level ordering).
Policies are
small key functions in :data:`GPU_ORDERS`; :func:`order_devices` is the one loop around
them. Node-level policies live in :mod:`hami.core.filter`.

HAMi sorts a "worst first" list and takes GPUs from its end; we return the reverse of
that same stable sort ("best first"), so ties resolve exactly as in HAMi for up to 12
GPUs (Go's insertion sort is stable there): the higher NUMA node, then the higher index.

Divergence (HAMi v2.10 quirk 2): HAMi's device score never counts the request itself in
production because it compares the request type ``NVIDIA`` with the card model for
equality; we count it (vendor match), which only matters between cards of different
sizes on one node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hami.core.codec import ScoringWeights
from hami.core.fit import DeviceState, PodOptions
from hami.core.model import ContainerDeviceRequest


def device_score(dev: DeviceState, request: ContainerDeviceRequest,
                 weights: ScoringWeights) -> float:
    """``10 x (Wslot (1+used)/split + Wcore (cores+used)/total + Wmem (mem+used)/total)``.

    Returns 0 for a GPU with no slots, cores or memory (HAMi v2.10).
    """
    info = dev.info
    if info.split_count == 0 or info.cores_percent == 0 or info.memory_mib == 0:
        return 0.0
    mem = request.memory_on(info.memory_mib)
    return 10.0 * (weights.slot * (1 + dev.used_slots) / info.split_count
                   + weights.core * (request.cores_percent + dev.used_cores) / info.cores_percent
                   + weights.memory * (mem + dev.used_memory_mib) / info.memory_mib)


SortKey = Callable[[DeviceState, float], tuple[float, ...]]


def _spread(d: DeviceState, s: float) -> tuple[float, ...]:
    return (-s, d.info.numa)


def _binpack(d: DeviceState, s: float) -> tuple[float, ...]:
    return (s, d.info.numa)


def _first_fit(d: DeviceState, s: float) -> tuple[float, ...]:
    return (-d.info.index,)


def _mutex(d: DeviceState, s: float) -> tuple[float, ...]:
    return (-d.used_slots, d.info.numa)


#: Single GPU policies as HAMi ``Less`` keys (ascending = worst first). Unknown names and
#: ``topology-aware`` rank like ``spread`` (HAMi v2.10); ``fragmentation-aware`` ranks like
#: ``binpack`` inside a node: the fullest card that fits leaves the most whole cards free.
GPU_ORDERS: dict[str, SortKey] = {
    "spread": _spread,
    "binpack": _binpack,
    "mutex": _mutex,
    "topology-aware": _spread,
    "fragmentation-aware": _binpack,
    # kube-scheduler's DRA allocator inside a node: the first card that fits, in
    # published (index) order; ``hami simulate --mode dra`` models DRA mode with it.
    "first-fit": _first_fit,
}

_CHAIN_KEYS: dict[str, Callable[[DeviceState, float], float]] = {
    "binpack": lambda d, s: s,
    "spread": lambda d, s: -s,
    "numa": lambda d, s: d.info.numa,
}


def _chain(policy: str, numa_bind: bool) -> SortKey:
    keys: list[str] = []
    for word in (p.strip() for p in policy.split(",")):
        if word in _CHAIN_KEYS and word not in keys:
            keys.append(word)
    if not keys:
        keys = ["spread"]
    if numa_bind and keys[0] != "numa":
        keys = ["numa", *(k for k in keys if k != "numa")]
    funcs = [_CHAIN_KEYS[k] for k in keys]
    return lambda d, s: (*(f(d, s) for f in funcs), d.info.index)


def order_devices(devices: Sequence[DeviceState], request: ContainerDeviceRequest,
                  pod: PodOptions, weights: ScoringWeights) -> list[DeviceState]:
    """A node's GPUs best first under the pod's GPU policy (HAMi v2.10)."""
    policy = pod.gpu_policy
    if "," in policy or policy.strip() == "numa":
        key = _chain(policy, pod.numa_bind)
    elif policy == "mutex":
        key = _mutex
    elif pod.numa_bind and policy == "binpack":
        def key(d: DeviceState, s: float) -> tuple[float, ...]:
            return (-d.info.numa, s)
    elif pod.numa_bind:
        def key(d: DeviceState, s: float) -> tuple[float, ...]:
            return (d.info.numa, -s)
    else:
        key = GPU_ORDERS.get(policy, _spread)
    scored = [(key(d, device_score(d, request, weights)), d) for d in devices]
    ordered = [d for _, d in sorted(scored, key=lambda pair: pair[0])]
    ordered.reverse()
    return ordered
