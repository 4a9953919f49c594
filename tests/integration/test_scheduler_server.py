"""The scheduler process's HTTP surface and watch handling on a real aiohttp server, with
an in-memory stand-in for the Kubernetes API (tests/integration/fake_kube.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from datetime import UTC, datetime, timedelta

import pytest

from hami.devices.registry import make_config
from hami.kube import KubeError
from hami.offline import schedule
from hami.scheduler.election import LeaderElector
from hami.scheduler.tls import TlsReloader

from .fake_kube import FakeKube
from .support import SETTINGS, gpu_pod, ledger_snapshot, node, run, serving


def cluster(*names: str) -> FakeKube:
    kube = FakeKube()
    for name in names:
        kube.put("Node", node(name))
    return kube


def stamp(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_filter_then_bind_writes_the_offline_annotations() -> None:
    pods = [gpu_pod("a", memory_mib=20000), gpu_pod("b", memory_mib=6000, cores=30),
            gpu_pod("c", gpus=2, memory_mib=1000)]

    async def scenario() -> None:
        kube = cluster("n1", "n2")
        offline = schedule([node("n1"), node("n2"), *pods], make_config())
        async with serving(kube) as h:
            for pod, expected in zip(pods, offline["pods"], strict=True):
                live = kube.put("Pod", pod)
                result = await h.filter(live, ["n2", "n1"])  # kube-scheduler rotates the order
                assert result["Error"] == "" and result["NodeNames"] == [expected["node"]]
                assert set(result) == {"Nodes", "NodeNames", "FailedNodes",
                                       "FailedAndUnresolvableNodes", "Error"}
                ann = kube.pod(pod["metadata"]["name"])["metadata"]["annotations"]
                assert {k: ann[k] for k in expected["annotations"]} == expected["annotations"]
                assert kube.pod(pod["metadata"]["name"])["metadata"]["labels"] == {
                    "hami.io/vgpu-node": expected["node"]}
                assert (await h.bind(live, expected["node"]))["Error"] == ""
                bound = kube.pod(pod["metadata"]["name"])
                assert bound["spec"]["nodeName"] == expected["node"]
                assert bound["metadata"]["annotations"]["hami.io/bind-phase"] == "allocating"
                lock = kube.node(expected["node"])["metadata"]["annotations"]["hami.io/mutex.lock"]
                assert lock.endswith(f",default,{pod['metadata']['name']}")
                await kube.patch_node(expected["node"], {"metadata": {"annotations": {
                    "hami.io/mutex.lock": None}}})  # the device plugin's Allocate
            reasons = [e["reason"] for e in kube.events]
            await h.settle()
            reasons = [e["reason"] for e in kube.events]
            assert reasons.count("FilteringSucceed") == 3 and reasons.count("BindingSucceed") == 3

    run(scenario)


def test_unschedulable_reports_reasons_and_changes_nothing() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            before = ledger_snapshot(h.engine)
            pod = h.kube.put("Pod", gpu_pod("big", memory_mib=999999))
            result = await h.filter(pod, ["n1", "ghost"])
            assert result["NodeNames"] is None
            assert result["FailedNodes"] == {"n1": "4/4 CardInsufficientMemory",
                                             "ghost": "node unregistered"}
            assert ledger_snapshot(h.engine) == before
            assert "hami.io/vgpu-node" not in h.kube.pod("big")["metadata"]["annotations"]

    run(scenario)


def test_pod_without_gpu_passes_through_untouched() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", {"metadata": {"name": "plain", "namespace": "default"},
                                     "spec": {"schedulerName": "hami-scheduler",
                                              "containers": [{"name": "c", "image": "x"}]}})
            result = await h.filter(pod, ["n1", "n2"])
            assert result["NodeNames"] == ["n1", "n2"] and result["Error"] == ""
            assert "patch pod" not in h.kube.calls

    run(scenario)


def test_simulation_path_has_no_side_effects() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            before = ledger_snapshot(h.engine)
            calls = len(h.kube.calls)
            pod = gpu_pod("sim", memory_mib=1000)
            result = await h.post("/filter", {"Pod": pod, "Nodes": {"items": [node("x"), node("y")]}})
            assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["x"]
            small = gpu_pod("sim2", memory_mib=30000)
            result = await h.post("/filter", {"Pod": small, "Nodes": {"items": [node("x")]}})
            assert result["FailedNodes"] == {"x": "4/4 CardInsufficientMemory"}
            assert ledger_snapshot(h.engine) == before and len(h.kube.calls) == calls

    run(scenario)


@pytest.mark.parametrize("async_patch", [False, True])
def test_patch_failure_undoes_the_charge(async_patch: bool) -> None:
    async def scenario() -> None:
        async with serving(cluster("n1"), async_annotation_patch=async_patch) as h:
            before = ledger_snapshot(h.engine)
            h.kube.fail["patch pod"] = KubeError(500, "etcd is sad")
            pod = h.kube.put("Pod", gpu_pod("p", memory_mib=1000))
            result = await h.filter(pod, ["n1"])
            if async_patch:  # answered at once; the bind learns about the failed write
                assert result["NodeNames"] == ["n1"]
                bind = await h.bind(pod, "n1")
                assert "etcd is sad" in bind["Error"]
                assert "bind" not in h.kube.calls
            else:
                assert "etcd is sad" in result["Error"]
            assert ledger_snapshot(h.engine) == before

    run(scenario)


def test_a_newer_filter_of_the_same_pod_lands_last() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1", "n2")) as h:
            pod = h.kube.put("Pod", gpu_pod("p", memory_mib=20000))
            first = await h.filter(pod, ["n1"])
            second = await h.filter(pod, ["n2"])
            assert (first["NodeNames"], second["NodeNames"]) == (["n1"], ["n2"])
            assert (await h.bind(pod, "n2"))["Error"] == ""
            ann = h.kube.pod("p")["metadata"]["annotations"]
            assert ann["hami.io/vgpu-node"] == "n2"
            assert [e.node for e in h.engine.state.ledger.pods()] == ["n2"]

    run(scenario)


def test_restart_rebuilds_the_ledger_from_annotations() -> None:
    async def scenario() -> None:
        kube = cluster("n1", "n2")
        async with serving(kube) as h:
            for i in range(12):
                pod = kube.put("Pod", gpu_pod(f"p{i}", memory_mib=5000, cores=20))
                assert (await h.filter(pod, ["n1", "n2"]))["NodeNames"]
            first = ledger_snapshot(h.engine)
        async with serving(kube) as h2:  # a freshly started replica
            assert ledger_snapshot(h2.engine) == first
            pod = kube.put("Pod", gpu_pod("next", memory_mib=5000, cores=20))
            assert (await h2.filter(pod, ["n1", "n2"]))["NodeNames"]

    run(scenario)


def test_membership_rules_from_watch_events() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube) as h:
            pods = [kube.put("Pod", gpu_pod(f"p{i}", memory_mib=1000)) for i in range(4)]
            for pod in pods:
                await h.filter(pod, ["n1"])
            await h.settle()
            assert len(list(h.engine.state.ledger.pods())) == 4
            # Terminating: still counts.
            p0 = kube.pod("p0")
            p0["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            kube.put("Pod", p0)
            # Failed: released.
            p1 = kube.pod("p1")
            p1["status"] = {"phase": "Failed"}
            kube.put("Pod", p1)
            # Deleted: released.
            kube.delete("Pod", ("default", "p2"))
            await h.settle()
            assert sorted(e.name for e in h.engine.state.ledger.pods()) == ["p0", "p3"]
            # A delete the watch never delivered is repaired by the relist after a 410.
            kube.delete("Pod", ("default", "p3"), silent=True)
            kube.break_watches(410)
            for _ in range(200):  # up to 10 s: the relist follows a 0.2 s back-off
                await asyncio.sleep(0.05)
                if sorted(e.name for e in h.engine.state.ledger.pods()) == ["p0"]:
                    break
            assert sorted(e.name for e in h.engine.state.ledger.pods()) == ["p0"]
            assert h.engine.counters.relists["Pod"] >= 2

    run(scenario)


def test_node_updates_refresh_registration_b25() -> None:
    """B25: a node that stops advertising devices is no longer a candidate."""
    async def scenario() -> None:
        kube = cluster("n1", "n2")
        async with serving(kube) as h:
            n1 = kube.node("n1")
            n1["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[]"
            kube.put("Node", n1)
            n2 = kube.node("n2")
            del n2["metadata"]["annotations"]["hami.io/node-nvidia-register"]
            kube.put("Node", n2)
            await h.settle()
            pod = kube.put("Pod", gpu_pod("share", memory_mib=1000))
            result = await h.filter(pod, ["n1", "n2"])
            assert result["FailedNodes"] == {"n1": "node unregistered", "n2": "node unregistered"}
            kube.put("Node", node("n1"))  # the device plugin registers again
            await h.settle()
            assert (await h.filter(pod, ["n1", "n2"]))["NodeNames"] == ["n1"]

    run(scenario)


def test_bind_lock_contention_and_dangling_owner_b01_b02() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        now = datetime.now(UTC)
        async with serving(kube) as h:
            holder = kube.put("Pod", gpu_pod("worker-123", namespace="team-x"))
            n1 = kube.node("n1")
            n1["metadata"]["annotations"]["hami.io/mutex.lock"] = f"{stamp(now)},team-x,worker-123"
            kube.put("Node", n1)
            pod = kube.put("Pod", gpu_pod("worker", namespace="team-x", memory_mib=4000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            result = await h.bind(pod, "n1")
            assert result["Error"].endswith("node lock contention")
            # B01: the failed bind released nothing that was not its own.
            assert kube.node("n1")["metadata"]["annotations"]["hami.io/mutex.lock"].endswith(
                ",team-x,worker-123")
            await h.settle()
            assert any(e["reason"] == "BindingFailed" for e in h.kube.events)
            # B02: the holder is deleted before Allocate: the lock is taken over at once.
            kube.delete("Pod", holder)
            result = await h.bind(pod, "n1")
            assert result["Error"] == ""
            assert kube.node("n1")["metadata"]["annotations"]["hami.io/mutex.lock"].endswith(
                ",team-x,worker")
            assert h.engine.locks.takeovers == 1

    run(scenario)


def _waiting_owner(kube: FakeKube, lock_age: timedelta, node_name: str = "n1") -> dict:
    """Pod ns1/pod-a bound to ``node_name`` and still waiting for Allocate (bind-phase
    allocating), holding n1's lock written ``lock_age`` ago."""
    a = gpu_pod("pod-a", namespace="ns1", memory_mib=1000, annotations={
        "hami.io/vgpu-node": node_name, "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1"})
    a["spec"]["nodeName"] = node_name
    a = kube.put("Pod", a)
    n1 = kube.node("n1")
    n1["metadata"]["annotations"]["hami.io/mutex.lock"] = (
        f"{stamp(datetime.now(UTC) - lock_age)},ns1,pod-a")
    kube.put("Node", n1)
    return a


@pytest.mark.parametrize("finish", ["success", "failed", "deleted", "running", "other node"])
def test_expired_lock_is_not_taken_from_a_pod_waiting_for_allocate(finish: str) -> None:
    """Issue 11 item 7: pod A's lock is past --node-lock-timeout but A's Allocate has not
    come yet: B's bind is refused with contention (and released nothing) until A is done
    allocating, gone or elsewhere; then B takes the lock over."""
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube) as h:
            a = _waiting_owner(kube, timedelta(minutes=6))
            b = kube.put("Pod", gpu_pod("pod-b", namespace="ns2", memory_mib=3000))
            assert (await h.filter(b, ["n1"]))["NodeNames"] == ["n1"]
            result = await h.bind(b, "n1")
            assert result["Error"].endswith("node lock contention"), result
            assert kube.node("n1")["metadata"]["annotations"]["hami.io/mutex.lock"].endswith(
                ",ns1,pod-a")
            assert not kube.pod("pod-b", "ns2")["spec"].get("nodeName")
            assert h.engine.locks.takeovers == 0
            if finish == "deleted":
                kube.delete("Pod", a)
            elif finish == "running":
                kube.put("Pod", {**a, "status": {"phase": "Running"}})
            elif finish == "other node":
                kube.put("Pod", {**a, "spec": {**a["spec"], "nodeName": "n2"}})
            else:
                a["metadata"]["annotations"]["hami.io/bind-phase"] = finish
                kube.put("Pod", a)
            assert (await h.bind(b, "n1"))["Error"] == ""
            assert kube.node("n1")["metadata"]["annotations"]["hami.io/mutex.lock"].endswith(
                ",ns2,pod-b")
            assert kube.pod("pod-b", "ns2")["spec"]["nodeName"] == "n1"
            assert h.engine.locks.takeovers == 1

    run(scenario)


def test_expired_lock_wait_is_bounded_and_legacy_locks_expire() -> None:
    """A lock whose owner stays 'allocating' is taken over once older than 6 lock
    timeouts; a lock naming no owner expires after one timeout, as in HAMi."""
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube) as h:
            _waiting_owner(kube, timedelta(minutes=29))
            b = kube.put("Pod", gpu_pod("pod-b", namespace="ns2", memory_mib=3000))
            await h.filter(b, ["n1"])
            assert (await h.bind(b, "n1"))["Error"].endswith("node lock contention")
            _waiting_owner(kube, timedelta(minutes=31))  # A never got its Allocate
            assert (await h.bind(b, "n1"))["Error"] == ""
            assert h.engine.locks.takeovers == 1
            n1 = kube.node("n1")
            n1["metadata"]["annotations"]["hami.io/mutex.lock"] = stamp(
                datetime.now(UTC) - timedelta(minutes=6))
            kube.put("Node", n1)
            c = kube.put("Pod", gpu_pod("pod-c", namespace="ns2", memory_mib=1000))
            await h.filter(c, ["n1"])
            assert (await h.bind(c, "n1"))["Error"] == ""
            assert h.engine.locks.takeovers == 2

    run(scenario)


def test_bind_waits_for_a_released_lock() -> None:
    async def scenario() -> None:
        kube = cluster("n1")
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=5)) as h:
            a, b = (kube.put("Pod", gpu_pod(n, memory_mib=1000)) for n in ("a", "b"))
            for pod in (a, b):
                await h.filter(pod, ["n1"])
            assert (await h.bind(a, "n1"))["Error"] == ""

            async def allocate_later() -> None:
                await asyncio.sleep(0.3)
                await kube.patch_node("n1", {"metadata": {"annotations": {"hami.io/mutex.lock": None}}})

            task = asyncio.create_task(allocate_later())
            assert (await h.bind(b, "n1"))["Error"] == ""
            await task

    run(scenario)


def test_follower_does_not_decide() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1"), leader_elect=True) as h:
            pod = h.kube.put("Pod", gpu_pod("p", memory_mib=1000))
            assert "not the leader" in (await h.filter(pod, ["n1"]))["Error"]
            assert "not the leader" in (await h.bind(pod, "n1"))["Error"]
            assert (await h.client.get("/readyz")).status == 503
            assert (await h.client.get("/healthz")).status == 200
            await h.engine.set_leader(True)
            assert (await h.client.get("/readyz")).status == 200
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]

    run(scenario)


def _review(pod: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "object": pod}}


def test_webhook_mutates_denies_and_ignores() -> None:
    async def scenario() -> None:
        async with serving(cluster()) as h:
            pod = gpu_pod("w")
            pod["spec"]["schedulerName"] = "default-scheduler"
            reply = await h.post("/webhook", _review(pod))
            resp = reply["response"]
            assert resp["uid"] == "r1" and resp["allowed"] and resp["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(resp["patch"]))
            assert {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"} in patch
            pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
            resp = (await h.post("/webhook", _review(pod)))["response"]
            assert not resp["allowed"] and resp["status"]["code"] == 403
            assert resp["status"]["message"] == "container main is privileged"
            plain = {"metadata": {"name": "x"}, "spec": {"schedulerName": "default-scheduler",
                                                         "containers": [{"name": "c"}]}}
            resp = (await h.post("/webhook", _review(plain)))["response"]
            assert resp["allowed"] and "patch" not in resp

    run(scenario)


def test_filter_repeats_the_webhook_s_isolation_checks() -> None:
    """A GPU pod that never met the webhook (issue 12 §3: a label opted it out) is refused
    by /filter with the webhook's own message; nothing is charged or written."""
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            before = ledger_snapshot(h.engine)
            attacks = []
            for i, change in enumerate([
                    {"hostPID": True},
                    {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                     "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0",
                                              "value": "80g"}]}]},
                    {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                     "volumeMounts": [{"name": "v",
                                                       "mountPath": "/etc//ld.so.preload"}]}]},
                    {"containers": [{"name": "main", "image": "x",
                                     "securityContext": {"privileged": True},
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}]):
                pod = gpu_pod(f"evil-{i}", memory_mib=1000)
                pod["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
                pod["spec"].update(change)
                attacks.append(pod)
            for pod in attacks:
                live = h.kube.put("Pod", pod)
                webhook = (await h.post("/webhook", _review(pod)))["response"]
                assert not webhook["allowed"]
                result = await h.filter(live, ["n1"])
                assert result["Error"] == webhook["status"]["message"], result
                assert result["NodeNames"] is None
                name = pod["metadata"]["name"]
                assert "hami.io/vgpu-node" not in h.kube.pod(name)["metadata"]["annotations"]
            assert ledger_snapshot(h.engine) == before
            await h.settle()
            assert not [e for e in h.kube.events if e["reason"] == "FilteringSucceed"]

    run(scenario)


def test_leader_election_hands_over() -> None:
    """On one clock the test moves (on the wall clock, a stall of a second between two
    ticks of a loaded machine let the lease expire where the test wants it held)."""
    async def scenario() -> None:
        kube = FakeKube()
        changes: list[tuple[str, bool]] = []
        clock = [datetime(2026, 12, 6, 23, 59, 59, 900000, tzinfo=UTC)]

        def elector(identity: str) -> LeaderElector:
            settings = SETTINGS.__class__(identity=identity,
                                          leader_elect_lease_duration=timedelta(seconds=1),
                                          leader_elect_renew_deadline=timedelta(seconds=0.5),
                                          leader_elect_retry_period=timedelta(seconds=0.1))

            async def on_change(leader: bool) -> None:
                changes.append((identity, leader))
            return LeaderElector(kube, settings, on_change, now=lambda: clock[0])

        a, b = elector("a"), elector("b")
        await a.tick()
        clock[0] += timedelta(seconds=0.999)  # still a's (across midnight)
        await b.tick()
        assert a.leader and not b.leader and b.holder == "a"
        clock[0] += timedelta(seconds=0.2)  # a stops renewing (killed): 1.199 s since
        await b.tick()
        assert b.leader
        await a.tick()
        assert not a.leader  # the old leader steps down when it sees the new holder
        await b.release()
        await a.tick()
        assert a.leader
        assert changes == [("a", True), ("b", True), ("a", False), ("a", True)]

    run(scenario)


def test_tls_pair_is_reloaded(tmp_path) -> None:
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("t")
    cert, key = ca.issue("one", ip_sans=["127.0.0.1"], server=True).write(tmp_path, "s")
    tls = TlsReloader(str(cert), str(key))
    assert not tls.maybe_reload()
    import os
    import time

    ca.issue("two", ip_sans=["127.0.0.1"], server=True).write(tmp_path, "s")
    later = time.time() + 5
    os.utime(cert, (later, later))
    assert tls.maybe_reload() and tls.reloads == 2
    cert.write_text("garbage")
    os.utime(cert, (later + 5, later + 5))
    assert not tls.maybe_reload()  # a broken pair keeps the old one
    assert isinstance(tls.context, ssl.SSLContext)


def test_tls_reload_serves_the_new_certificate(tmp_path) -> None:
    """A live HTTPS server picks up a rewritten pair for new connections."""
    import os
    import time

    from aiohttp import web

    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("t")
    cert, key = ca.issue("first", ip_sans=["127.0.0.1"], server=True).write(tmp_path, "s")
    tls = TlsReloader(str(cert), str(key))

    def peer_cn(port: int) -> str:
        pem = ssl.get_server_certificate(("127.0.0.1", port))
        from cryptography import x509

        return x509.load_pem_x509_certificate(pem.encode()).subject.rfc4514_string()

    async def scenario() -> None:
        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
        await site.start()
        port = runner.addresses[0][1]
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, peer_cn, port) == "CN=first"
        ca.issue("second", ip_sans=["127.0.0.1"], server=True).write(tmp_path, "s")
        later = time.time() + 5
        os.utime(cert, (later, later))
        assert tls.maybe_reload()
        assert await loop.run_in_executor(None, peer_cn, port) == "CN=second"
        await runner.cleanup()

    run(scenario)


def test_failure_token_events_and_role_label() -> None:
    from hami.scheduler.engine import failure_tokens

    assert failure_tokens({"a": "1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted",
                           "b": "4/4 CardInsufficientMemory", "c": "node unregistered"}) == {
        "CardInsufficientMemory": ["a", "b"], "CardTimeSlicingExhausted": ["a"]}

    async def scenario() -> None:
        kube = cluster("n1", "n2")
        kube.put("Pod", gpu_pod("hami-0", namespace="kube-system"))
        async with serving(kube, leader_elect=True, pod_name="hami-0",
                           pod_namespace="kube-system") as h:
            await h.engine.set_leader(True)
            pod = kube.put("Pod", gpu_pod("big", memory_mib=999999))
            await h.filter(pod, ["n1", "n2"])
            await h.settle()
            messages = [e["message"] for e in kube.events if e["reason"] == "FilteringFailed"]
            assert messages == ["2 nodes CardInsufficientMemory(n1,n2)",
                                "no available node, 2 nodes do not meet"]
            labels = kube.pod("hami-0", "kube-system")["metadata"].get("labels", {})
            assert labels["hami.io/scheduler-role"] == "leader"

    run(scenario)


def test_unknown_policy_annotations_fall_back_to_the_configured_policy_with_an_event() -> None:
    """Issue 11 item 5: a pod that bypassed the webhook with unknown policy annotations is
    placed by the configured policies (GPU binpack here; HAMi falls back to spread) and a
    Warning event per annotation says so."""
    allocated = "hami.io/vgpu-devices-allocated"

    async def scenario() -> None:
        async with serving(cluster("n1"), gpu_scheduler_policy="binpack") as h:
            first = h.kube.put("Pod", gpu_pod("first", memory_mib=1000))
            assert (await h.filter(first, ["n1"]))["NodeNames"] == ["n1"]
            odd = h.kube.put("Pod", gpu_pod("odd", memory_mib=1000, annotations={
                "hami.io/gpu-scheduler-policy": "bogus",
                "hami.io/node-scheduler-policy": "sideways"}))
            assert (await h.filter(odd, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            ann = {name: h.kube.pod(name)["metadata"]["annotations"] for name in ("first", "odd")}
            assert ann["odd"][allocated] == ann["first"][allocated]  # binpack: the used card
            warned = [e for e in h.kube.events if e["reason"] == "UnknownSchedulerPolicy"]
            assert [(e["type"], e["involvedObject"]["name"]) for e in warned] == [
                ("Warning", "odd"), ("Warning", "odd")]
            node_msg, gpu_msg = (e["message"] for e in warned)
            assert node_msg.startswith("unknown hami.io/node-scheduler-policy value 'sideways'")
            assert node_msg.endswith("the configured node policy 'binpack' was used")
            assert gpu_msg.startswith("unknown hami.io/gpu-scheduler-policy value 'bogus'; "
                                      "valid values: spread, binpack, topology-aware")
            assert gpu_msg.endswith("the configured GPU policy 'binpack' was used")
            reasons = [e["reason"] for e in h.kube.events]
            assert reasons.count("FilteringSucceed") == 2

    run(scenario)
