"""Kubernetes quantities (placeholder until the full parser lands)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

_SUFFIX = {"": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "Pi": 2**50, "Ei": 2**60}


class QuantityError(ValueError):
    """A malformed quantity."""


def parse_quantity(raw: Any) -> Fraction:
    """Parse a Kubernetes quantity into an exact fraction."""
    if isinstance(raw, bool):
        raise QuantityError(f"invalid quantity {raw!r}")
    if isinstance(raw, int):
        return Fraction(raw)
    text = str(raw).strip()
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if suf and text.endswith(suf):
            num, mult = text[: -len(suf)], _SUFFIX[suf]
            break
    else:
        num, mult = text, 1
    try:
        return Fraction(num) * mult
    except (ValueError, ZeroDivisionError):
        raise QuantityError(f"invalid quantity {raw!r}") from None


def to_int_exact(q: Fraction) -> int | None:
    """The integer value, or None when not integral."""
    return int(q) if q.denominator == 1 else None


def to_milli(q: Fraction) -> int:
    """Millicores, rounded up."""
    return -((-q * 1000).__floor__())


def to_mib(q: Fraction) -> int:
    """Bytes to MiB, rounded up."""
    return -((-q / 2**20).__floor__())
