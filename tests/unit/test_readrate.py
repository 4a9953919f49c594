"""The minimum read rate's rule (:mod:`hami.core.readrate`), on readings of cumulative
(taken, handed) byte counts every half window: who is cut, who is not."""

from __future__ import annotations

import pytest

from hami.core.readrate import ReadRateRule


def feed(rule: ReadRateRule, readings: list[tuple[float, int, int]]) -> list[bool]:
    """Whether each reading's verdict was "too slow"."""
    return [rule.reading(*r) is not None for r in readings]


def test_a_peer_that_takes_nothing_is_cut_after_one_window() -> None:
    rule = ReadRateRule(10.0, 1024)
    assert feed(rule, [(0, 0, 5000), (5, 0, 5000), (9.9, 0, 5000)]) == [False] * 3
    verdict = rule.reading(10.0, 0, 5000)
    assert verdict is not None and verdict.taken_bytes == 0 and verdict.elapsed_s == 10.0


def test_a_trickle_below_the_floor_is_cut_though_it_makes_progress() -> None:
    rule = ReadRateRule(10.0, 1024)
    # 500 bytes per 5 s: 100 B/s, progress at every reading
    cut = feed(rule, [(5.0 * i, 500 * i, 1_000_000) for i in range(4)])
    assert cut == [False, False, True, True]
    only_nothing = ReadRateRule(10.0, 0)  # floor 0: the take-nothing rule alone
    assert feed(only_nothing, [(5.0 * i, 500 * i, 1_000_000) for i in range(20)]) == [False] * 20


def test_a_reader_at_the_floor_or_above_is_never_cut() -> None:
    rule = ReadRateRule(10.0, 1024)
    assert feed(rule, [(5.0 * i, 5120 * i, 10_000_000) for i in range(100)]) == [False] * 100


def test_a_peer_with_nothing_waiting_is_never_cut() -> None:
    rule = ReadRateRule(10.0, 1024)
    # small answers, each taken at once (idle keep-alive in between)
    readings = [(5.0 * i, 100 * i, 100 * i) for i in range(20)]
    assert feed(rule, readings) == [False] * 20
    # a fresh answer seen waiting at one reading and taken by the next is no stall,
    # however few its bytes
    rule = ReadRateRule(10.0, 1024)
    readings = [(5.0 * i, 100 * (i - 1), 100 * i) if i % 2 else (5.0 * i, 100 * i, 100 * i + 50)
                for i in range(20)]
    assert feed(rule, readings) == [False] * 20


def test_bytes_handed_inside_the_window_do_not_count_against_it() -> None:
    """A new answer written after the window began is not a stall of the old ones."""
    rule = ReadRateRule(10.0, 1024)
    # all of the first 100 bytes taken by t=5; 1 MB handed at t=9, 20 KB of it taken by 15
    assert feed(rule, [(0, 0, 100), (5, 100, 100), (9, 100, 1_000_100),
                       (15, 20_100, 1_000_100)]) == [False] * 4


@pytest.mark.parametrize(("window_s", "floor"), [(0, 1024), (-1, 1024), (10, -1)])
def test_bad_parameters_are_refused(window_s: float, floor: float) -> None:
    with pytest.raises(ValueError, match="window_s"):
        ReadRateRule(window_s, floor)
