"""``/filter`` and ``/bind`` decide on the scheduler's own view of a pod, never on the
request body (issue 12 §1): the attacker's requests go through the real aiohttp app."""

from __future__ import annotations

import copy

from hami.core.codec import decode_pod_devices

from .fake_kube import FakeKube
from .support import gpu_pod, ledger_snapshot, node, run, serving

ALLOCATED = "hami.io/vgpu-devices-allocated"


def cluster(*names: str) -> FakeKube:
    kube = FakeKube()
    for name in names:
        kube.put("Node", node(name))
    return kube


def forged(pod: dict, memory_mib: int) -> dict:
    """The same name and UID with a bigger request in the body."""
    body = copy.deepcopy(pod)
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = str(memory_mib)
    return body


def test_forged_body_is_decided_on_the_real_pod() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", gpu_pod("small", memory_mib=1000))
            result = await h.filter(forged(pod, 24000), ["n1"])
            assert result["NodeNames"] == ["n1"]
            await h.settle()
            [[device]] = decode_pod_devices(h.kube.pod("small")["metadata"]["annotations"][ALLOCATED])
            assert device.used_memory_mib == 1000

    run(scenario)


def test_pod_not_yet_seen_by_the_watch_is_read_from_the_api() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", gpu_pod("fresh", memory_mib=2000))
            h.engine.pending.apply(pod, deleted=True)  # the watch is behind
            result = await h.filter(forged(pod, 24000), ["n1"])
            assert result["NodeNames"] == ["n1"], result
            await h.settle()
            [[device]] = decode_pod_devices(h.kube.pod("fresh")["metadata"]["annotations"][ALLOCATED])
            assert device.used_memory_mib == 2000

    run(scenario)


def test_running_pod_of_another_namespace_cannot_be_rewritten() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            victim = h.kube.put("Pod", gpu_pod("victim", memory_mib=20000, namespace="team-b"))
            assert (await h.filter(victim, ["n1"]))["NodeNames"] == ["n1"]
            assert (await h.bind(victim, "n1"))["Error"] == ""
            await h.settle()
            before = copy.deepcopy(h.kube.pod("victim", "team-b")["metadata"]["annotations"])
            snapshot = ledger_snapshot(h.engine)
            result = await h.filter(forged(victim, 1), ["n1"])
            assert result["Error"] and "not waiting for scheduler" in result["Error"]
            await h.settle()
            assert h.kube.pod("victim", "team-b")["metadata"]["annotations"] == before
            assert ledger_snapshot(h.engine) == snapshot

    run(scenario)


def test_unknown_uids_leave_no_charge_and_no_pending_patch() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            real = h.kube.put("Pod", gpu_pod("real", memory_mib=1000))
            snapshot = ledger_snapshot(h.engine)
            for i in range(300):
                ghost = copy.deepcopy(real)
                ghost["metadata"].update(name=f"ghost-{i}", uid=f"ghost-uid-{i}")
                result = await h.filter(ghost, ["n1"])
                assert "does not exist" in result["Error"]
            other_uid = copy.deepcopy(real)
            other_uid["metadata"]["uid"] = "recreated"  # right name, wrong UID
            assert "does not exist" in (await h.filter(other_uid, ["n1"]))["Error"]
            no_uid = copy.deepcopy(real)
            del no_uid["metadata"]["uid"]
            assert "no pod UID" in (await h.filter(no_uid, ["n1"]))["Error"]
            await h.settle()
            assert ledger_snapshot(h.engine) == snapshot
            assert h.engine._pending_patch == {}
            assert h.engine.counters.unknown_pods == 302
            assert "patch pod" not in h.kube.calls

    run(scenario)


def test_pod_of_another_scheduler_is_refused() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = gpu_pod("other", memory_mib=1000)
            pod["spec"]["schedulerName"] = "default-scheduler"
            pod = h.kube.put("Pod", pod)
            result = await h.filter(pod, ["n1"])
            assert "not waiting for scheduler 'hami-scheduler'" in result["Error"]

    run(scenario)


def test_bind_only_what_this_scheduler_filtered() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1", "n2")) as h:
            never = h.kube.put("Pod", gpu_pod("never-filtered", memory_mib=1000, namespace="x"))
            no_uid = {**never, "metadata": {**never["metadata"], "uid": ""}}
            assert "no pod UID" in (await h.bind(no_uid, "n1"))["Error"]
            assert "was not filtered" in (await h.bind(never, "n1"))["Error"]
            placed = h.kube.put("Pod", gpu_pod("placed", memory_mib=1000))
            [target] = (await h.filter(placed, ["n1", "n2"]))["NodeNames"]
            elsewhere = "n2" if target == "n1" else "n1"
            assert f"was placed on node {target}" in (await h.bind(placed, elsewhere))["Error"]
            assert "bind" not in h.kube.calls
            assert not h.kube.pod("never-filtered", "x")["spec"].get("nodeName")
            assert (await h.bind(placed, target))["Error"] == ""
            assert h.kube.pod("placed")["spec"]["nodeName"] == target

    run(scenario)


def test_bind_carries_the_uid_precondition() -> None:
    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", gpu_pod("p", memory_mib=1000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            # The pod is deleted and recreated under the same name before the bind.
            h.kube.delete("Pod", ("default", "p"), silent=True)
            again = gpu_pod("p", memory_mib=1000)
            again["metadata"]["uid"] = "second-life"
            h.kube.put("Pod", again)
            result = await h.bind(pod, "n1")
            assert "immutable" in result["Error"] or "Precondition failed" in result["Error"]
            assert not h.kube.pod("p")["spec"].get("nodeName")
            assert "hami.io/bind-phase" not in h.kube.pod("p")["metadata"]["annotations"]

    run(scenario)


def test_failed_filter_patch_is_forgotten_after_its_ttl(monkeypatch) -> None:
    import asyncio

    from hami.kube import KubeError
    from hami.scheduler import filterflow

    monkeypatch.setattr(filterflow, "PENDING_PATCH_TTL_S", 0.2)

    async def scenario() -> None:
        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", gpu_pod("unlucky", memory_mib=1000))
            h.kube.fail["patch pod"] = KubeError(500, "etcd is sad")
            started = asyncio.get_running_loop().time()
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            assert list(h.engine._pending_patch) == ["uid-default-unlucky"]
            # forgotten once its TTL has passed: waited for, not slept for (the TTL's
            # timer starts when the failed patch's callback runs, which a loaded
            # machine may delay)
            loop = asyncio.get_running_loop()
            while h.engine._pending_patch:
                assert loop.time() - started < 30, "the failed patch was never forgotten"
                await asyncio.sleep(0.02)
            assert loop.time() - started >= 0.2 * 0.9  # not before its TTL

    run(scenario)


def _non_loopback_address() -> str | None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_extender_answers_loopback_peers_only() -> None:
    import pytest
    from aiohttp import ClientSession

    from hami.netlimits import is_loopback
    from hami.scheduler.routes import build_app

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.5")
    assert not is_loopback("10.0.0.7") and not is_loopback(None) and not is_loopback("")
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call from")

    async def scenario() -> None:
        from aiohttp import web

        async with serving(cluster("n1")) as h:
            pod = h.kube.put("Pod", gpu_pod("p", memory_mib=1000))
            runner = web.AppRunner(build_app(h.engine, h.engine.settings))
            await runner.setup()
            site = web.TCPSite(runner, "0.0.0.0", 0)
            await site.start()
            port = runner.addresses[0][1]
            try:
                async with ClientSession() as session:
                    body = {"Pod": pod, "NodeNames": ["n1"]}
                    remote = await session.post(f"http://{address}:{port}/filter", json=body)
                    assert remote.status == 403
                    assert "loopback" in (await remote.json())["Error"]
                    bind = await session.post(f"http://{address}:{port}/bind", json={
                        "PodName": "p", "PodNamespace": "default",
                        "PodUID": pod["metadata"]["uid"], "Node": "n1"})
                    assert bind.status == 403
                    status = await session.get(f"http://{address}:{port}/status")
                    assert status.status == 403
                    webhook = await session.post(f"http://{address}:{port}/webhook", data=b"{}")
                    assert webhook.status == 200  # the API server's path stays open
                    health = await session.get(f"http://{address}:{port}/healthz")
                    assert health.status == 200
                    local = await session.post(f"http://127.0.0.1:{port}/filter", json=body)
                    assert local.status == 200 and (await local.json())["NodeNames"] == ["n1"]
                assert "patch pod" in h.kube.calls and h.engine.counters.remote_refused == 3
            finally:
                await runner.cleanup()

    run(scenario)


def test_filter_signs_what_it_writes(tmp_path) -> None:
    from hami.core.provenance import SIGNATURE, verify

    (tmp_path / "current").write_text("k" * 64)

    async def scenario() -> None:
        async with serving(cluster("n1"), allocation_key_dir=str(tmp_path)) as h:
            pod = h.kube.put("Pod", gpu_pod("signed", memory_mib=1000))
            assert (await h.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            await h.settle()
            ann = h.kube.pod("signed")["metadata"]["annotations"]
            assert ann[SIGNATURE].startswith("v1:")
            verify([b"k" * 64], pod["metadata"]["uid"], "n1", ann)

    run(scenario)
