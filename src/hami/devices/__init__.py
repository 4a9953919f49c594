"""Vendor device backends behind one Protocol (HAMi v2.10): NVIDIA (adapter over the core),
AMD, Ascend, AWS Neuron, Biren, Cambricon, Enflame, Hygon, Iluvatar, Kunlunxin, MetaX,
Moore Threads, Vastai. See ``docs/vendors.md`` (users) and
``docs/dev/vendors-design.md`` (how the scheduler serves them)."""

from hami.core.vendor import (
    AdmissionError,
    FitContext,
    PatchContext,
    ResourceNames,
    Vendor,
)

__all__ = ["AdmissionError", "FitContext", "PatchContext", "ResourceNames", "Vendor"]
