"""The scheduler's aiohttp applications: the main one and the one of ``/metrics``.

The main application serves ``/filter``, ``/bind``, ``/webhook``, ``/healthz`` and
``/readyz`` (HAMi v2.10), the extender's ``/preempt`` (ours,
:mod:`hami.scheduler.preemptflow`), ``/status``, and in DRA mode ``/prioritize``; the
metrics application serves ``/metrics`` on its own port (HAMi v2.10). Each handler reads
its body under a size cap and a deadline (:func:`read_body`); large AdmissionReviews are
decided on a worker thread so that ``/filter`` is not held up behind them.
Errors become HTTP replies only here: every handler answers 200 with the extender's
``Error`` field or an AdmissionReview status, never an exception page, and the server
goes on serving whatever the body. The listeners, TLS and lifecycle are
:mod:`hami.scheduler.server`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hami.extender.wire import (
    WireError,
    bind_result,
    filter_result,
    parse_bind_args,
    parse_filter_args,
    parse_preempt_args,
    preempt_result,
)
from hami.metricsauth import AsyncReviewer, MetricsGuard
from hami.netlimits import is_loopback
from hami.scheduler.engine import Engine
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.settings import SchedulerSettings

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
