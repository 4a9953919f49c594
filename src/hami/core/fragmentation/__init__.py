"""Fragmentation of GPU nodes and the ``fragmentation-aware`` policy (after FGD, Weng et
al., "Beware of Fragmentation", USENIX ATC'23).

Modules, by layer:

* :mod:`~hami.core.fragmentation.measure`: the measure and its growth, pure functions
  over explicit arrays (:func:`node_fragmentation`, :func:`class_terms`,
  :func:`fragment`, :func:`frag_delta`) and the task mix (:class:`WorkloadDistribution`);
* :mod:`~hami.core.fragmentation.state`: :class:`FragmentationState`, per-node cached
  terms refreshed only for the nodes whose usage changed;
* :mod:`~hami.core.fragmentation.order`: :class:`FragmentationScorer`, the node order
  for a fixed mix (the simulator's);
* :mod:`~hami.core.fragmentation.lookahead`: an opt-in re-rank of the near-best nodes by
  the next arrival's expected growth (``FragmentationScorer(look_ahead=True)``; off), with
  :mod:`~hami.core.fragmentation.nextrow`, that growth per node state in plain Python;
* :mod:`~hami.core.fragmentation.learn`: :class:`LiveFragmentationOrder`, the live
  scheduler's order, learning the mix online.

Everything is in milli-GPU (1000 = one GPU). The names below are re-exported here.
"""

from hami.core.fragmentation.learn import LiveFragmentationOrder, distribution_from_ledger
from hami.core.fragmentation.measure import (
    WHOLE,
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
    class_terms,
    frag_delta,
    fragment,
    model_mask,
    node_fragmentation,
)
from hami.core.fragmentation.order import FragmentationScorer, Placement
from hami.core.fragmentation.state import (
    UNLIMITED,
    FragmentationState,
    ledger_inputs,
    node_types,
)

__all__ = [
    "UNLIMITED", "WHOLE", "BoolArray", "FloatArray", "FragmentationScorer",
    "FragmentationState", "IntArray", "LiveFragmentationOrder", "Placement",
    "WorkloadDistribution", "class_terms", "distribution_from_ledger", "frag_delta",
    "fragment", "ledger_inputs", "model_mask", "node_fragmentation", "node_types",
]
