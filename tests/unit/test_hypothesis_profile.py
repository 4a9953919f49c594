"""The property tests run without hypothesis' wall-clock deadline (tests/conftest.py):
on a loaded CI machine one slow example must not fail a test about correctness."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_the_loaded_profile_has_no_deadline_and_no_too_slow_check() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


@settings(max_examples=2)  # a test's own settings keep the profile's deadline
@given(st.integers())
def test_an_example_slower_than_the_default_deadline_passes(n: int) -> None:
    time.sleep(0.25)  # hypothesis' default deadline is 200 ms
    assert isinstance(n, int)
