"""The periodic registration pass (every ``--register-interval``, HAMi v2.10) runs the
health check on every node each time but reads a node's devices again only when its
cached object changed: decoding every node's register annotation every 15 s was a
measurable share of the scheduler's CPU at 1,000 nodes (docs/performance.md). What the
pass decides must not change: a changed node is re-read, a node whose health lapses with
an unchanged object still leaves, and one removed meanwhile comes back."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from hami.core.codec import encode_handshake
from hami.scheduler.engine import Engine

from .fake_kube import FakeKube
from .support import SETTINGS, gpu_pod, node, run


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _counting(engine: Engine) -> list[str]:
    calls: list[str] = []
    upsert = engine.state.upsert_node

    def counted(obj: Any, **kw: Any) -> str:
        calls.append(obj["metadata"]["name"])
        return upsert(obj, **kw)

    engine.state.upsert_node = counted  # type: ignore[method-assign]
    return calls


def test_unchanged_nodes_are_not_decoded_again_and_changed_ones_are() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        for i in range(3):
            kube.put("Node", node(f"n{i}"))
        engine = Engine(SETTINGS, kube)
        await engine.start()
        try:
            await _settle()  # the handshakes written at the first pass come back
            calls = _counting(engine)
            for _ in range(3):
                engine.register_all()
            assert calls == []  # re-read each pass before: 9 decodes
            assert sorted(engine.state.ledger.node_names()) == ["n0", "n1", "n2"]
            placed = engine.state.filter(gpu_pod("p", memory_mib=1000), ["n0", "n1", "n2"])
            assert placed.result.node in {"n0", "n1", "n2"}

            changed = node("n1", gpus=2)  # the device plugin re-registered two GPUs
            changed["metadata"]["annotations"].update(
                {k: v for k, v in kube.node("n1")["metadata"]["annotations"].items()
                 if k == "hami.io/node-handshake"})
            kube.put("Node", changed)
            await _settle()
            engine.register_all()
            assert calls == ["n1"]  # re-read at its event, not again by the pass
            entry = engine.state.ledger.node("n1")
            assert entry is not None and len(entry.devices) == 2
        finally:
            await engine.stop()

    run(scenario)


def test_health_still_checked_every_pass_and_removed_nodes_come_back() -> None:
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    clock = [t0 + timedelta(seconds=10)]

    async def scenario() -> None:
        kube = FakeKube()
        quiet = node("quiet")
        quiet["status"]["allocatable"] = {}  # no GPU count: the handshake alone decides
        quiet["metadata"]["annotations"]["hami.io/node-handshake"] = encode_handshake(t0)
        kube.put("Node", quiet)
        kube.put("Node", node("n1"))
        engine = Engine(SETTINGS, kube, local_now=lambda: clock[0])
        await engine.start()
        try:
            await _settle()
            assert engine.state.ledger.node("quiet") is not None
            clock[0] = t0 + timedelta(seconds=70)  # the handshake went unanswered
            engine.register_all()
            assert engine.state.ledger.node("quiet") is None
            assert "did not answer" in engine.node_reasons["quiet"]

            engine.state.remove_node("n1")  # left the ledger by any other way
            engine.register_all()
            entry = engine.state.ledger.node("n1")
            assert entry is not None and len(entry.devices) == 4
        finally:
            await engine.stop()

    run(scenario)
