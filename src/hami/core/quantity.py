"""Kubernetes resource quantities ("16Gi", "500m", "1e3") as exact numbers.

Source: Kubernetes ``resource.Quantity`` grammar and ``ParseQuantity`` semantics, used by
HAMi when it reads container limits (HAMi v2.10)::

    quantity ::= [sign] number [suffix]
    number   ::= digits | digits "." [digits] | "." digits
    suffix   ::= "" | n | u | m | k | M | G | T | P | E        (decimal SI, 10^-9 .. 10^18)
               | Ki | Mi | Gi | Ti | Pi | Ei                   (binary SI, 2^10 .. 2^60)
               | ("e" | "E") [sign] digits                     (decimal exponent)

Like Kubernetes, a parsed value is rounded *away from zero* to a whole number of
nano-units (so ``1n`` is the smallest non-zero magnitude) and its magnitude is capped at
``2**63 - 1``. Surrounding whitespace is ignored (as ``Quantity.UnmarshalJSON`` trims it).
A lone sign or dot (``"-"``, ``"."``) parses as 0, as in Kubernetes.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

__all__ = [
    "INT64_MAX",
    "QuantityError",
    "parse_quantity",
    "to_int_exact",
    "to_mib",
    "to_milli",
]

INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
_INT32_MAX: Final = 2**31 - 1
_NANO: Final = 10**9
_MIB: Final = 2**20
#: Mantissas longer than this are refused (Kubernetes has no limit; no real quantity is close).
_MAX_DIGITS: Final = 4000

_DECIMAL_SI: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SI: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}

_SYNTAX: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>[a-zA-Z]*))"
)


class QuantityError(ValueError):
    """A malformed Kubernetes quantity; the message quotes the offending text."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity into its exact value (HAMi v2.10).

    ``value`` is the quantity text (``"16Gi"``, ``"500m"``, ``"1e3"``, ``"-2"``) or a JSON
    number (``int`` or ``float``; a float is read through its shortest ``repr``). The result
    is in base units (bytes for memory, cores for CPU, counts for extended resources),
    rounded away from zero to a multiple of ``1e-9`` and capped at ``±(2**63 - 1)``.

    Raises :class:`QuantityError` for anything else (empty text, unknown suffix, ``bool``,
    NaN/infinity, an exponent outside int32, more than 4000 mantissa digits).
    """
    text = _as_text(value)
    match = _SYNTAX.fullmatch(text)
    if match is None or not text:
        raise QuantityError(f"quantities must match the regular expression, got {text!r}")
    exponent10, exponent2 = _suffix_exponents(match, text)
    digits = (match["int"] or "") + (match["frac"] or "")
    exponent10 -= len(match["frac"] or "")
    nano = _to_nano(digits, exponent10, exponent2, text)
    return Fraction(-nano if match["sign"] == "-" else nano, _NANO)


def to_int_exact(quantity: Fraction) -> int | None:
    """The quantity as an ``int`` when it is a whole number within int64, else ``None``.

    This is HAMi's "must be an exact int64" rule (``Quantity.AsInt64``, HAMi v2.10):
    ``"2"`` and ``"2k"`` are exact, ``"1.5"`` and ``"500m"`` are not.
    """
    if quantity.denominator != 1 or not INT64_MIN <= quantity.numerator <= INT64_MAX:
        return None
    return quantity.numerator


def to_milli(quantity: Fraction) -> int:
    """The quantity in milli-units (CPU millicores), rounded away from zero.

    Same as Kubernetes ``MilliValue``: ``"100m"`` is 100, ``"0.0001"`` is 1, ``"1"`` is 1000.
    """
    return _round_away(quantity * 1000)


def to_mib(quantity: Fraction, *, round_up: bool = True) -> int:
    """A byte quantity in MiB (2**20 bytes).

    By default a partial MiB counts as a whole one (rounded away from zero), the safe
    direction for requests; pass ``round_up=False`` to truncate toward zero, the safe
    direction for capacities. ``"1Gi"`` is 1024, ``"1G"`` is 954 (953.67 rounded up).
    """
    mib = quantity / _MIB
    return _round_away(mib) if round_up else math.trunc(mib)


def _as_text(value: str | int | float) -> str:
    if isinstance(value, bool):
        raise QuantityError(f"a boolean is not a quantity: {value!r}")
    if isinstance(value, int):
        return str(max(-INT64_MAX, min(value, INT64_MAX)))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"a quantity must be finite, got {value!r}")
        return repr(value)
    if isinstance(value, str):
        return value.strip()
    raise QuantityError(f"a quantity must be text or a number, got {value!r}")


def _suffix_exponents(match: re.Match[str], text: str) -> tuple[int, int]:
    """(power of ten, power of two) that the suffix multiplies by."""
    if match["exp"] is not None:
        digits = match["exp"][1:].lstrip("+-").lstrip("0") or "0"
        exponent = int(digits) if len(digits) <= 11 else 2**40
        if match["exp"][1] == "-":
            exponent = -exponent
        if not -(2**31) <= exponent <= _INT32_MAX:
            raise QuantityError(f"quantity exponent out of range in {text!r}")
        return exponent, 0
    suffix = match["suffix"]
    if suffix in _DECIMAL_SI:
        return _DECIMAL_SI[suffix], 0
    if suffix in _BINARY_SI:
        return 0, _BINARY_SI[suffix]
    raise QuantityError(f"unable to parse quantity's suffix in {text!r}")


def _to_nano(digits: str, exponent10: int, exponent2: int, text: str) -> int:
    """|digits × 10^exponent10 × 2^exponent2| in nano-units, rounded up and capped."""
    significant = digits.lstrip("0")
    stripped = significant.rstrip("0")
    exponent10 += len(significant) - len(stripped)
    if not stripped:
        return 0
    if len(stripped) > _MAX_DIGITS:
        raise QuantityError(f"quantity has too many digits: {text[:40]!r}...")
    magnitude = len(stripped) + exponent10  # value < 10**magnitude * 2**exponent2
    if magnitude > 20:  # at least 10**20 > 2**63 - 1
        return INT64_MAX * _NANO
    if magnitude <= -28:  # below 10**-28 * 2**60 < 1e-9: rounds up to one nano
        return 1
    numerator = int(stripped) << exponent2
    shift = exponent10 + 9
    scale = int(10 ** abs(shift))
    nano = numerator * scale if shift >= 0 else -(-numerator // scale)
    return min(nano, INT64_MAX * _NANO)


def _round_away(value: Fraction) -> int:
    magnitude = int(math.ceil(abs(value)))
    return magnitude if value >= 0 else -magnitude
