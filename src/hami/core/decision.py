"""A filter decision and the pod annotations that record it (HAMi v2.10 step 8:
``hami.io/vgpu-node`` plus every granted vendor's ``PatchAnnotations``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hami.api import names
from hami.core.filter import FilterError, FilterResult
from hami.core.model import PodRequest
from hami.core.vendor import PatchContext, Vendor
from hami.core.vendors import pod_patch


@dataclass(frozen=True, slots=True)
class Decision:
    """A filter decision and the pod annotations that record it (HAMi v2.10).

    ``annotations`` holds ``hami.io/vgpu-node`` and, when a node was chosen, every
    granted vendor's ``PatchAnnotations``: NVIDIA's ``hami.io/vgpu-devices-to-allocate``
    and ``hami.io/vgpu-devices-allocated`` (and its MIG JSON), e.g. Hygon's
    ``hami.io/dcu-devices-…`` (the shell adds ``hami.io/vgpu-time``); empty otherwise.
    """

    result: FilterResult
    request: PodRequest
    annotations: dict[str, str] = field(default_factory=dict)


def decision_annotations(result: FilterResult, request: PodRequest,
                         vendors: Mapping[str, Vendor], now_ns: int,
                         fast: Vendor | None = None) -> dict[str, str]:
    """``hami.io/vgpu-node`` plus every granted vendor's ``PatchAnnotations``: the
    share fast-path backend ``fast``'s (NVIDIA's) for ``result.devices`` (with the MIG
    instances ``result.mig`` in its :class:`~hami.core.vendor.PatchContext`), then
    those of ``vendors`` (the registry without it) for ``result.vendor_devices``.

    Raises:
        FilterError: two vendors would write one pod annotation differently.
    """
    if result.node is None:
        return {}
    annotations = {names.VGPU_NODE: result.node}
    ctx = PatchContext(result.node, now_ns, request.annotations)
    if fast is not None and any(result.devices):
        annotations.update(fast.pod_annotations(result.devices, replace(ctx, mig=result.mig)))
    if result.vendor_devices:
        try:
            written = pod_patch(vendors, result.vendor_devices, ctx)
        except ValueError as exc:
            raise FilterError(str(exc)) from None
        for key, value in written.items():
            if key in annotations and annotations[key] != value:
                raise FilterError(f"vendors disagree on pod annotation {key}")
            annotations[key] = value
    return annotations


__all__ = ["Decision", "decision_annotations"]
