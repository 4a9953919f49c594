"""MIG-capable GPU models for the simulator: profiles, placements, card memory.

A live node learns its MIG profiles from NVML (HAMi v2.10: the first
``migProfileAllowlist`` entry whose ``models`` list holds a substring of the GPU model
selects the profile names; memory, SM share and placements come from NVML). A simulated
node has no NVML, so this module carries what NVML reports for the GPUs of the chart's
default allowlist (HAMi v2.10) that a simulated cluster can use:

* profile names: the chart's default allowlist for the model;
* ``memory_mib``: the GPU instance's memory as ``nvidia-smi mig -lgip`` lists it (GiB with
  two decimals, converted to MiB); the card's memory is what ``nvidia-smi`` shows, or the
  marketed size where we have no listing (A30);
* ``cores_percent``: ``ceil(profile SMs x 100 / SMs of the full-GPU profile)`` (HAMi v2.10);
* placements: the GPU-instance placements NVML returns (``[start, start + size)`` in
  memory slices; A100/H100 have 8 slices and 7 compute slices, A30 has 4).

A MIG-mode GPU registers with its full card memory (``devmem``, unscaled), ``devcore``
100 and ``count`` = the most instances any profile can have (HAMi v2.10), which is what
:func:`mig_device` builds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hami.api import names
from hami.core.model import DeviceInfo, MigPlacement, MigProfile


@dataclass(frozen=True, slots=True)
class MigModel:
    """One MIG-capable GPU model.

    ``aliases`` are matched as case-insensitive substrings of a node's ``model`` column
    (the allowlist rule of HAMi v2.10); ``card_memory_mib`` is the whole card's memory.
    """

    name: str
    aliases: tuple[str, ...]
    card_memory_mib: int
    profiles: tuple[MigProfile, ...]

    @property
    def max_instances(self) -> int:
        """The most instances one profile can have on a card (the device's ``count``)."""
        return max(len(p.placements) for p in self.profiles)


def _profile(name: str, memory_mib: int, sms: int, full_sms: int, slices: int,
             starts: tuple[int, ...], size: int) -> MigProfile:
    return MigProfile(name, memory_mib, math.ceil(sms * 100 / full_sms), slices,
                      tuple(MigPlacement(s, size) for s in starts))


def _eight_slices(names_: tuple[str, str, str, str], memory_mib: tuple[int, int, int, int],
                  sms: tuple[int, int, int, int]) -> tuple[MigProfile, ...]:
    """1g/2g/3g/7g on an 8-slice GPU (A100, H100): 7, 3, 2 and 1 placements."""
    full = sms[3]
    return (
        _profile(names_[0], memory_mib[0], sms[0], full, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        _profile(names_[1], memory_mib[1], sms[1], full, 2, (0, 2, 4), 2),
        _profile(names_[2], memory_mib[2], sms[2], full, 3, (0, 4), 4),
        _profile(names_[3], memory_mib[3], sms[3], full, 7, (0,), 8),
    )


#: Known MIG models, most specific first (the first whose alias matches wins). Memory is
#: ``nvidia-smi mig -lgip``'s GiB (two decimals: 19.62 is 19.625 GiB) in MiB; SMs are its
#: SM column. H100 is the H100 PCIe listing (114 SMs; card 81559 MiB as nvidia-smi shows).
MIG_MODELS: tuple[MigModel, ...] = (
    MigModel("A100-80GB", ("A100-80GB", "A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB"),
             81920, _eight_slices(("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"),
                                  (9728, 19968, 40192, 80896), (14, 28, 42, 98))),
    MigModel("A100-40GB", ("A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"),
             40960, _eight_slices(("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"),
                                  (4864, 9984, 20096, 40192), (14, 28, 42, 98))),
    MigModel("H100-80GB", ("H100-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H100 80GB",
                           "H100 PCIe"),
             81559, _eight_slices(("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"),
                                  (9984, 20096, 40448, 81152), (14, 30, 46, 114))),
    MigModel("A30", ("A30",), 24576, (
        _profile("1g.6gb", 5952, 14, 56, 1, (0, 1, 2, 3), 1),
        _profile("2g.12gb", 12032, 28, 56, 2, (0, 2), 2),
        _profile("4g.24gb", 24192, 56, 56, 4, (0,), 4),
    )),
)


class MigModelError(ValueError):
    """A node asks for MIG mode on a GPU model without a MIG profile table."""


def mig_model(model: str) -> MigModel | None:
    """The MIG model whose alias is a substring of ``model`` (case-insensitive), or None."""
    low = model.lower()
    for entry in MIG_MODELS:
        if any(a.lower() in low for a in entry.aliases):
            return entry
    return None


def require_mig_model(model: str, node: str = "") -> MigModel:
    """:func:`mig_model`, raising when the model has no MIG profiles.

    Raises:
        MigModelError: one line naming the node, the model and the known models.
    """
    entry = mig_model(model)
    if entry is None:
        where = f"node {node}: " if node else ""
        known = ", ".join(m.name for m in MIG_MODELS)
        raise MigModelError(f"{where}GPU model {model!r} cannot run in MIG mode "
                            f"(MIG-capable models: {known})")
    return entry


def mig_device(uuid: str, index: int, device_type: str, model: MigModel) -> DeviceInfo:
    """A MIG-mode GPU as its device plugin registers it (HAMi v2.10)."""
    return DeviceInfo(uuid=uuid, index=index, split_count=model.max_instances,
                      memory_mib=model.card_memory_mib, cores_percent=100, type=device_type,
                      mode=names.MODE_MIG, mig_profiles=model.profiles)
