"""DRA mode's parts of the scheduler (:mod:`hami.dra`), wired to the engine: the
``/webhook`` and ``/prioritize`` handlers, the template reconciler and collector, node
host usage and DRA-mode preemption. The DRA modules are imported only when DRA mode is
on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hami.scheduler.engine import Engine

if TYPE_CHECKING:
    from hami.dra.prioritize import DraPrioritizer
    from hami.dra.templates import TemplateReconciler
    from hami.dra.webhook import DraWebhook

def dra_parts(engine: Engine, client: Any
              ) -> tuple[DraWebhook, DraPrioritizer, TemplateReconciler]:
    """DRA mode's parts on ``client`` (lightkube ``AsyncClient``): the ``/webhook``
    handler (:class:`hami.dra.webhook.DraWebhook`), the ``/prioritize`` handler
    (:class:`hami.dra.prioritize.DraPrioritizer`) and the template reconciler
    (:class:`hami.dra.templates.TemplateReconciler`), which follows the engine's pod
    watch (``engine.pod_observers``) and records its refusals as Events from the leader.
    The webhook signs with the key the reconciler verifies with: the allocation key
    ring, or with none configured this process's key."""
    from hami.dra.hosts import HostUsage
    from hami.dra.prioritize import DraPrioritizer
    from hami.dra.signedspecs import Keys, process_keys
    from hami.dra.templategc import TemplateCollector
    from hami.dra.templates import TemplateReconciler, refusal_event_name
    from hami.dra.webhook import DraWebhook

    keys: Keys = engine.keyring if engine.keyring is not None else process_keys()

    def emit(pod_meta: Any, reason: str, message: str) -> None:
        # every replica posts it, under a name fixed by the pod and the refusal: the
        # first post wins, the others (another replica, a restart, a new leader) get 409
        engine.events.emit(pod_meta, reason, message, warning=True,
                           name=refusal_event_name(pod_meta, reason, message))

    from hami.dra.reservations import QuotaReservations

    reservations = QuotaReservations(client, engine.settings.pod_namespace
                                     or engine.settings.leader_elect_resource_namespace)
    webhook = DraWebhook(client, engine.config, engine.admit, engine.state.quota, keys=keys,
                         reservations=reservations,
                         trusted_creators=engine.settings.dra_trusted_claim_creators)
    templates = TemplateReconciler(client, keys, emit, config=engine.config)
    engine.pod_observers.append(templates.observe)
    hosts = HostUsage(engine.nodes)  # node CPU/memory for fragmentation-aware
    engine.pod_observers.append(hosts.observe_pod)
    idle_s = engine.settings.dra_template_idle.total_seconds()
    collector = TemplateCollector(client, lambda: engine.leader and engine.synced.is_set(),
                                  templates.forget, idle_s=idle_s,
                                  sweep_s=max(1.0, min(30.0, idle_s / 4)))
    engine.pod_observers.append(collector.observe)
    engine.pod_relist_observers.append(collector.relisted)
    templates.collector = collector
    collector.start()
    from hami.dra.cache import DraObjects
    from hami.scheduler.drapreempt import DraPreemption

    preemption = DraPreemption(engine, DraObjects.shared(client), hosts)
    engine.pod_observers.append(preemption.observe)
    engine.pod_relist_observers.append(preemption.relisted)
    preemption.start()
    return (webhook, DraPrioritizer(client, engine.settings.node_scheduler_policy,
                                    hosts=hosts, steer=preemption.steer), templates)
