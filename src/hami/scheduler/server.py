"""The lifecycle of ``hami scheduler``: its listeners, from start to stop.

:func:`serve` reads the API server's version and APIs once (refusing DRA mode where it
cannot work), starts the engine, and serves the main application
(:func:`hami.scheduler.routes.build_app`: extender, webhook, health) and the ``/metrics``
one (:func:`hami.scheduler.routes.build_metrics_app`) on their own ports (HAMi v2.10).
With ``--cert-file/--key-file`` the main server speaks TLS and re-reads the pair when
either file changes (:class:`hami.tlsfiles.TlsReloader`; new connections get the new
certificate). ``--extender-http-bind`` adds a plain-HTTP listener on a loopback address
for kube-scheduler in the same pod. Both listeners have deadlines for the request head and
body and a cap on remote connections (:mod:`hami.scheduler.listener`). DRA mode's parts
come from :func:`hami.scheduler.draparts.dra_parts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hami.core.clusterfacts import (
    ClusterFacts,
    binding_copies_labels,
    dra_refusal,
    scheduler_line,
)
from hami.metricsauth import MetricsGuard
from hami.scheduler.draparts import dra_parts
from hami.scheduler.engine import Engine
from hami.scheduler.listener import LimitedSite, runner
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.routes import build_app, build_metrics_app
from hami.scheduler.settings import SchedulerSettings, parse_bind
from hami.scheduler.tls import metrics_tls
from hami.tlsfiles import TlsReloader

log = logging.getLogger("hami.scheduler.server")


class StartupRefused(RuntimeError):
    """The API server lacks what the settings need (DRA mode without resource.k8s.io/v1);
    the message is one line."""


async def _cluster_facts(kube: Any, dra_mode: bool, namespace: str = "") -> ClusterFacts | None:
    """Read the API server's version and APIs once (:mod:`hami.clusterprobe`), log what
    the scheduler does with them, and refuse DRA mode where it cannot work (no
    ``resource.k8s.io/v1``; prioritized lists off: :func:`hami.dra.startup.
    template_refusal`, its dry-run template in ``namespace``, ``default`` when empty).
    None for a Kubernetes client without HTTP access (the tests' in-memory fakes)."""
    from hami.clusterprobe import ProbeError, read_facts_async
    from hami.dra.startup import template_refusal

    client = getattr(kube, "client", None)
    if getattr(getattr(client, "_client", None), "_client", None) is None:
        return None
    try:
        facts = await read_facts_async(client)
    except ProbeError as exc:
        raise StartupRefused(f"cannot read the API server's version and APIs: {exc}") from None
    log.info("%s", scheduler_line(facts, dra_mode))
    refusal = dra_refusal(facts) if dra_mode else None
    if dra_mode and not refusal:
        refusal = await template_refusal(client, facts, namespace or "default")
    if refusal:
        raise StartupRefused(refusal)
    return facts


async def serve(settings: SchedulerSettings, *, kube: Any = None,
                stop: asyncio.Event | None = None,
                started: Callable[[dict[str, int]], None] | None = None) -> None:
    """Run the scheduler until ``stop`` is set (or SIGTERM/SIGINT)."""
    from hami.kube import Kube
    from hami.scheduler.election import LeaderElector

    settings.validate()
    own_kube = kube is None
    if kube is None:
        kube = Kube.connect(settings.kubeconfig or None,
                            timeout_s=settings.kube_timeout.total_seconds() or 10.0,
                            max_inflight=settings.kube_max_inflight,
                            watch_idle_timeout_s=settings.watch_idle_timeout.total_seconds())
    metrics = SchedulerMetrics(legacy=settings.legacy_metrics)
    engine = Engine(settings, kube, observer=metrics)
    try:
        facts = await _cluster_facts(kube, settings.dra_mode, settings.pod_namespace)
    except StartupRefused:
        if own_kube:
            await kube.close()
        raise
    if facts is not None:
        engine.binding_copies_labels = binding_copies_labels(facts)
    metrics.attach(engine)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)

    tls = TlsReloader(settings.cert_file, settings.key_file) if settings.cert_file else None
    reloaders = [tls] if tls else []
    runners: list[web.AppRunner] = []
    ports: dict[str, int] = {}
    limits = settings.server_limits()
    host, port = parse_bind(settings.http_bind)
    dra_webhook = dra_prioritize = dra_templates = None
    if settings.dra_mode:
        from hami.dra.cache import DraObjects

        metrics.attach_dra(DraObjects.shared(kube.client))
        dra_webhook, dra_prioritize, dra_templates = dra_parts(engine, kube.client)
    main_runner = runner(build_app(engine, settings, dra_webhook, dra_prioritize), limits)
    await main_runner.setup()
    await LimitedSite(main_runner, host, port, limits, ssl_context=tls.context if tls else None,
                      name="extender/webhook listener").start()
    runners.append(main_runner)
    ports["http"] = _bound_port(main_runner)
    if settings.extender_http_bind:
        # Plain HTTP for kube-scheduler in the same pod: loopback only (validate()), the
        # same application; every peer is loopback, so the extender's guard lets it in.
        ehost, eport = parse_bind(settings.extender_http_bind)
        plain = LimitedSite(main_runner, ehost, eport, limits,
                            name="extender listener (plain HTTP, loopback)")
        await plain.start()
        ports["extender_http"] = plain.port
    if settings.metrics_bind_address not in ("", "0"):
        mhost, mport = parse_bind(settings.metrics_bind_address)
        guard = reviewer = mtls = None
        if settings.metrics_secure:
            guard, reviewer = MetricsGuard(), (kube.review_token, kube.review_access)
            mtls = metrics_tls(settings)
        mrunner = runner(build_metrics_app(metrics, guard, reviewer), limits)
        await mrunner.setup()
        await LimitedSite(mrunner, mhost, mport, limits, name="metrics listener",
                          ssl_context=mtls.context if mtls else None).start()
        if isinstance(mtls, TlsReloader):
            reloaders.append(mtls)
        runners.append(mrunner)
        ports["metrics"] = _bound_port(mrunner)
    tasks: list[asyncio.Task[Any]] = []
    elector = None
    try:
        await engine.start()
        for reloader in reloaders:
            tasks.append(asyncio.create_task(reloader.watch()))
        if settings.leader_elect:
            elector = LeaderElector(kube, settings, engine.set_leader)
            tasks.append(asyncio.create_task(elector.run(), name="leader-election"))
        log.info("hami scheduler serving on %s (metrics %s), %s", ports.get("http"),
                    ports.get("metrics"), engine.snapshot())
        if started:
            started(ports)
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if elector is not None:
            await elector.release()
        await engine.stop()
        if dra_templates is not None:
            await dra_templates.stop()
        for r in runners:
            await r.cleanup()
        if own_kube:
            await kube.close()


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    return 0
