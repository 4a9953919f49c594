"""Bad input never hurts (hypothesis): arbitrary, malformed, truncated and oversized
bodies for /filter, /bind and /webhook, and arbitrary values in every annotation the
scheduler parses. Each request gets a 200 with a clear error in the reply, the server
keeps serving, and the ledger is unchanged.

One real aiohttp server (TCP on 127.0.0.1) runs on its own event loop thread for the
whole module, over the in-memory API stand-in; hypothesis drives it with plain HTTP.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app

from .fake_kube import FakeKube
from .support import SETTINGS, gpu_pod, ledger_snapshot, node

EXAMPLES = 300
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Server:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.kube = FakeKube()
        for name in ("n1", "n2"):
            self.kube.put("Node", node(name))
        self.engine: Engine | None = None
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        assert ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.engine = Engine(SETTINGS, self.kube)
            await self.engine.start()
            runner = web.AppRunner(build_app(self.engine, SETTINGS))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]

        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    def call(self, fn: Any) -> Any:
        async def wrapped() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(30)

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        return resp.status, json.loads(data)

    def healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    def snapshot(self) -> Any:
        assert self.engine is not None
        engine = self.engine
        return self.call(lambda: ledger_snapshot(engine))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.loop.call_soon_threadsafe(srv.loop.stop)


# ------------------------------------------------------------------ strategies
text = st.text(max_size=40)
junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(text, inner, max_size=4), max_leaves=12)
quantity = st.one_of(st.sampled_from(["1", "2", "0", "-1", "100", "101", "4000", "1.5", "16Gi",
                                      "500m", "1e3", "99999999999", "", " ", "abc", "0x10"]),
                     st.integers(-10, 10**12).map(str), text)
RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
             "nvidia.com/gpucores", "nvidia.com/priority", "cpu", "memory"]
POD_ANNOTATIONS = ["hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate",
                   "hami.io/vgpu-node", "hami.io/vgpu-mig-allocations",
                   "hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy",
                   "hami.io/device-scoring-weights", "nvidia.com/use-gputype",
                   "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid",
                   "nvidia.com/nouse-gpuuuid", "nvidia.com/numa-bind", "nvidia.com/vgpu-mode"]
NODE_ANNOTATIONS = ["hami.io/node-nvidia-register", "hami.io/node-nvidia-score",
                    "hami.io/node-handshake", "hami.io/mutex.lock", "hami.io/device-cordon"]
annotation_value = st.one_of(text, st.sampled_from([
    "GPU-n1-0,NVIDIA,1000,10:;", "GPU-x,NVIDIA,abc,1:;", ",,,:;;", "binpack", "spread,mutex",
    "topology-aware", "slot=1,core=2,memory=3", "slot=x", "true", "[]", "[{}]", "{}", "null",
    '[{"id":"GPU-z","count":-1,"devmem":-5,"devcore":100,"type":"NVIDIA","health":true}]',
    "2026-01-01T00:00:00Z,a,b", "Requesting_2020-01-01 00:00:00", "Deleted_x"]))


@st.composite
def containers(draw: Any) -> Any:
    limits = draw(st.dictionaries(st.sampled_from(RESOURCES), quantity, max_size=5))
    container: dict[str, Any] = {"name": draw(text), "resources": {"limits": limits}}
    if draw(st.booleans()):
        container["resources"]["requests"] = draw(
            st.dictionaries(st.sampled_from(RESOURCES), quantity, max_size=3))
    if draw(st.booleans()):
        container["securityContext"] = {"privileged": draw(st.booleans())}
    return container


@st.composite
def pods(draw: Any) -> Any:
    uid = f"fuzz-{draw(st.integers(0, 10**9))}"
    meta: dict[str, Any] = {"name": uid, "namespace": draw(st.sampled_from(["default", "x", ""])),
                            "uid": uid,
                            "annotations": draw(st.dictionaries(st.sampled_from(POD_ANNOTATIONS),
                                                                annotation_value, max_size=4))}
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(), max_size=2))
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "hami-scheduler", ""]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


node_names = st.one_of(st.none(), st.lists(st.sampled_from(["n1", "n2", "ghost", ""]), max_size=4),
                       junk)


def _assert_clean(server: Server, before: Any) -> None:
    assert server.healthy()
    assert server.snapshot() == before


# ----------------------------------------------------------------------- tests
@FUZZ
@given(body=st.one_of(junk.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200)))
def test_any_body_to_any_route(server: Server, body: bytes) -> None:
    before = server.snapshot()
    for path in ("/filter", "/bind"):
        status, reply = server.post(path, body)
        assert status == 200 and isinstance(reply["Error"], str)
    status, reply = server.post("/webhook", body)
    assert status == 200 and "response" in reply
    _assert_clean(server, before)


@FUZZ
@given(pod=pods(), names=node_names, cut=st.integers(0, 400))
def test_extender_args(server: Server, pod: Any, names: Any, cut: int) -> None:
    before = server.snapshot()
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    status, reply = server.post("/filter", body)
    assert status == 200 and set(reply) == {"Nodes", "NodeNames", "FailedNodes",
                                            "FailedAndUnresolvableNodes", "Error"}
    # The fuzz pod does not exist in the API, so a chosen node's patch fails and the
    # charge is undone: whatever the answer, the ledger is as before.
    status, reply = server.post("/filter", body[: max(1, len(body) - cut)] if cut else body)
    assert status == 200 and isinstance(reply["Error"], str)
    _assert_clean(server, before)


@FUZZ
@given(args=st.dictionaries(st.sampled_from(["PodName", "podname", "PodNamespace", "PodUID",
                                             "Node", "node", "extra"]),
                            st.one_of(text, junk, st.sampled_from(["n1", "default"])),
                            max_size=5))
def test_binding_args(server: Server, args: Any) -> None:
    before = server.snapshot()
    locks = server.call(lambda: [n["metadata"]["annotations"].get("hami.io/mutex.lock")
                                 for n in server.kube.objects["Node"].values()])
    status, reply = server.post("/bind", json.dumps(args).encode())
    assert status == 200 and isinstance(reply["Error"], str)
    assert server.call(lambda: [n["metadata"]["annotations"].get("hami.io/mutex.lock")
                                for n in server.kube.objects["Node"].values()]) == locks
    _assert_clean(server, before)


@FUZZ
@given(pod=st.one_of(pods(), junk), version=st.sampled_from(
    ["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "x"]), cut=st.integers(0, 300))
def test_admission_reviews(server: Server, pod: Any, version: str, cut: int) -> None:
    before = server.snapshot()
    review = {"apiVersion": version, "kind": "AdmissionReview",
              "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "operation": "CREATE", "object": pod}}
    body = json.dumps(review).encode()
    status, reply = server.post("/webhook", body)
    assert status == 200
    response = reply["response"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"]
    status, reply = server.post("/webhook", body[: max(1, len(body) - cut)] if cut else body)
    assert status == 200 and "response" in reply
    _assert_clean(server, before)


@FUZZ
@given(node_ann=st.dictionaries(st.sampled_from(NODE_ANNOTATIONS), annotation_value, max_size=5),
       pod_ann=st.dictionaries(st.sampled_from(POD_ANNOTATIONS), annotation_value, max_size=5),
       phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded", None, 7]))
def test_every_parsed_annotation(server: Server, node_ann: Any, pod_ann: Any, phase: Any) -> None:
    """Arbitrary annotation values arriving through the watches never break the engine;
    afterwards the cluster is put back and a normal pod still schedules."""
    bad = node("fz")
    bad["metadata"]["annotations"].update(node_ann)
    other = gpu_pod("fz-pod", annotations=pod_ann)
    other["status"] = {"phase": phase}
    other["spec"]["nodeName"] = "n1"

    def feed() -> None:
        server.kube.put("Node", bad)
        server.kube.put("Pod", other)

    server.call(feed)
    status, reply = server.post("/filter", json.dumps(
        {"Pod": gpu_pod("probe", memory_mib=10), "NodeNames": ["n1", "fz"]}).encode())
    assert status == 200 and isinstance(reply["Error"], str)

    def cleanup() -> None:
        server.kube.delete("Pod", ("default", "fz-pod"))
        server.kube.delete("Node", ("", "fz"))

    server.call(cleanup)
    assert server.healthy()
    assert server.call(lambda: server.engine.counters.apply_errors) == 0  # type: ignore[union-attr]


def test_oversized_and_truncated_bodies(server: Server) -> None:
    before = server.snapshot()
    huge = b'{"Pod": {"metadata": {"name": "' + b"x" * (2 << 20) + b'"}}}'
    for path in ("/filter", "/bind", "/webhook"):
        status, reply = server.post(path, huge)
        assert status == 200
        text = json.dumps(reply)
        assert "exceeds" in text
    status, reply = server.post("/filter", b'{"Pod": {"metadata": {"na')
    assert status == 200 and reply["Error"].startswith("invalid JSON body")
    _assert_clean(server, before)
