"""Whole-node guard for the stranding term: the term may reorder busy nodes among
themselves, but not decide whether a node with all its GPUs free is broken. The live
order applies it when the task mix holds a class asking for several GPUs
(:func:`mix_needs_whole_nodes`): only such classes need a node's GPUs free together.

The stranding term (:mod:`~hami.core.fragmentation.stranding`) charges a node nothing
while its free CPU and memory cover its free GPU at the mix's ratio. Nodes with more CPU
and memory per GPU than the rest (on openb the 39 ``G3`` nodes: 128 cores and 768 GiB
for 8 GPUs, against 96 cores and 384 GiB on ``G2``) thus look free of charge to
CPU-heavy small requests, which break them first, and the rare 8-GPU pods that fit only
on such nodes (120 cores, absent from the mix, which keeps one class per GPU shape) then
stay unplaced while the cluster is half empty. With the guard, for a GPU request:

* a node with all its GPUs free is ranked by the growth without the term;
* whether such a node or a busy one comes first is decided as without the term (each
  group keeps its own order; the other group is shifted behind it);
* ties of growth go to the node with less free GPU, then less free CPU (a whole ``G2``
  before a whole ``G3``).

Measured on openb seeds 42-51 (docs/simulate.md, "Early failures of multi-GPU pods with
the stranding term"): no early failure on ``default``, 1 on ``multigpu50`` (20 without the
term, 120 with it alone), but 17 on ``gpuspec25`` (9 without), and about 70 % of the
term's gain kept. A mix of single-GPU tasks alone (``gpushare100``) has nothing to
protect, and keeps the whole gain. Ours.
"""

from __future__ import annotations

import numpy as np

from hami.core.fragmentation.measure import BoolArray, FloatArray, WorkloadDistribution

#: Milli-GPU by which the group that goes second ends behind the first group's best.
GAP_MILLI = 1.0


def guard_whole_nodes(plain: FloatArray, term: FloatArray, whole: BoolArray) -> FloatArray:
    """Per candidate node: growth with the stranding term, guarded as above.

    ``plain`` is the growth without the term (milli-GPU, ``inf`` where the request does
    not fit), ``term`` the weighted stranding growth, ``whole`` True for a node with all
    its GPUs free; all of the same length. Returns a new array: ``plain`` on whole nodes,
    ``plain + term`` on busy ones, then the group whose best ``plain`` is worse (busy
    nodes on a tie) shifted by a constant so that it starts :data:`GAP_MILLI` behind the
    other group's best.
    """
    plain = np.asarray(plain, dtype=np.float64)
    result = np.where(whole, plain, plain + np.asarray(term, dtype=np.float64))
    fits = np.isfinite(plain)
    free, busy = whole & fits, ~whole & fits
    if not free.any() or not busy.any():
        return result
    if plain[free].min() < plain[busy].min():
        first, second = free, busy
    else:
        first, second = busy, free
    gap = result[first].min() - result[second].min()
    if gap >= 0:
        result[second] += gap + GAP_MILLI
    return result


def mix_needs_whole_nodes(dist: WorkloadDistribution) -> bool:
    """Whether some class of the mix with a positive weight asks for two or more GPUs
    (a single-GPU task fits any free GPU, so only those need whole nodes kept whole)."""
    return bool(((dist.num_gpu >= 2) & (dist.weight > 0)).any())
