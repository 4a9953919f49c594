"""Filter latency and ledger memory at cluster scale (issue 2 targets).

Prints, for 100 / 1,000 / 5,000 nodes x 8 GPUs and 0 or 8 running pods per node, the
latency of one filter decision (p50, p99 over many pods, each decision committed so the
cluster fills as in production), and the peak memory of a ledger holding 5,000 nodes and
40,000 pods. Run: ``python bench/bench_filter.py [--quick]``.

``--log`` adds the scheduler's per-decision log line (INFO, key=value, written to
/dev/null) inside the timed region, to show what logging costs.

Targets (2-core machine): p99 <= 10 ms at 1,000 nodes and <= 50 ms at 5,000 nodes, the
same with 0 or 8 pods per node; ledger <= 200 MiB at 5,000 nodes / 40,000 pods.
A mixed pod (one container asking for an NVIDIA GPU and a Hygon DCU) on 1,000 nodes that
have both, next to an NVIDIA-only pod on the same cluster: the mixed pod within 1.5x.
Then the node policies side by side at 1,000 nodes x 8 pods: ``fragmentation-aware``
(the policy ``hami simulate`` reports as ours, learning the task mix online from the
requests it places and the running GPU pods) within 2x the p99 of ``binpack``. The three
policies run on three copies of the cluster with their decisions interleaved, and each
decision is timed in wall-clock and in CPU time of this process (``time.process_time``):
on a shared machine the wall clock also counts other processes' time slices.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from hami.core.config import SchedulingPolicy
from hami.core.filter import NODE_ORDERS
from hami.core.fragmentation import LiveFragmentationOrder
from hami.core.model import ContainerDevice, DeviceInfo
from hami.core.state import ClusterState
from hami.devices.registry import build_registry, make_config

MODELS = [("NVIDIA-A100-SXM4-40GB", 40960), ("NVIDIA-Tesla-T4", 15360), ("NVIDIA-A10", 24576)]


def build(nodes: int, pods_per_node: int, policy: SchedulingPolicy, seed: int = 1) -> ClusterState:
    """A cluster of ``nodes`` x 8 GPUs with ``pods_per_node`` one-GPU pods already bound."""
    rng = random.Random(seed)
    state = ClusterState(make_config(policy=policy))
    for n in range(nodes):
        model, mem = MODELS[n % len(MODELS)]
        state.ledger.add_node(f"node-{n:05d}", [DeviceInfo(f"GPU-{n:05d}-{i}", i, 10, mem, 100,
                                                           model) for i in range(8)])
    for n in range(nodes):
        for k in range(pods_per_node):
            gpu = rng.randrange(8)
            grant = ((ContainerDevice(f"GPU-{n:05d}-{gpu}", "NVIDIA", rng.choice([1024, 2048, 4096]),
                                      rng.choice([0, 10, 20])),),)
            state.charge(f"run-{n}-{k}", f"node-{n:05d}", grant, 0, namespace="bench")
    return state


def build_mixed(nodes: int, pods_per_node: int, seed: int = 1) -> ClusterState:
    """:func:`build` with 4 Hygon DCUs per node besides the 8 GPUs (NVIDIA + DCU registered)."""
    rng = random.Random(seed)
    registry = build_registry({"nvidia": {}, "hygon": {}})
    state = ClusterState(make_config(registry=registry))
    for n in range(nodes):
        model, mem = MODELS[n % len(MODELS)]
        gpus = [DeviceInfo(f"GPU-{n:05d}-{i}", i, 10, mem, 100, model) for i in range(8)]
        dcus = [DeviceInfo(f"DCU-{n:05d}-{i}", i, 4, 65520, 100, "DCU-Z100", vendor="DCU")
                for i in range(4)]
        state.ledger.add_node(f"node-{n:05d}", gpus + dcus)
    for n in range(nodes):
        for k in range(pods_per_node):
            grant = ((ContainerDevice(f"GPU-{n:05d}-{rng.randrange(8)}", "NVIDIA",
                                      rng.choice([1024, 2048, 4096]), rng.choice([0, 10, 20])),),)
            state.charge(f"run-{n}-{k}", f"node-{n:05d}", grant, 0, namespace="bench")
    return state


def mixed_pod(i: int, rng: random.Random, with_dcu: bool) -> dict:
    """:func:`pending_pod`, plus one DCU share in the same container when ``with_dcu``."""
    pod = pending_pod(i, rng)
    if with_dcu:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        limits.update({"hygon.com/dcunum": 1, "hygon.com/dcumem": rng.choice([1024, 2048]),
                       "hygon.com/dcucores": rng.choice([0, 10])})
    return pod


def mixed_latency(nodes: int, decisions: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """``((p50, p99) NVIDIA-only, (p50, p99) NVIDIA+DCU)`` in ms, each on its own
    :func:`build_mixed` cluster, the two kinds of decisions interleaved so that a busy
    machine slows both alike."""
    states = (build_mixed(nodes, 8), build_mixed(nodes, 8))
    names = states[0].ledger.node_names()
    rngs = (random.Random(7), random.Random(7))
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(decisions):
        for k, state in enumerate(states):
            pod = mixed_pod(i, rngs[k], with_dcu=bool(k))
            t0 = time.perf_counter()
            decision = state.filter(pod, names)
            samples[k].append(time.perf_counter() - t0)
            if decision.result.node:
                state.commit(pod, decision)
    return _percentiles(samples[0]), _percentiles(samples[1])


POLICIES = (("binpack", "binpack"), ("spread", "binpack"),
            ("fragmentation-aware", "fragmentation-aware"))
#: With ``--look-ahead``: the fragmentation-aware order with the one-arrival look-ahead
#: (``LiveFragmentationOrder(look_ahead=True)``), as a fourth policy.
LOOK_AHEAD = ("fragmentation-aware+lookahead", "fragmentation-aware")


def policy_latency(nodes: int, pods_per_node: int, decisions: int, log: bool = False,
                   policies: tuple[tuple[str, str], ...] = POLICIES
                   ) -> dict[str, tuple[tuple[float, float], tuple[float, float]]]:
    """Per node policy of :data:`POLICIES`: ``((p50, p99) wall, (p50, p99) CPU)`` in ms of
    ``decisions`` filters on its own :func:`build` cluster (each placed pod committed), the
    policies' decisions interleaved so that a busy machine slows all alike. The first
    decisions count too: ``fragmentation-aware`` builds its per-node state and learns the
    task mix on its first one."""
    if LOOK_AHEAD in policies and LOOK_AHEAD[0] not in NODE_ORDERS:
        NODE_ORDERS[LOOK_AHEAD[0]] = LiveFragmentationOrder(look_ahead=True)
    states = [build(nodes, pods_per_node, SchedulingPolicy(n, g)) for n, g in policies]
    names = states[0].ledger.node_names()
    rngs = [random.Random(7) for _ in policies]
    wall: list[list[float]] = [[] for _ in policies]
    cpu: list[list[float]] = [[] for _ in policies]
    for i in range(decisions):
        for k, state in enumerate(states):
            pod = pending_pod(i, rngs[k])
            w0, c0 = time.perf_counter(), time.process_time()
            decision = state.filter(pod, names)
            if log:
                log_decision(pod, decision, len(names), time.perf_counter() - w0)
            cpu[k].append(time.process_time() - c0)
            wall[k].append(time.perf_counter() - w0)
            if decision.result.node:
                state.commit(pod, decision)
    return {n: (_percentiles(wall[k]), _percentiles(cpu[k]))
            for k, (n, _) in enumerate(policies)}


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """p50, p99 of ``samples`` (seconds) in ms."""
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return statistics.median(samples) * 1e3, p99 * 1e3


def pending_pod(i: int, rng: random.Random) -> dict:
    limits = {"nvidia.com/gpu": rng.choice([1, 1, 1, 2]),
              "nvidia.com/gpumem": rng.choice([1024, 2048, 4096, 8192]),
              "nvidia.com/gpucores": rng.choice([0, 10, 25])}
    return {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"p{i}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def log_decision(pod: dict, decision: Any, candidates: int, seconds: float) -> None:
    """What the scheduler logs for a decision (hami.scheduler.decisionlog)."""
    from hami.scheduler import decisionlog

    meta = pod["metadata"]
    if decision.result.node:
        decisionlog.filter_placed(meta, decision.result.node, decision.annotations,
                                  decision.result.score, candidates, seconds)
    else:
        decisionlog.filter_unschedulable(meta, decision.result.failed_nodes, candidates,
                                         seconds)


def latency(nodes: int, pods_per_node: int, decisions: int, log: bool = False,
            policy: SchedulingPolicy | None = None) -> tuple[float, float]:
    state = build(nodes, pods_per_node, policy or SchedulingPolicy())
    return timed(state, pending_pod, decisions, log)


def timed(state: ClusterState, make_pod: Callable[[int, random.Random], dict],
          decisions: int, log: bool = False) -> tuple[float, float]:
    """p50, p99 (ms) of ``decisions`` filters of ``make_pod(i, rng)`` pods, each placed
    pod committed so the cluster fills as in production."""
    names = state.ledger.node_names()
    rng = random.Random(7)
    samples = []
    for i in range(decisions):
        pod = make_pod(i, rng)
        t0 = time.perf_counter()
        decision = state.filter(pod, names)
        if log:
            log_decision(pod, decision, len(names), time.perf_counter() - t0)
        samples.append(time.perf_counter() - t0)
        if decision.result.node:
            state.commit(pod, decision)
    return _percentiles(samples)


def ledger_memory(nodes: int, pods: int) -> float:
    tracemalloc.start()
    build(nodes, pods // nodes, SchedulingPolicy())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def table(decisions: int, log: bool) -> None:
    """Filter latency by cluster size, the mixed-vendor pod and the ledger's memory."""
    print(f"{'nodes':>6} {'pods/node':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for nodes in (100, 1000, 5000):
        for per_node in (0, 8):
            p50, p99 = latency(nodes, per_node, decisions, log)
            print(f"{nodes:>6} {per_node:>9} {p50:>8.2f} {p99:>8.2f}")
    only, mixed = mixed_latency(1000, decisions)
    print(f"1000 nodes x (8 GPU + 4 DCU), NVIDIA pod   p50 {only[0]:6.2f} ms  p99 {only[1]:6.2f} ms")
    print(f"1000 nodes x (8 GPU + 4 DCU), NVIDIA+DCU   p50 {mixed[0]:6.2f} ms  p99 {mixed[1]:6.2f} ms"
          f"  ({mixed[0] / only[0]:.2f}x p50, {mixed[1] / only[1]:.2f}x p99)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions")
    parser.add_argument("--log", action="store_true",
                        help="also log each decision as the scheduler does (INFO, key=value, "
                        "to /dev/null), to measure what logging costs")
    parser.add_argument("--policies", action="store_true",
                        help="only the node policies side by side at 1,000 nodes")
    parser.add_argument("--look-ahead", action="store_true",
                        help="add fragmentation-aware with the one-arrival look-ahead "
                        "(opt-in) to the node policies")
    args = parser.parse_args()
    decisions = 100 if args.quick else 400
    if args.log:
        import os

        from hami.logs import setup_logging

        setup_logging(stream=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the run
    if not args.policies:
        table(decisions, args.log)
    by_policy = policy_latency(1000, 8, decisions, args.log,
                               POLICIES + ((LOOK_AHEAD,) if args.look_ahead else ()))
    (_, base_wall), (_, base_cpu) = by_policy["binpack"]
    print("1000 nodes x 8 pods, policies interleaved   wall p50 / p99 ms    CPU p50 / p99 ms"
          "   p99 vs binpack (wall, CPU)")
    for node_policy, (wall, cpu) in by_policy.items():
        print(f"  {node_policy:20s} {wall[0]:19.2f} / {wall[1]:6.2f} {cpu[0]:11.2f} / "
              f"{cpu[1]:6.2f}   {wall[1] / base_wall:.2f}x, {cpu[1] / base_cpu:.2f}x")
    if not args.policies:
        print(f"ledger peak memory, 5000 nodes x 8 GPUs, 40000 pods: "
              f"{ledger_memory(5000, 40000):.1f} MiB")


if __name__ == "__main__":
    main()
