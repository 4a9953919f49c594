"""The paper's workload protocol: inflate by resampling, shuffle with a seed.

"Beware of Fragmentation" (Weng et al., USENIX ATC'23, §6.1) replays the trace on the GPU
nodes with pods arriving one by one and never deleted; the pod list is inflated by
resampling pods of the trace until the total GPU request reaches 130 % of the cluster's
GPU capacity (``-tune 1.3``), and the arrival order is shuffled with a seed (42..51).

Our procedure (same intent; the exact random draws of the Go simulator are not
reproduced, so figures match within a tolerance, not bit for bit):

1. start from the trace's pods in file order;
2. while the total requested GPU (``sum num_gpu * gpu_milli``) is below
   ``tune * capacity``, append a copy of a pod drawn uniformly (with replacement) from the
   original list, renamed ``<name>-r<k>``;
3. shuffle the whole list with the same generator.

Everything is driven by one ``numpy.random.default_rng(seed)``, so a seed gives the same
list on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from hami.sim.trace import TracePod

#: Target total GPU request relative to cluster capacity (the paper's ``-tune 1.3``).
DEFAULT_TUNE = 1.3
#: The paper's seeds.
PAPER_SEEDS = tuple(range(42, 52))


def gpu_demand(pods: Sequence[TracePod]) -> int:
    """Total requested GPU in milli-GPU."""
    return sum(p.num_gpu * p.gpu_milli for p in pods)


def inflate(pods: Sequence[TracePod], capacity_milli: int, tune: float,
            rng: np.random.Generator) -> list[TracePod]:
    """Append resampled pods until requested GPU >= ``tune * capacity_milli``.

    Pods are never dropped: a trace that already asks for more is returned unchanged.

    Raises:
        ValueError: the list is empty or asks for no GPU while the target is positive.
    """
    out = list(pods)
    target = tune * capacity_milli
    total = gpu_demand(out)
    if total >= target:
        return out
    if not pods or not any(p.num_gpu for p in pods):
        raise ValueError("cannot inflate a workload that requests no GPU")
    k = 0
    n = len(pods)
    # Draw in batches (fast) but append one by one so the stop point is exact.
    while total < target:
        for i in rng.integers(0, n, size=1024):
            p = pods[int(i)]
            out.append(replace(p, name=f"{p.name}-r{k}"))
            k += 1
            total += p.num_gpu * p.gpu_milli
            if total >= target:
                break
    return out


def prepare_workload(pods: Sequence[TracePod], capacity_milli: int, seed: int,
                     tune: float = DEFAULT_TUNE, shuffle: bool = True) -> list[TracePod]:
    """Inflate to ``tune`` x capacity, then shuffle; deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    out = inflate(pods, capacity_milli, tune, rng)
    if shuffle:
        order = rng.permutation(len(out))
        out = [out[int(i)] for i in order]
    return out
