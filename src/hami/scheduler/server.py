"""The HTTP(S) servers of ``hami scheduler``: extender, webhook, health, metrics.

One aiohttp application serves ``/filter``, ``/bind``, ``/webhook``, ``/healthz`` and
``/readyz`` (HAMi v2.10), and the extender's ``/preempt`` (ours, hami.scheduler.preemptflow); a second one serves ``/metrics`` on its own port (HAMi v2.10).
With ``--cert-file/--key-file`` the main server speaks TLS and re-reads the pair when
either file changes (new connections get the new certificate). ``--extender-http-bind``
adds a plain-HTTP listener on a loopback address for kube-scheduler in the same pod.
Both listeners have deadlines for the request head and body and a cap on remote
connections (:mod:`hami.scheduler.listener`); large AdmissionReviews are decided on a
worker thread so that ``/filter`` is not held up behind them.
Errors become HTTP replies only here: every handler answers 200 with the extender's
``Error`` field or an AdmissionReview status, never an exception page, and the server
goes on serving whatever the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hami.core.clusterfacts import (
    ClusterFacts,
    binding_copies_labels,
    dra_refusal,
    scheduler_line,
)
from hami.extender.wire import (
    WireError,
    bind_result,
    filter_result,
    parse_bind_args,
    parse_filter_args,
    parse_preempt_args,
    preempt_result,
)
from hami.metricsauth import AsyncReviewer, MetricsGuard, self_signed_context
from hami.netlimits import is_loopback
from hami.scheduler.engine import Engine
from hami.scheduler.listener import LimitedSite, runner
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.settings import SchedulerSettings, parse_bind

if TYPE_CHECKING:
    from hami.dra.prioritize import DraPrioritizer
    from hami.dra.templates import TemplateReconciler
    from hami.dra.webhook import DraWebhook

log = logging.getLogger("hami.scheduler.server")

#: AdmissionReviews of at least this many bytes are decided on a worker thread, so that a
#: large pod (hundreds of containers) does not stall ``/filter`` for its duration.
OFFLOAD_ADMISSION_BYTES = 64 * 1024
#: Most AdmissionReviews decided on worker threads at once (each holds the GIL while it
#: runs; more would take the event loop's turns).
OFFLOAD_ADMISSION_SLOTS = 2


def _json(payload: Any) -> web.Response:
    return web.Response(body=json.dumps(payload, separators=(",", ":")).encode(),
                        content_type="application/json")


class BodyTooLarge(Exception):
    pass


class BodyTimeout(Exception):
    pass


async def read_body(request: web.Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refusing more than ``limit`` bytes (HAMi reads through 1 MiB).

    Raises:
        BodyTooLarge: more than ``limit`` bytes (announced or sent).
        BodyTimeout: the body was not complete ``timeout_s`` seconds after this call.
    """
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.content.iter_chunked(65536):
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"request body exceeds {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"request body not complete after {timeout_s:g} s "
                          f"({size} bytes read)") from None
    return b"".join(chunks)


def build_app(engine: Engine, settings: SchedulerSettings,
              dra_webhook: Callable[[bytes], Awaitable[Any]] | None = None,
              dra_prioritize: Callable[[bytes], Awaitable[Any]] | None = None,
              ) -> web.Application:
    """The main application (HAMi v2.10's routes).

    ``/filter``, ``/bind`` and ``/status`` answer only loopback peers (kube-scheduler runs
    in the same pod and calls ``127.0.0.1``) unless ``extender_allow_remote`` is set:
    anyone else gets 403, so the Service that publishes ``/webhook`` does not publish
    the extender. DRA mode (:mod:`hami.dra`): ``dra_webhook`` answers ``/webhook`` and
    ``dra_prioritize`` serves ``/prioritize`` (loopback only, like the extender).
    """
    limit = settings.max_body_bytes
    body_timeout_s = settings.http_body_timeout.total_seconds() or None
    admission_slots = asyncio.Semaphore(OFFLOAD_ADMISSION_SLOTS)

    def guarded(handler: Callable[[bytes], Awaitable[Any]],
                on_error: Callable[[str], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await read_body(request, limit, body_timeout_s)
                result = await handler(body)
                if isinstance(result, bytes):
                    return web.Response(body=result, content_type="application/json")
                return _json(result)
            except BodyTimeout as exc:
                # Too slow to be kube-scheduler or the API server: drop the connection now
                # (a reply would have to wait for the rest of the trickle to be drained).
                log.warning("%s from %s: %s; connection closed", request.path,
                            request.remote, exc)
                if request.transport is not None:
                    request.transport.close()
                response = _json(on_error(str(exc)))
                response.set_status(408)
                return response
            except (BodyTooLarge, WireError) as exc:
                return _json(on_error(str(exc)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never take the server down
                log.exception("%s failed", request.path)
                return _json(on_error(f"internal error: {type(exc).__name__}: {exc}"))
        return handle

    async def do_filter(body: bytes) -> Any:
        return await engine.filter(parse_filter_args(body))

    async def do_bind(body: bytes) -> Any:
        return await engine.bind(parse_bind_args(body))

    async def do_preempt(body: bytes) -> Any:
        return await engine.preempt_verb(parse_preempt_args(body))

    def admit_encoded(body: bytes) -> bytes:
        return json.dumps(engine.admit(body), separators=(",", ":")).encode()

    async def do_webhook(body: bytes) -> Any:
        if dra_webhook is not None:
            return await dra_webhook(body)
        if len(body) < OFFLOAD_ADMISSION_BYTES:
            return engine.admit(body)
        # The decision reads the quota ledgers only (dict lookups, safe while the event
        # loop updates them); decoding, mutating and diffing a large pod is what takes time.
        async with admission_slots:
            return await asyncio.to_thread(admit_encoded, body)

    def webhook_error(message: str) -> Any:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": "", "allowed": False,
                             "status": {"code": 400, "message": message, "status": "Failure"}}}

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if engine.ready():
            return web.Response(text="ok")
        reason = "caches not synced" if not engine.synced.is_set() else "not the leader"
        return web.Response(status=503, text=reason)

    async def status(request: web.Request) -> web.Response:
        return _json(engine.snapshot())

    def local_only(handler: Callable[[web.Request], Awaitable[web.Response]],
                   refusal: Callable[[str], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        if settings.extender_allow_remote:
            return handler

        async def handle(request: web.Request) -> web.Response:
            if is_loopback(request.remote):
                return await handler(request)
            engine.counters.remote_refused += 1
            message = (f"{request.path} answers kube-scheduler on the loopback interface "
                       f"only; refused {request.remote}")
            response = _json(refusal(message))
            response.set_status(403)
            return response
        return handle

    app = web.Application(client_max_size=limit)
    app.router.add_post("/filter", local_only(
        guarded(do_filter, lambda m: filter_result(error=m)), lambda m: filter_result(error=m)))
    app.router.add_post("/bind", local_only(guarded(do_bind, bind_result), bind_result))
    # An unusable preempt request cancels the preemption (no node keeps its victims).
    app.router.add_post("/preempt", local_only(guarded(do_preempt, lambda m: preempt_result({})),
                                               lambda m: preempt_result({})))
    app.router.add_post("/webhook", guarded(do_webhook, webhook_error))
    if dra_prioritize is not None:
        app.router.add_post("/prioritize", local_only(guarded(dra_prioritize, lambda m: []),
                                                      lambda m: []))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", local_only(status, lambda m: {"error": m}))
    return app


def build_metrics_app(metrics: SchedulerMetrics, guard: MetricsGuard | None = None,
                      reviewer: AsyncReviewer | None = None) -> web.Application:
    """The ``/metrics`` application. Secure mode: ``guard`` with ``reviewer`` (the API
    server's TokenReview and SubjectAccessReview) answers each scrape 200, 401, 403 or
    503 (:mod:`hami.metricsauth`) before anything is rendered."""
    async def handle(request: web.Request) -> web.Response:
        if guard is not None and reviewer is not None:
            verdict = await guard.check_async(request.headers.get("Authorization"), reviewer,
                                              request.remote or "")
            if not verdict.allowed:
                headers = ({"WWW-Authenticate": 'Bearer realm="hami-scheduler"'}
                           if verdict.status == 401 else None)
                return web.Response(status=verdict.status, text=verdict.reason + "\n",
                                    headers=headers)
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/metrics", handle)
    return app


class TlsReloader:
    """A server SSLContext that reloads its certificate pair when the files change."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self.reloads = 0
        self.load()

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def load(self) -> None:
        stamp = self._mtimes()
        self.context.load_cert_chain(self.cert_file, self.key_file)
        self._stamp = stamp
        self.reloads += 1

    def maybe_reload(self) -> bool:
        try:
            if self._mtimes() == self._stamp:
                return False
            self.load()
            log.info("reloaded TLS certificate %s", self.cert_file)
            return True
        except (OSError, ssl.SSLError) as exc:  # half-written files: keep the old pair
            log.warning("TLS reload failed, keeping the old certificate: %s", exc)
            return False

    async def watch(self, interval_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.maybe_reload()


class _FixedTls:
    """A TLS context that never changes (the self-signed one of secure metrics)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context


def metrics_tls(settings: SchedulerSettings) -> TlsReloader | _FixedTls:
    """The TLS of the secure metrics listener: the ``--metrics-cert-file`` pair, reloaded
    when it changes, or a self-signed certificate made now
    (:func:`hami.metricsauth.self_signed_context`)."""
    if settings.metrics_cert_file:
        return TlsReloader(settings.metrics_cert_file, settings.metrics_key_file)
    return _FixedTls(self_signed_context()[0])


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
