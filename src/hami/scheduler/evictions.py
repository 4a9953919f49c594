"""Carrying out a preemption plan the Kubernetes way, for extender mode
(:mod:`hami.scheduler.preemptflow`) and DRA mode (:mod:`hami.scheduler.drapreempt`) alike:

* ``status.nominatedNodeName`` on the preemptor (kube-scheduler then tries that node
  first and does not preempt again for it while the victims terminate);
* the **Eviction API** (``policy/v1``) for each victim, those a PodDisruptionBudget
  covers first, so a refusal drops the plan before any unprotected pod is gone; a victim
  already gone (404) counts as evicted;
* Events: ``Preempted`` on each victim (node, cards, what it frees), ``Preempting`` on
  the preemptor (:meth:`hami.core.preemption.PreemptionPlan.describe`),
  ``PreemptionRefused`` (a warning) on the preemptor when an eviction was refused;
* the preemption metrics (``observer.preemption``).

The caller keeps its own book (reservation, refused nodes, evicted pods) through the two
callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from hami.core.preemption import PreemptionPlan
from hami.kube import KubeError

log = logging.getLogger("hami.scheduler.preemption")

PREEMPTING = "Preempting"
PREEMPTED = "Preempted"
PREEMPTION_REFUSED = "PreemptionRefused"


async def carry_out(kube: Any, events: Any, observer: Any, meta: Mapping[str, Any], uid: str,
                    priority: int, plan: PreemptionPlan, *,
                    evicted: Callable[[str], None], refused: Callable[[str], None],
                    mode: str = "") -> bool:
    """Nominate, evict and report ``plan`` for the preemptor (``meta``: its metadata,
    ``uid``, ``priority``). ``kube``: :class:`hami.kube.Kube` (``patch_pod_status``,
    ``evict``); ``events``: :class:`hami.scheduler.events.EventSink`; ``observer``: the
    engine's (``preemption(victims=, refused=)``). ``evicted(victim uid)`` is called
    after each eviction the API accepted, ``refused(message)`` once when one was refused
    (then nothing more is evicted). ``mode``: words added to the log lines.

    Returns True when every victim was evicted (or was gone), False after a refusal.
    Never raises for an API error (each is logged or reported)."""
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    who = {"namespace": ns, "name": name, "uid": uid}
    try:
        await kube.patch_pod_status(ns, name, {"status": {"nominatedNodeName": plan.node}})
    except KubeError as exc:
        log.info("nominatedNodeName of %s/%s not written: %s", ns, name, exc.message)
    cards = ", ".join(plan.cards())
    done = 0
    for victim in sorted(plan.victims, key=lambda v: not v.violates_budget):
        try:
            await kube.evict(victim.namespace, victim.name, victim.uid)
        except KubeError as exc:
            if exc.not_found:
                continue
            message = (f"eviction of {victim.namespace}/{victim.name} on node {plan.node} "
                       f"refused ({exc.message}); hami tries another node or waits")
            refused(message)
            observer.preemption(victims=done, refused=True)
            events.emit(who, PREEMPTION_REFUSED, message, warning=True)
            log.info("preemption%s for %s/%s on %s dropped: eviction of %s/%s refused: %s",
                     mode, ns, name, plan.node, victim.namespace, victim.name, exc.message)
            return False
        done += 1
        evicted(victim.uid)
        freed = "; ".join(f"{c.uuid}: {c.memory_mib} MiB, {c.cores_percent}% cores"
                          for c in victim.freed)
        events.emit({"namespace": victim.namespace, "name": victim.name, "uid": victim.uid},
                    PREEMPTED, f"preempted by {ns}/{name} (priority {priority}) on node "
                    f"{plan.node} for card(s) {cards}; frees {freed}", warning=False)
    observer.preemption(victims=done, refused=False)
    events.emit(who, PREEMPTING, plan.describe(), warning=False)
    log.info("preemption%s for %s/%s: %s", mode, ns, name, plan.describe())
    return True


__all__ = ["PREEMPTED", "PREEMPTING", "PREEMPTION_REFUSED", "carry_out"]
