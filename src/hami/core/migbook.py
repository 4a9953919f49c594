"""MIG instances in the usage ledger: which placements each GPU's pods hold, and which
GPUs fail closed because a pod's MIG records disagree with them (HAMi v2.10).

:class:`MigBook` is kept by :class:`hami.core.ledger.UsageLedger` next to its flat
arrays and indexed by the same device rows; the ledger calls :meth:`MigBook.apply` when
it charges or releases a pod and reads back which rows are usable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hami.core.model import DeviceInfo, MigPlacement, PodSingleDevice

BoolArray = npt.NDArray[np.bool_]


class MigHolder(Protocol):
    """What :class:`MigBook` reads of a ledger's pod entry."""

    @property
    def uid(self) -> str: ...
    @property
    def devices(self) -> PodSingleDevice: ...
    @property
    def mig(self) -> tuple[tuple[str, MigPlacement], ...]: ...


class MigNode(Protocol):
    """What :class:`MigBook` reads of a ledger's node entry."""

    @property
    def devices(self) -> tuple[DeviceInfo, ...]: ...
    @property
    def offset(self) -> int: ...
    @property
    def position(self) -> dict[str, int]: ...


@dataclass(slots=True)
class MigBook:
    """MIG reservations and faults per device row of a :class:`UsageLedger`."""

    #: Device row -> ``(pod uid, placement)`` of each MIG instance held there.
    held: dict[int, list[tuple[str, MigPlacement]]] = field(default_factory=dict)
    #: Device row -> uids of the pods whose MIG records disagree with it (HAMi v2.10).
    faults: dict[int, set[str]] = field(default_factory=dict)

    def drop(self, rows: range) -> None:
        """Forget reservations and faults of device ``rows`` (their node went away)."""
        for d in rows:
            self.held.pop(d, None)
            self.faults.pop(d, None)

    def apply(self, entry: MigHolder, node: MigNode, sign: int, mig_mode: BoolArray,
              registered_healthy: BoolArray, healthy: BoolArray) -> None:
        """Add (``sign`` +1) or remove (-1) ``entry``'s MIG reservations on ``node``, and
        set ``healthy`` of each device row whose fault state it changes: registered
        healthy and no pod's records disagree with it."""
        for uuid, placement in entry.mig:
            d = node.position.get(uuid)
            if d is None:
                continue
            held = self.held.setdefault(d, [])
            if sign > 0:
                held.append((entry.uid, placement))
            else:
                held.remove((entry.uid, placement))
        if entry.mig or mig_mode[node.offset:node.offset + len(node.devices)].any():
            for d in mig_mismatches(entry, node, mig_mode):
                faulted = self.faults.setdefault(d, set())
                if sign > 0:
                    faulted.add(entry.uid)
                else:
                    faulted.discard(entry.uid)
                    if not faulted:
                        del self.faults[d]
                healthy[d] = bool(registered_healthy[d]) and d not in self.faults

    def node_faults(self, node: MigNode) -> dict[str, tuple[str, ...]]:
        """GPUs of ``node`` failed closed by MIG mismatches: UUID -> the pod uids."""
        return {dev.uuid: tuple(sorted(self.faults[node.offset + i]))
                for i, dev in enumerate(node.devices) if node.offset + i in self.faults}

    def node_occupied(self, node: MigNode) -> dict[str, list[MigPlacement]]:
        """MIG placements in use per GPU UUID of ``node`` (only GPUs that have some)."""
        out: dict[str, list[MigPlacement]] = {}
        for i, dev in enumerate(node.devices):
            held = self.held.get(node.offset + i)
            if held:
                out[dev.uuid] = [p for _, p in held]
        return out


def mig_mismatches(entry: MigHolder, node: MigNode, mig_mode: BoolArray) -> set[int]:
    """Device rows of ``node`` that ``entry``'s MIG records make unusable (HAMi v2.10).

    HAMi pairs each of the pod's device entries on a GPU with one of its MIG
    reservations there and fails closed when they disagree, because the GPU's
    instance geometry is then unknown: an entry on a ``mig`` GPU without a
    reservation, or a reservation on a GPU that is not in ``mig`` mode, marks that GPU
    unhealthy; a reservation for a GPU the node does not have marks every ``mig`` GPU
    of the node. Extra reservations on a ``mig`` GPU are simply held.
    """
    reservations: dict[str, int] = {}
    for uuid, _ in entry.mig:
        reservations[uuid] = reservations.get(uuid, 0) + 1
    entries: dict[str, int] = {}
    for ctr in entry.devices:
        for dev in ctr:
            entries[dev.uuid] = entries.get(dev.uuid, 0) + 1
    out: set[int] = set()
    for uuid in reservations.keys() | entries.keys():
        d = node.position.get(uuid)
        if d is None:
            if reservations.get(uuid):
                out.update(node.offset + i for i, dev in enumerate(node.devices)
                           if dev.mode == "mig")
        elif mig_mode[d]:
            if entries.get(uuid, 0) > reservations.get(uuid, 0):
                out.add(d)
        elif reservations.get(uuid):
            out.add(d)
    return out


__all__ = ["MigBook", "MigHolder", "MigNode", "mig_mismatches"]
