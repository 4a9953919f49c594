"""Kubernetes quantity parsing (hami.core.quantity): grammar, rounding, caps, conversions."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.core.quantity import (
    INT64_MAX,
    QuantityError,
    parse_quantity,
    to_int_exact,
    to_mib,
    to_milli,
)

GI = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("+5", 5),
        ("-2", -2),
        ("007", 7),
        ("1.5", Fraction(3, 2)),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        ("500m", Fraction(1, 2)),
        ("100m", Fraction(1, 10)),
        ("1n", Fraction(1, 10**9)),
        ("3u", Fraction(3, 10**6)),
        ("2k", 2000),
        ("1M", 10**6),
        ("4G", 4 * 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("16Mi", 16 * 2**20),
        ("16Gi", 16 * GI),
        ("16.0Gi", 16 * GI),
        ("1.5Gi", 3 * GI // 2),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("15e-1", Fraction(3, 2)),
        ("1.G", 10**9),
        ("-1.5k", -1500),
        # Kubernetes oddities kept on purpose: a bare sign, dot or suffix is zero.
        ("-", 0),
        ("+", 0),
        (".", 0),
        ("Ki", 0),
        ("e3", 0),
        ("  2  ", 2),
    ],
)
def test_parse_quantity_values(text: str, expected: int | Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.1n", Fraction(1, 10**9)),  # rounded away from zero to one nano
        ("1e-10", Fraction(1, 10**9)),
        ("-1e-10", Fraction(-1, 10**9)),
        ("1.0000000001", Fraction(1_000_000_001, 10**9)),
        ("1e-1000000", Fraction(1, 10**9)),
        ("9223372036854775807", INT64_MAX),
        ("9223372036854775808", INT64_MAX),  # capped
        ("-9223372036854775808", -INT64_MAX),
        ("10E", INT64_MAX),
        ("1e100", INT64_MAX),
        ("8Ei", INT64_MAX),
        ("1e2147483647", INT64_MAX),
    ],
)
def test_parse_quantity_rounds_and_caps(text: str, expected: int | Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "1Z",
        "1i",
        "1ki",
        "1KI",
        "1mi",
        "0.1am",
        "1.1.M",
        "1+1.0M",
        ".5i",
        "-3.01i",
        "-3.01e-",
        "1e",
        "1ee3",
        "1e3Ki",
        "1e1.5",
        "1 Gi",
        "--1",
        "1e99999999999",
        "1e2147483648",
        "١٢",  # non-ASCII digits
        "1" * 4001,
    ],
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(text)
    assert text.strip()[:20] in str(err.value)


def test_quantity_error_is_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), (0, 0), (-4, -4), (1.5, Fraction(3, 2)), (1e16, 10**16), (2**70, INT64_MAX)],
)
def test_parse_quantity_json_numbers(value: int | float, expected: int | Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf"), None, [1]])
def test_parse_quantity_rejects_non_quantities(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2),
        ("2k", 2000),
        ("1Gi", GI),
        ("-3", -3),
        ("1.5", None),
        ("500m", None),
        ("1e-10", None),
        ("16.0Gi", 16 * GI),
        ("10E", INT64_MAX),
    ],
)
def test_to_int_exact(text: str, expected: int | None) -> None:
    assert to_int_exact(parse_quantity(text)) == expected


def test_field_case_b09_wrapping_values_stay_exact() -> None:
    # 4294967346 = 2**32 + 50: must never wrap to 50 on the way in
    assert to_int_exact(parse_quantity(4294967346)) == 4294967346
    assert to_int_exact(parse_quantity("4294967346")) == 4294967346


def test_to_int_exact_outside_int64() -> None:
    assert to_int_exact(Fraction(2**63)) is None
    assert to_int_exact(Fraction(-(2**63))) == -(2**63)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1000),
        ("100m", 100),
        ("0.5", 500),
        ("0.0001", 1),
        ("1n", 1),
        ("-1n", -1),
        ("2.0005", 2001),
        ("0", 0),
    ],
)
def test_to_milli(text: str, expected: int) -> None:
    assert to_milli(parse_quantity(text)) == expected


@pytest.mark.parametrize(
    ("text", "up", "down"),
    [
        ("1Gi", 1024, 1024),
        ("1G", 954, 953),
        ("1", 1, 0),
        ("0", 0, 0),
        ("1Mi", 1, 1),
        ("1536Ki", 2, 1),
        ("-1", -1, 0),
    ],
)
def test_to_mib(text: str, up: int, down: int) -> None:
    assert to_mib(parse_quantity(text)) == up
    assert to_mib(parse_quantity(text), round_up=False) == down


@given(st.text())
def test_parse_quantity_only_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert abs(value) <= INT64_MAX
    assert (value * 10**9).denominator == 1


@given(st.integers(min_value=-INT64_MAX, max_value=INT64_MAX))
def test_integers_round_trip(n: int) -> None:
    assert to_int_exact(parse_quantity(str(n))) == n
    assert to_int_exact(parse_quantity(n)) == n


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi", "m", "n"]),
)
def test_suffix_scaling(n: int, suffix: str) -> None:
    scale = {
        "": 1,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "m": Fraction(1, 1000),
        "n": Fraction(1, 10**9),
    }
    assert parse_quantity(f"{n}{suffix}") == min(n * scale[suffix], INT64_MAX)


@given(
    st.decimals(
        min_value=-(10**6), max_value=10**6, places=9, allow_nan=False, allow_infinity=False
    )
)
def test_decimal_text_is_exact(value: object) -> None:
    text = format(value, "f")
    assert parse_quantity(text) == Fraction(text)
