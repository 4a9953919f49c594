"""GPU-model pressure: how much of a node's GPUs the task mix's model-constrained classes
will want, so that the ``fragmentation-aware`` order keeps scarce models for them.

FGD's measure (:mod:`~hami.core.fragmentation.measure`) sees a free GPU of a model that a
constrained class needs as usable by that class and by every unconstrained one alike, so
unconstrained tasks fill scarce models (on openb ``gpuspec25``: T4, P100, V100, G3) while
the large model they could equally use stays partly idle, and the constrained tasks fail
later. The order therefore adds, for a GPU request on node ``n``,

    weight x (GPUs x share milli) x pressure[n]

to the growth of expected fragmentation (both in milli-GPU), where ``pressure[n]`` is
:func:`model_pressure`. A mix without type constraints has no pressure, so the order is
then exactly FGD's.

Measured on openb ``gpuspec25`` (unallocated GPU % at 100 % arrived demand, median;
weight tuned on seeds 0-9: 0.25 / 0.5 / 0.75 / 1 / 2 / 4 give 5.47 / 5.32 / 5.38 / 5.39 /
5.45 / 5.60 against 6.29 without): 5.33 against 6.47 on seeds 42-51, every seed better;
4.56 with the stranding term of :mod:`~hami.core.fragmentation.stranding` too (guarded)
(docs/simulate.md, "How much room is left"). Ours, not in the FGD paper.
"""

from __future__ import annotations

import numpy as np

from hami.core.fragmentation.measure import BoolArray, FloatArray, IntArray, WorkloadDistribution

#: Weight of the pressure term (milli-GPU of growth per milli-GPU asked, per unit of
#: pressure); tuned on openb ``gpuspec25`` seeds 0-9.
MODEL_PRESSURE_WEIGHT = 0.5


def model_pressure(models_ok: BoolArray, gpus_per_node: IntArray,
                   dist: WorkloadDistribution) -> FloatArray:
    """``[N]``: the share of node ``n``'s GPUs that the mix's model-constrained classes
    would take if the arrivals asked for the cluster's whole GPU capacity, each class
    spread over the GPUs it accepts in proportion to their number (summed over the
    classes that accept node ``n``'s model).

    ``models_ok`` is :func:`~hami.core.fragmentation.measure.model_mask`'s ``[N, K]``;
    ``gpus_per_node`` ``[N]``. A class asks ``weight x num_gpu x gpu_milli``; classes
    without a model list, or without GPUs, add nothing (all zeros when no class is
    constrained, or the mix asks for no GPU). E.g. half the demand constrained to one
    model that holds a quarter of the GPUs: pressure 2 on that model's nodes, 0 elsewhere.
    """
    n = models_ok.shape[0]
    constrained = np.fromiter((bool(m) for m in dist.models), dtype=np.bool_,
                              count=dist.size) & (dist.num_gpu > 0)
    demand = dist.weight * dist.num_gpu * dist.gpu_milli
    total_demand = float(demand.sum())
    gpus = np.asarray(gpus_per_node, dtype=np.float64)
    if not constrained.any() or total_demand <= 0 or gpus.sum() <= 0:
        return np.zeros(n)
    accepting = gpus @ models_ok  # [K]: GPUs each class may use
    share = np.where(constrained & (accepting > 0),
                     demand / total_demand * gpus.sum() / np.maximum(accepting, 1), 0.0)
    result: FloatArray = models_ok.astype(np.float64) @ share
    return result
