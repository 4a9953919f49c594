"""The ``fragmentation-aware`` order's look-ahead over the next arrival's class (opt-in,
``FragmentationScorer(look_ahead=True)``), on clusters small enough to follow by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hami.core.fragmentation import FragmentationScorer, Placement, WorkloadDistribution
from hami.core.fragmentation.lookahead import LookAhead, next_growth
from hami.core.fragmentation.measure import frag_delta, fragment
from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, DeviceInfo

# Shares of 300, 600 and 900 milli-GPU, 3 : 3 : 1; each needs 1000m CPU.
MIX = WorkloadDistribution.from_tasks([1] * 7, [300] * 3 + [600] * 3 + [900],
                                      [1000] * 7, [0] * 7)


def two_single_gpu_nodes() -> UsageLedger:
    led = UsageLedger()
    for n in range(2):
        led.add_node(f"n{n}", [DeviceInfo(f"n{n}-g0", 0, 20, 16384, 100, "NVIDIA-T4")],
                     cpu_milli=16000, memory_mib=65536)
    return led


def test_look_ahead_keeps_a_gpu_whole_for_the_next_arrival() -> None:
    # n0 holds a 300m share (700 free), n1 is empty. Another 300m share grows the
    # expected fragmentation by 128.6 on n0 (400 left: only the 300s fit) and by 100 on
    # n1 (700 left on both: the 900s fit nowhere), so FGD alone takes n1 and strands the
    # next 900m task. With the next arrival's expected growth added (n0: +57.1, the 900s
    # still fit on n1; n1: +198, a 900 then fits nowhere and counts 1000) n0 wins.
    led = two_single_gpu_nodes()
    led.add_pod("a", "n0", ((ContainerDevice("n0-g0", "NVIDIA", 4915, 30),),),
                cpu_milli=1000)
    p = Placement(request_milli=300, num_gpu=1, cpu_milli=1000, memory_mib=0)
    scorer = FragmentationScorer(MIX, look_ahead=LookAhead(min_whole_demand=0.0))
    assert list(scorer.order(led, p, np.array([0, 1]))) == [0, 1]
    assert list(scorer.node_deltas(led, p, np.array([0, 1]))) == pytest.approx(
        [900 / 7, 100])
    greedy = FragmentationScorer(MIX, look_ahead=False)
    assert list(greedy.order(led, p, np.array([0, 1]))) == [1, 0]


def test_look_ahead_places_the_sequence_fgd_cannot() -> None:
    # 300, 300, 900 on two empty 1-GPU nodes: FGD alone splits the 300s and fails the
    # 900; the look-ahead stacks them and places all three.
    def replay(scorer: FragmentationScorer) -> list[int | None]:
        led = two_single_gpu_nodes()
        free = [1000, 1000]
        chosen: list[int | None] = []
        for i, milli in enumerate([300, 300, 900]):
            fits = np.array([n for n in range(2) if free[n] >= milli])
            if fits.size == 0:
                chosen.append(None)
                continue
            n = int(scorer.order(led, Placement(milli, 1, 1000, 0), fits)[0])
            free[n] -= milli
            led.add_pod(f"p{i}", f"n{n}", ((ContainerDevice(
                f"n{n}-g0", "NVIDIA", 16384 * milli // 1000, milli // 10),),), cpu_milli=1000)
            chosen.append(n)
        return chosen

    assert replay(FragmentationScorer(MIX, look_ahead=LookAhead(min_whole_demand=0.0))) == [
        0, 0, 1]
    assert replay(FragmentationScorer(MIX, look_ahead=False)) == [0, 1, None]


def test_next_growth_is_frag_delta_with_every_model_accepted() -> None:
    # Whole GPUs (1, 2 and 4), shares and a CPU-only class, on random node states with
    # CPU and memory sometimes short: the vectorised table equals frag_delta class by
    # class (a share at its best GPU; inf where the class does not fit).
    dist = WorkloadDistribution.from_tasks(
        [1, 1, 2, 4, 1, 1, 0], [1000, 500, 1000, 1000, 250, 750, 0],
        [4000, 2000, 8000, 16000, 1000, 6000, 500], [1000, 500, 2000, 4000, 250, 3000, 10])
    rng = np.random.default_rng(3)
    free = rng.choice([0, 100, 250, 500, 600, 750, 1000, 1000], size=(40, 4))
    cpu = rng.integers(0, 20000, 40)
    mem = rng.integers(0, 5000, 40)
    table = next_growth(dist, free, cpu, mem)
    ok = np.ones((1, dist.size), dtype=bool)
    for r in range(40):
        f = free[r].astype(np.float64)
        small = f[:, None] < dist.need()[None, :]
        total = np.array([f.sum()])
        s = np.where(small, f[:, None], 0.0).sum(axis=0, keepdims=True)
        c = (~small).sum(axis=0, keepdims=True).astype(np.float64)
        before = fragment(total, s, c, cpu[r:r + 1], mem[r:r + 1], ok, dist) @ dist.weight
        for k in range(dist.size):
            milli, gpus = int(dist.gpu_milli[k]), int(dist.num_gpu[k])
            fits = cpu[r] >= dist.cpu_milli[k] and mem[r] >= dist.memory_mib[k]
            args = (total, s, c, before, np.array([cpu[r]]), np.array([mem[r]]), ok, dist)
            kw = {"request_milli": milli, "num_gpu": gpus,
                  "cpu_milli": int(dist.cpu_milli[k]), "memory_mib": int(dist.memory_mib[k])}
            if gpus == 1 and 0 < milli < 1000:
                room = f[f >= milli]
                want = min((float(frag_delta(*args, **kw, device_free=np.array([x]))[0])
                            for x in room), default=np.inf)
            else:
                fits = fits and int((f >= 1000).sum()) >= gpus
                want = float(frag_delta(*args, **kw)[0])
            assert table[r, k] == pytest.approx(want if fits else np.inf), (r, k)


def test_simulate_policy_replays_the_sequence_fgd_cannot() -> None:
    # The case above through the simulator (admission, the live filter, bind): two
    # 1-GPU nodes, pods of 300, 300 and 900 milli-GPU, the mix MIX plus one 2-GPU task
    # (whole GPUs in the mix, so that the look-ahead applies; it fits no 1-GPU node and
    # grows alike everywhere). Named fragmentation-aware+lookahead, the replay stacks the
    # 300s on n0 and places the 900 on n1; plain fragmentation-aware splits the 300s and
    # the 900 fails.
    from hami.sim.replay import (
        FRAGMENTATION_AWARE,
        FRAGMENTATION_AWARE_LOOKAHEAD,
        Replayer,
        workload_distribution,
    )
    from hami.sim.trace import TraceNode, TracePod

    nodes = [TraceNode(f"n{n}", 16000, 65536, 1, "T4") for n in range(2)]
    mix = [TracePod(f"m{i}", 1000, 0, 1, milli)
           for i, milli in enumerate([300] * 3 + [600] * 3 + [900])]
    mix.append(TracePod("m-2gpu", 1000, 0, 2, 1000))
    pods = [TracePod(f"p{i}", 1000, 0, 1, milli) for i, milli in enumerate([300, 300, 900])]

    def placed(policy: str) -> tuple[dict[str, str], int]:
        replayer = Replayer(nodes, policy, workload_distribution(mix))
        result = replayer.run(pods)
        return {p.name: p.node for p in replayer.ledger.pods()}, result.failed

    assert placed(FRAGMENTATION_AWARE_LOOKAHEAD) == ({"p0": "n0", "p1": "n0", "p2": "n1"}, 0)
    assert placed(FRAGMENTATION_AWARE) == ({"p0": "n0", "p1": "n1"}, 1)


def test_lookahead_policy_runs_only_when_named() -> None:
    from hami.sim.command import parse_policies
    from hami.sim.replay import ALL_POLICIES, FRAGMENTATION_AWARE_LOOKAHEAD, parse_policy

    assert FRAGMENTATION_AWARE_LOOKAHEAD == "fragmentation-aware+lookahead"
    assert FRAGMENTATION_AWARE_LOOKAHEAD not in ALL_POLICIES
    assert FRAGMENTATION_AWARE_LOOKAHEAD not in parse_policies("all")
    assert FRAGMENTATION_AWARE_LOOKAHEAD not in parse_policies("paper")
    assert parse_policies("binpack/binpack, fragmentation-aware+lookahead") == [
        "binpack/binpack", FRAGMENTATION_AWARE_LOOKAHEAD]
    assert parse_policy(FRAGMENTATION_AWARE_LOOKAHEAD).node_policy == "fragmentation-aware"
