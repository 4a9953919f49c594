"""Operators can see what the scheduler decided: one structured line per filter, bind and
admission denial at the default verbosity, per-node detail at -v 4 (issue 14 §3)."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import replace
from datetime import timedelta

import pytest

from hami.logs import setup_logging
from hami.scheduler.server import serve

from .fake_kube import FakeKube
from .support import SETTINGS, gpu_pod, node, run, serving


def lines(stream: io.StringIO, logger: str = "hami.scheduler.decisions") -> list[str]:
    return [line for line in stream.getvalue().splitlines() if f"logger={logger}" in line]


@pytest.fixture
def captured() -> io.StringIO:
    stream = io.StringIO()
    setup_logging(0, False, "keyvalue", stream)
    yield stream
    setup_logging(0, False, "keyvalue", io.StringIO())


def _review(pod: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "namespace": "team", "object": pod}}


def test_filter_bind_and_denial_are_logged_at_default_verbosity(captured: io.StringIO) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        kube.put("Node", node("n1"))
        async with serving(kube, node_lock_retry_timeout=timedelta(seconds=0)) as h:
            small = kube.put("Pod", gpu_pod("small", memory_mib=1000, cores=30))
            big = kube.put("Pod", gpu_pod("big", memory_mib=999999))
            await h.filter(small, ["n1"])
            await h.filter(big, ["n1", "ghost"])
            await h.bind(small, "n1")
            bad = gpu_pod("priv")
            bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
            await h.post("/webhook", _review(bad))

    run(scenario)
    got = lines(captured)
    assert len(got) == 4, captured.getvalue()
    placed, unschedulable, bound, denied = got
    assert "msg=filter pod=default/small result=placed node=n1" in placed
    assert "devices=GPU-n1-" in placed and ",NVIDIA,1000,30:;" in placed
    assert "result=unschedulable" in unschedulable and "pod=default/big" in unschedulable
    assert 'reasons="1 nodes: 4/4 CardInsufficientMemory; 1 nodes: node unregistered"' \
        in unschedulable
    assert "msg=bind pod=default/small node=n1 result=bound" in bound
    assert "lock_wait_ms=" in bound
    assert 'msg="admission denied" pod=team/priv code=403' in denied
    assert 'reason="container main is privileged"' in denied
    assert "filter node" not in captured.getvalue()  # per-node detail needs -v 4
    assert all(" level=info " in line for line in got)


def test_v4_adds_per_node_detail_and_json_format() -> None:
    stream = io.StringIO()
    setup_logging(4, False, "json", stream)
    try:
        async def scenario() -> None:
            kube = FakeKube()
            kube.put("Node", node("n1"))
            async with serving(kube) as h:
                big = kube.put("Pod", gpu_pod("big", memory_mib=999999))
                await h.filter(big, ["n1", "ghost"])

        run(scenario)
    finally:
        setup_logging(0, False, "keyvalue", io.StringIO())
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    mine = [r for r in records if r["logger"] == "hami.scheduler.decisions"]
    assert [r["msg"] for r in mine] == ["filter", "filter node", "filter node"]
    assert {(r["node"], r["reason"]) for r in mine[1:]} == {
        ("n1", "4/4 CardInsufficientMemory"), ("ghost", "node unregistered")}
    assert mine[1]["level"] == "debug" and mine[0]["result"] == "unschedulable"


def test_start_up_lines_are_info() -> None:
    stream = io.StringIO()
    setup_logging(0, False, "keyvalue", stream)
    try:
        async def scenario() -> None:
            stop = asyncio.Event()
            settings = replace(SETTINGS, http_bind="127.0.0.1:0", metrics_bind_address="")
            await serve(settings, kube=FakeKube(), stop=stop, started=lambda _: stop.set())

        run(scenario)
    finally:
        setup_logging(0, False, "keyvalue", io.StringIO())
    start = [line for line in stream.getvalue().splitlines() if "serving on" in line]
    assert len(start) == 1 and " level=info " in start[0], stream.getvalue()
    assert "level=warning" not in stream.getvalue(), stream.getvalue()
