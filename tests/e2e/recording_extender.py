"""A tiny real scheduler extender for e2e tests: records every call, binds via the API.

It speaks the kube-scheduler extender v1 wire format (Go field names, no JSON tags):
``/filter`` gets ExtenderArgs and returns every offered node as feasible; ``/bind`` gets
ExtenderBindingArgs and creates the pod's Binding through the apiserver. ``/webhook``
answers an admission.k8s.io/v1 AdmissionReview by allowing the object with a JSON patch
that adds the annotation :data:`WEBHOOK_ANNOTATION` (when the object has annotations;
see :meth:`RecordingExtender._webhook`). It serves HTTPS
on 127.0.0.1 with a certificate from a throw-away CA, from an aiohttp app running on its
own event loop in a background thread, so synchronous tests can use it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from lightkube import AsyncClient, KubeConfig

from hami.testing.controlplane import HOST, free_port, pod_binding
from hami.testing.pki import CertificateAuthority

#: Annotation the ``/webhook`` handler adds to every object it admits.
WEBHOOK_ANNOTATION = "e2e.hami.io/mutated"


@dataclass
class Call:
    """One request the extender received: verb (``filter``/``bind``), JSON body, and the
    ``Error`` it answered with (empty on success)."""

    verb: str
    body: dict[str, Any]
    error: str = ""


@dataclass
class RecordingExtender:
    """Start with :meth:`start`, stop with :meth:`stop`; ``calls`` lists what arrived.

    ``reject`` maps node names to a reason: ``/filter`` reports those nodes in
    ``FailedNodes`` instead of passing them.
    """

    kubeconfig: Path
    reject: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _client: AsyncClient | None = None
    ca_pem: bytes = b""  # the CA of the serving cert (a webhook's caBundle)

    @property
    def url(self) -> str:
        """Base URL to register as the extender's ``urlPrefix``."""
        return f"https://{HOST}:{self.port}"

    def verbs(self) -> list[str]:
        """The verbs received so far, in order."""
        return [c.verb for c in list(self.calls)]

    # -- handlers ----------------------------------------------------------------------

    async def _filter(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("filter", body))
        names = body.get("NodeNames")
        if names is None:  # a scheduler without nodeCacheCapable sends whole Nodes
            names = [n["metadata"]["name"] for n in (body.get("Nodes") or {}).get("items", [])]
        return web.json_response(
            {
                "Nodes": None,
                "NodeNames": [n for n in names if n not in self.reject],
                "FailedNodes": {n: self.reject[n] for n in names if n in self.reject},
                "FailedAndUnresolvableNodes": None,
                "Error": "",
            }
        )

    async def _bind(self, request: web.Request) -> web.Response:
        body = await request.json()
        call = Call("bind", body)
        self.calls.append(call)
        assert self._client is not None
        name, namespace = body["PodName"], body["PodNamespace"]
        try:
            await self._client.create(
                pod_binding(name, namespace, body["Node"]), name=name, namespace=namespace
            )
        except Exception as err:  # reported to kube-scheduler, which retries the pod
            call.error = f"binding failed: {err}"
        return web.json_response({"Error": call.error})

    async def _webhook(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("webhook", body))
        req = body["request"]
        has_annotations = bool((req.get("object") or {}).get("metadata", {}).get("annotations"))
        patch: list[dict[str, Any]] = []
        if not has_annotations:
            patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        key = WEBHOOK_ANNOTATION.replace("~", "~0").replace("/", "~1")  # JSON pointer
        patch.append({"op": "add", "path": f"/metadata/annotations/{key}", "value": "true"})
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": req["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> RecordingExtender:
        """Serve on a free 127.0.0.1 port; returns once the socket is listening."""
        ca = CertificateAuthority.create("recording-extender-ca")
        self.ca_pem = ca.cert_pem
        pair = ca.issue("recording-extender", ip_sans=[HOST], server=True)
        ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as tmp:
            crt, key = pair.write(Path(tmp), "server")
            ssl_ctx.load_cert_chain(crt, key)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        async def serve() -> None:
            self._client = AsyncClient(KubeConfig.from_file(self.kubeconfig), trust_env=False)
            app = web.Application()
            app.router.add_post("/filter", self._filter)
            app.router.add_post("/bind", self._bind)
            app.router.add_post("/webhook", self._webhook)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, HOST, self.port, ssl_context=ssl_ctx).start()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="recording-extender", daemon=True)
        self._thread.start()
        if not started.wait(timeout=30):
            raise RuntimeError("recording extender did not start")
        return self

    def stop(self) -> None:
        """Close the server and its API client and end the thread."""
        if self._loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._client is not None:
                await self._client.close()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._loop = None
