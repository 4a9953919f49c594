"""The priority feedback loop's decisions (HAMi-core 1.2, HAMi ``feedback.go``). Pure.

Every 5 s :func:`observe` turns each container's region fields into new values of
``recent_kernel`` and ``utilization_switch``; the shell writes the ones that changed.
A priority is any int; the counts are kept per priority value (HAMi grows a list to the
largest priority, which a huge value would make exhaust memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: What libvgpu stores in ``recent_kernel`` at every kernel launch.
LAUNCH_MARK = 2


@dataclass(frozen=True, slots=True)
class ContainerFeedback:
    """One container: ``uuids`` are the GPUs it was granted and ``priority`` its task
    priority (lower = higher; 0 high, 1 low), both from its pod
    (:func:`hami.monitor.pods.container_grants`); ``recent_kernel`` and
    ``utilization_switch`` are the current values of its region's fields."""

    key: str
    uuids: tuple[str, ...]
    priority: int
    recent_kernel: int
    utilization_switch: int


def observe(containers: Sequence[ContainerFeedback]) -> list[ContainerFeedback]:
    """One tick; returns every container with its new field values.

    Pass 1: ``rk`` above :data:`LAUNCH_MARK` (the value libvgpu writes at each launch) is
    taken as :data:`LAUNCH_MARK` (the region is the container's own file: one write of
    2^31-1 would otherwise keep it "active", and its lower-priority neighbours blocked,
    for ever); ``rk > 0`` -> ``rk - 1``; if still > 0 the container is *active* at its
    priority on each of its GPUs (only priorities >= 0 count).
    Pass 2: *blocking* = a strictly higher-priority container is active on a shared GPU:
    then ``recent_kernel`` -1 (if it was >= 0); otherwise a negative value becomes 0.
    ``utilization_switch`` = 1 when blocking or another container of the same priority is
    active on a shared GPU (the container itself counts as one), else 0.
    """
    active: dict[str, dict[int, int]] = {}  # uuid -> priority -> active containers
    after1 = []
    for c in containers:
        rk = min(c.recent_kernel, LAUNCH_MARK)
        if rk > 0:
            rk -= 1
            if rk > 0 and c.priority >= 0:
                for u in c.uuids:
                    counts = active.setdefault(u, {})
                    counts[c.priority] = counts.get(c.priority, 0) + 1
        after1.append(rk)
    out = []
    for c, rk in zip(containers, after1, strict=True):
        blocking = False
        same = False
        for u in c.uuids:
            if u not in active:
                continue
            counts = active[u]
            if any(n > 0 for p, n in counts.items() if p < c.priority):
                blocking = True
            if c.priority >= 0 and counts.get(c.priority, 0) > 1:
                same = True
        if blocking and rk >= 0:
            rk = -1
        elif not blocking and rk < 0:
            rk = 0
        switch = 1 if (blocking or same) else 0
        out.append(ContainerFeedback(c.key, c.uuids, c.priority, rk, switch))
    return out
