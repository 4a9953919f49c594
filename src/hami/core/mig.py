"""Dynamic MIG: which profile and placement a memory need takes on a GPU.

Source (HAMi v2.10): (profile and placement selection),
(scheduler decisions). A GPU in ``mig`` mode registers its profiles with their
possible placements (slice ranges); an instance occupies ``[start, start + size)`` and two
instances on one GPU must not overlap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hami.core.model import MigPlacement, MigProfile


def _placement_order(profile: MigProfile) -> list[MigPlacement]:
    """``1g.``/``3g.`` profiles try the highest start first, the others the lowest."""
    high_first = profile.name.startswith(("1g.", "3g."))
    return sorted(profile.placements, key=lambda p: p.start, reverse=high_first)


def choose_instance(profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement],
                    memory_mib: int) -> tuple[MigProfile, MigPlacement] | None:
    """The smallest profile with at least ``memory_mib`` that still has a free placement.

    Profiles are tried by memory then slice count (stable); the first placement that
    overlaps no occupied one wins. Returns None when nothing fits.
    """
    taken = list(occupied)
    for profile in sorted(profiles, key=lambda p: (p.memory_mib, p.slice_count)):
        if profile.memory_mib < memory_mib:
            continue
        for placement in _placement_order(profile):
            if not any(placement.overlaps(t) for t in taken):
                return profile, placement
    return None


def replay(profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement],
           memory_needs: Iterable[int]) -> list[MigPlacement] | None:
    """Place ``memory_needs`` one after another on top of ``occupied``.

    Returns the occupied list with the new placements appended, or None as soon as one
    need cannot be placed.
    """
    taken = list(occupied)
    for need in memory_needs:
        chosen = choose_instance(profiles, taken, need)
        if chosen is None:
            return None
        taken.append(chosen[1])
    return taken
