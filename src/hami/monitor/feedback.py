"""The priority feedback loop's decisions (HAMi-core 1.2, HAMi ``feedback.go``). Pure.

Every 5 s :func:`observe` turns each container's region fields into new values of
``recent_kernel`` and ``utilization_switch``; the shell writes the ones that changed.
A priority is any int; the counts are kept per priority value (HAMi grows a list to the
largest priority, which a huge value would make exhaust memory).

HAMi blocks a lower-priority container for as long as a higher-priority one on its GPU
looks active, and "active" is what the higher-priority container writes in its own
region: a priority-0 container that writes ``recent_kernel = 2`` before every tick keeps
its neighbours blocked for ever. :class:`BlockBudget` bounds that whatever is written: a
container is blocked in at most ``max_blocked`` of any ``window_ticks`` consecutive ticks
(9 of 12 by default: at least 15 s of every minute to launch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

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


#: Ticks in the window of :class:`BlockBudget` (one minute at the monitor's 5 s tick).
BLOCK_WINDOW_TICKS = 12
#: Most ticks of a window in which one container may be blocked.
MAX_BLOCKED_TICKS = 9


@dataclass
class BlockBudget:
    """How long the feedback loop may keep each container blocked: in any
    ``window_ticks`` consecutive ticks at most ``max_blocked`` (ticks, not seconds; the
    monitor ticks every 5 s). Keeps, per container key, whether it was blocked in each of
    its last ``window_ticks - 1`` ticks; a key absent from a tick is forgotten.

    Raises ``ValueError`` at construction unless ``0 <= max_blocked < window_ticks``
    (a budget as long as its window would bound nothing).
    """

    window_ticks: int = BLOCK_WINDOW_TICKS
    max_blocked: int = MAX_BLOCKED_TICKS
    history: dict[str, deque[bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.max_blocked < self.window_ticks:
            raise ValueError(f"max_blocked must be in [0, window_ticks), got "
                             f"{self.max_blocked} of {self.window_ticks}")

    def allows(self, key: str) -> bool:
        """True while ``key`` may be blocked in this tick (fewer than ``max_blocked``
        blocked ticks among its previous ``window_ticks - 1``)."""
        past = self.history.get(key)
        return past is None or sum(past) < self.max_blocked

    def record(self, blocked: dict[str, bool]) -> None:
        """End of a tick: ``blocked`` says for every container of the tick whether it was
        left blocked; containers not in it are forgotten."""
        for key in [k for k in self.history if k not in blocked]:
            del self.history[key]
        for key, was in blocked.items():
            past = self.history.setdefault(key, deque(maxlen=self.window_ticks - 1))
            past.append(was)

    def blocked_ticks(self, key: str) -> int:
        """Blocked ticks of ``key`` among its last ``window_ticks - 1`` (0 if unknown)."""
        return sum(self.history.get(key, ()))


def observe(containers: Sequence[ContainerFeedback],
            budget: BlockBudget | None = None) -> list[ContainerFeedback]:
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
    With ``budget`` (the monitor always passes one, :class:`BlockBudget`) a container that
    has used up its blocked ticks is not blocked in this tick (a negative value becomes 0,
    so libvgpu lets it launch) but keeps ``utilization_switch`` 1 (it runs at its cores
    limit); the tick's outcome is recorded in ``budget``.
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
        contended = blocking or same
        if blocking and budget is not None and not budget.allows(c.key):
            blocking = False
        if blocking and rk >= 0:
            rk = -1
        elif not blocking and rk < 0:
            rk = 0
        switch = 1 if contended else 0
        out.append(ContainerFeedback(c.key, c.uuids, c.priority, rk, switch))
    if budget is not None:
        budget.record({c.key: c.recent_kernel < 0 for c in out})
    return out
