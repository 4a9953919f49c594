"""CPU and memory stranding: free GPU that a node cannot serve because its free CPU or
memory is short of what the task mix asks per GPU, so that the ``fragmentation-aware``
order keeps each node's free CPU and memory in step with its free GPU.

FGD's measure (:mod:`~hami.core.fragmentation.measure`) counts a node's free GPU as
fragmented for a class only once the class no longer fits the node's CPU or memory at
all. A node can long before that hold more free GPU than its free CPU or memory can ever
serve at the mix's ratio; the GPU it strands so is lost as surely, only later. The order
therefore adds, for every request on node ``n``,

    weight x (stranded[n] after - stranded[n] before)

to the growth of expected fragmentation (both in milli-GPU), with :func:`stranded`. Ours,
not in the FGD paper. Measured on openb (unallocated GPU % at 100 % arrived demand,
median; weight tuned on seeds 0-9 of the four workloads: 0.3 / 1 / 3 / 10), seeds 42-51
``default`` / ``gpushare100`` / ``multigpu50`` / ``gpuspec25``: 4.16 / 12.93 / 2.45 / 4.22
against 4.88 / 13.38 / 2.90 / 5.33 without it (docs/simulate.md, "How much room is
left"); 4.36 / 12.93 / 2.55 / 4.56 with the whole-node guard the live order applies to
mixes with multi-GPU classes (:mod:`~hami.core.fragmentation.wholeguard`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hami.core.fragmentation.measure import FloatArray, IntArray, WorkloadDistribution

#: Weight of the stranding term (milli-GPU of growth per milli-GPU stranded); tuned on
#: openb seeds 0-9.
STRANDING_WEIGHT = 3.0


@dataclass(frozen=True, slots=True)
class MixRatios:
    """The mix's GPU milli per CPU milli and per MiB of memory, its classes weighted by
    popularity (``inf``: the mix asks for no CPU, or no memory, so none is short)."""

    gpu_per_cpu_milli: float
    gpu_per_memory_mib: float

    @classmethod
    def of(cls, dist: WorkloadDistribution) -> MixRatios:
        """From a mix; only its GPU classes count (a CPU-only class strands nothing)."""
        gpu_classes = dist.num_gpu > 0
        w = np.where(gpu_classes, dist.weight, 0.0)
        gpu = float((w * dist.num_gpu * dist.gpu_milli).sum())
        cpu = float((w * dist.cpu_milli).sum())
        mem = float((w * dist.memory_mib).sum())
        return cls(gpu / cpu if cpu > 0 else np.inf, gpu / mem if mem > 0 else np.inf)


def stranded(total_milli: FloatArray, cpu_free_milli: IntArray, memory_free_mib: IntArray,
             ratios: MixRatios) -> FloatArray:
    """Per node, the free GPU (milli) beyond what its free CPU and memory serve at the
    mix's ratios: ``max(0, T - r_cpu x cpu_free, T - r_mem x memory_free)`` (negative free
    CPU or memory counts as none). Arrays are per node, of the same length."""
    total = np.asarray(total_milli, dtype=np.float64)
    out = np.zeros_like(total)
    if np.isfinite(ratios.gpu_per_cpu_milli):
        cpu = np.maximum(np.asarray(cpu_free_milli, dtype=np.float64), 0.0)
        np.maximum(out, total - ratios.gpu_per_cpu_milli * cpu, out=out)
    if np.isfinite(ratios.gpu_per_memory_mib):
        mem = np.maximum(np.asarray(memory_free_mib, dtype=np.float64), 0.0)
        np.maximum(out, total - ratios.gpu_per_memory_mib * mem, out=out)
    return out


def stranding_growth(total_milli: FloatArray, cpu_free_milli: IntArray,
                     memory_free_mib: IntArray, ratios: MixRatios, *, gpu_milli: int,
                     cpu_milli: int, memory_mib: int) -> FloatArray:
    """Per candidate node, how much :func:`stranded` grows if a request taking
    ``gpu_milli`` of GPU in all (GPUs x share), ``cpu_milli`` and ``memory_mib`` is placed
    there (negative: it shrinks)."""
    before = stranded(total_milli, cpu_free_milli, memory_free_mib, ratios)
    after = stranded(np.asarray(total_milli, dtype=np.float64) - gpu_milli,
                     np.asarray(cpu_free_milli) - cpu_milli,
                     np.asarray(memory_free_mib) - memory_mib, ratios)
    result: FloatArray = after - before
    return result
