"""``hami simulate --priority qos``: the timeline replay, on traces small enough to work
out by hand, and that its preemption is the extender's own function."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import hami.core.preemption as core_preemption
import hami.scheduler.preemptflow as preemptflow
from hami.core.preemption import PreemptionOutcome
from hami.core.state import ClusterState
from hami.sim import priority as sim_priority
from hami.sim.priority import (
    QOS_PRIORITY,
    PriorityReplay,
    PriorityTraceError,
    nearest_rank,
    replay_priority,
    timed_pods,
)
from hami.sim.replay import workload_distribution
from hami.sim.trace import TraceNode, TracePod, load_pods

ONE_CARD = [TraceNode("n0", 64000, 262144, 1, "T4")]
TWO_CARDS = [TraceNode("n0", 64000, 262144, 2, "T4")]


def pod(name: str, qos: str, created: int, deleted: int, gpu_milli: int = 1000,
        num_gpu: int = 1, scheduled: int | None = None, cpu_milli: int = 1000) -> TracePod:
    return TracePod(name, cpu_milli, 1024, num_gpu if gpu_milli else 0, gpu_milli, (), qos,
                    created, deleted, scheduled)


def run(nodes: list[TraceNode], pods: list[TracePod], preemption: bool,
        policy: str = "binpack/binpack") -> sim_priority.PriorityResult:
    return replay_priority(nodes, timed_pods(pods), policy, workload_distribution(pods),
                           preemption=preemption)


def test_be_fills_the_card_ls_waits_without_and_evicts_with_preemption() -> None:
    # BE holds the only card 0..100; LS arrives at 10 and runs 20 s.
    pods = [pod("be", "BE", 0, 100, scheduled=0), pod("ls", "LS", 10, 30)]
    off = run(ONE_CARD, pods, preemption=False)
    assert off.ls_pending_s == (90,)  # placed at 100, when BE leaves
    assert (off.be_evicted, off.ls_never_placed, off.preemptions) == (0, 0, 0)
    assert off.allocation_percent == pytest.approx(100.0)  # the card busy over 0..100
    on = run(ONE_CARD, pods, preemption=True)
    assert on.ls_pending_s == (0,)
    assert (on.be_evicted, on.preemptions, on.ls_never_placed) == (1, 1, 0)
    assert on.never_placed == {}  # the re-created BE pod runs once LS has left
    assert on.span_s == 100


def test_an_evicted_pod_starts_over() -> None:
    # With preemption BE is evicted at 10 and re-created; it runs from 30 (LS gone) for
    # its whole 100 s, to 130. A second LS pod at 120 evicts it again (were the rest of
    # its run kept, it would have left at 120).
    pods = [pod("be", "BE", 0, 100), pod("ls", "LS", 10, 30), pod("ls2", "LS", 120, 125)]
    on = run(ONE_CARD, pods, preemption=True)
    assert on.be_evicted == 2 and on.ls_pending_s == (0, 0)
    off = run(ONE_CARD, pods, preemption=False)
    assert off.be_evicted == 0 and off.ls_pending_s == (0, 90)


def test_only_the_needed_victim_is_evicted() -> None:
    # Two BE pods, one per card; LS needs one card: the later-started BE goes (the
    # earlier one is more important and put back first), the other keeps running.
    pods = [pod("be-a", "BE", 0, 100), pod("be-b", "BE", 5, 100), pod("ls", "LS", 10, 50)]
    replay = PriorityReplay(TWO_CARDS, "binpack/binpack", workload_distribution(pods),
                            preemption=True)
    timed = timed_pods(pods)
    seen: list[set[str]] = []
    original = replay._schedule

    def watch(queue: list, now: int) -> list:
        out = original(queue, now)
        seen.append(set(replay.running))
        return out
    replay._schedule = watch  # type: ignore[method-assign]
    result = replay.run(timed)
    assert result.be_evicted == 1
    assert seen[2] == {"be-a", "ls"}  # at t=10: be-b evicted, its re-creation queued


def test_a_mig_card_is_freed_for_the_preemptor() -> None:
    # 80 % of a MIG-mode A100 each: one MIG instance of the card holds one of them.
    nodes = [TraceNode("m0", 64000, 262144, 1, "A100-40GB", "mig")]
    pods = [pod("be", "BE", 0, 100, gpu_milli=800), pod("ls", "LS", 10, 30, gpu_milli=800)]
    assert run(nodes, pods, preemption=False).ls_pending_s == (90,)
    on = run(nodes, pods, preemption=True)
    assert on.ls_pending_s == (0,) and on.be_evicted == 1 and on.never_placed == {}


def test_equal_priority_never_preempts() -> None:
    pods = [pod("ls-a", "LS", 0, 100), pod("ls-b", "LS", 10, 30)]
    on = run(ONE_CARD, pods, preemption=True)
    assert on.ls_pending_s == (0, 90) and on.be_evicted == 0 and on.preemptions == 0


def test_nothing_is_evicted_for_a_pod_that_fits_nowhere_anyway() -> None:
    # Two GPUs on a one-card cluster: no eviction can help.
    pods = [pod("be", "BE", 0, 100), pod("ls", "LS", 10, 30, num_gpu=2)]
    on = run(ONE_CARD, pods, preemption=True)
    assert on.be_evicted == 0 and on.ls_never_placed == 1 and on.ls_pending_s == ()


def test_cpu_only_pods_do_not_preempt() -> None:
    nodes = [TraceNode("n0", 4000, 262144, 1, "T4")]
    pods = [pod("be", "BE", 0, 100, gpu_milli=0, cpu_milli=4000),
            pod("ls", "LS", 10, 30, gpu_milli=0, cpu_milli=4000)]
    on = run(nodes, pods, preemption=True)
    assert on.be_evicted == 0 and on.ls_pending_s == (90,)


def test_burstable_and_guaranteed_are_high_priority() -> None:
    assert QOS_PRIORITY == {"LS": 1000, "Guaranteed": 1000, "Burstable": 1000, "BE": 0}
    pods = [pod("be", "BE", 0, 100), pod("b", "Burstable", 10, 30)]
    assert run(ONE_CARD, pods, preemption=True).be_evicted == 1


def test_shared_cards_and_allocation_over_the_span() -> None:
    # 300 milli for 50 s and 500 milli for 100 s on one card: (300*50 + 500*100) /
    # (1000*100) = 65 %; both fit side by side, nobody waits.
    pods = [pod("a", "LS", 0, 50, gpu_milli=300), pod("b", "BE", 0, 100, gpu_milli=500)]
    off = run(ONE_CARD, pods, preemption=False)
    assert off.allocation_percent == pytest.approx(65.0)
    assert off.ls_pending_s == (0,)


def test_the_run_time_counts_from_the_traces_schedule() -> None:
    # Created at 0, scheduled at 40, deleted at 100: it runs 60 s once placed.
    pods = [pod("be", "BE", 0, 100, scheduled=40), pod("ls", "LS", 0, 10)]
    off = run(ONE_CARD, pods, preemption=False)  # LS first (priority), then BE 10..70
    assert off.ls_pending_s == (0,)
    assert off.allocation_percent == pytest.approx(70.0)  # 0..10 LS + 10..70 BE


def test_the_simulator_preempts_with_the_extenders_function(monkeypatch) -> None:
    assert sim_priority.preemption.plan_preemption is core_preemption.plan_preemption
    assert preemptflow.plan_preemption is core_preemption.plan_preemption
    calls: list[tuple[ClusterState, int]] = []
    real = core_preemption.plan_preemption

    def spy(state, pod, infos, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((state, pod["spec"]["priority"]))
        return real(state, pod, infos, *args, **kwargs)
    monkeypatch.setattr(core_preemption, "plan_preemption", spy)
    pods = [pod("be", "BE", 0, 100), pod("ls", "LS", 10, 30)]
    assert run(ONE_CARD, pods, preemption=True).be_evicted == 1
    # The LS pod at 10, then the re-created BE pod (fits nowhere, nobody below it).
    assert [p for _, p in calls] == [1000, 0]
    assert isinstance(calls[0][0], ClusterState) and calls[0][0] is calls[1][0]
    # Its answer is what the simulator does: no plan, no eviction.
    monkeypatch.setattr(core_preemption, "plan_preemption",
                        lambda *a, **k: PreemptionOutcome(None))
    assert run(ONE_CARD, pods, preemption=True).ls_pending_s == (90,)


def test_skipping_blocked_shapes_changes_no_answer(monkeypatch) -> None:
    rng = random.Random(7)
    nodes = [TraceNode("n0", 32000, 131072, 2, "T4"), TraceNode("n1", 32000, 131072, 1, "T4")]
    pods = []
    for i in range(160):
        start = rng.randrange(0, 2000)
        milli = rng.choice([250, 500, 1000, 1000])
        pods.append(pod(f"p{i}", rng.choice(["LS", "BE", "BE"]), start,
                        start + rng.randrange(0, 400), gpu_milli=milli,
                        cpu_milli=rng.choice([1000, 8000])))
    for on in (False, True):
        for policy in ("binpack/binpack", "fragmentation-aware"):
            fast = run(nodes, pods, on, policy)
            monkeypatch.setattr(PriorityReplay, "_blocked", lambda *a: False)
            slow = run(nodes, pods, on, policy)
            monkeypatch.undo()
            assert (fast.ls_pending_s, fast.evicted, fast.never_placed,
                    fast.allocation_percent) == (slow.ls_pending_s, slow.evicted,
                                                 slow.never_placed, slow.allocation_percent)
            assert fast.ls_pending_s  # the trace does contend
            if on:
                assert fast.be_evicted > 0


def test_no_card_is_ever_booked_beyond_its_capacity() -> None:
    rng = random.Random(11)
    nodes = [TraceNode("n0", 64000, 262144, 2, "T4"), TraceNode("n1", 64000, 262144, 2, "T4")]
    pods = [pod(f"p{i}", rng.choice(["LS", "BE"]), (s := rng.randrange(0, 1500)),
                s + rng.randrange(1, 500), gpu_milli=rng.choice([200, 500, 700, 1000]))
            for i in range(200)]
    replay = PriorityReplay(nodes, "fragmentation-aware", workload_distribution(pods),
                            preemption=True)
    led = replay.replayer.ledger
    checked = [0]
    original = replay._schedule

    def check(queue: list, now: int) -> list:
        out = original(queue, now)
        n = led.size
        assert (led.used_memory_mib[:n] <= led.total_memory_mib[:n]).all()
        assert (led.used_cores[:n] <= led.total_cores[:n]).all()
        assert (led.used_slots[:n] <= led.split_count[:n]).all()
        assert set(replay.running) == {e.uid for node in ("n0", "n1")
                                       for e in led.pods_on(node)}
        checked[0] += 1
        return out
    replay._schedule = check  # type: ignore[method-assign]
    result = replay.run(timed_pods(pods))
    assert checked[0] > 100 and result.be_evicted > 0


def test_a_recreated_pod_never_takes_a_trace_pods_name() -> None:
    # A trace pod is already called "be-e1": the re-created "be" becomes "be-e2".
    pods = [pod("be", "BE", 0, 100), pod("be-e1", "BE", 200, 300), pod("ls", "LS", 10, 30)]
    replay = PriorityReplay(ONE_CARD, "binpack/binpack", workload_distribution(pods),
                            preemption=True)
    names: list[str] = []
    original = replay._start

    def start(job, now: int) -> None:  # type: ignore[no-untyped-def]
        names.append(job.pod.name)
        original(job, now)
    replay._start = start  # type: ignore[method-assign]
    assert replay.run(timed_pods(pods)).be_evicted == 1
    assert names == ["be", "ls", "be-e2", "be-e1"]


def test_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (nearest_rank(values, 50), nearest_rank(values, 99), nearest_rank(values, 100)) \
        == (50, 99, 100)
    assert nearest_rank([7], 99) == 7 and nearest_rank([], 50) is None
    assert nearest_rank([1, 2, 3], 50) == 2


@pytest.mark.parametrize(("bad", "message"), [
    (TracePod("x", 1, 1, 1, 100, (), "LS", None, 5), "has no creation_time/deletion_time"),
    (TracePod("x", 1, 1, 1, 100, (), "LS", 5, None), "has no creation_time/deletion_time"),
    (TracePod("x", 1, 1, 1, 100, (), "", 0, 5), "qos '' is none of LS"),
    (TracePod("x", 1, 1, 1, 100, (), "Gold", 0, 5), "qos 'Gold'"),
    (TracePod("x", 1, 1, 1, 100, (), "BE", 10, 5), "deletion_time 5 is before its start 10"),
    (TracePod("x", 1, 1, 1, 100, (), "BE", 10, 50, 60), "deletion_time 50 is before"),
    (TracePod("x", 1, 1, 1, 100, (), "BE", 10, 50, 5), "starts before its creation_time"),
])
def test_bad_timelines_are_clear_errors(bad: TracePod, message: str) -> None:
    with pytest.raises(PriorityTraceError, match=message):
        timed_pods([bad])


def test_a_name_given_twice_is_an_error() -> None:
    with pytest.raises(PriorityTraceError, match="pod p appears twice"):
        timed_pods([pod("p", "LS", 0, 5), pod("p", "BE", 1, 5)])


def test_the_openb_default_pods_all_have_a_timeline(trace_dir: Path) -> None:
    timed = timed_pods(load_pods(trace_dir / "openb_pod_list_default.csv"))
    assert len(timed) == 8152
    assert sum(t.priority == 1000 for t in timed) == 4647 + 100 + 7
    assert all(t.run_s >= 0 for t in timed)
