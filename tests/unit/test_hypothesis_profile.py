"""The property tests run without hypothesis' wall-clock deadline (tests/conftest.py):
on a loaded CI machine one slow example must not fail a test about correctness. CI
(HAMI_HYPOTHESIS_PROFILE=ci, set by .ci/run) draws the same examples on every run."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def test_the_loaded_profile_has_no_deadline_and_no_too_slow_check() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


@settings(max_examples=2)  # a test's own settings keep the profile's deadline
@given(st.integers())
def test_an_example_slower_than_the_default_deadline_passes(n: int) -> None:
    time.sleep(0.25)  # hypothesis' default deadline is 200 ms
    assert isinstance(n, int)


def test_the_ci_profile_is_derandomized_without_a_database_or_deadline() -> None:
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None and ci.deadline is None
    assert HealthCheck.too_slow in ci.suppress_health_check


def test_the_ci_profile_draws_the_same_examples_on_every_run() -> None:
    def draws(profile: settings) -> list[int]:
        seen: list[int] = []

        @settings(profile, max_examples=30)
        @given(st.integers())
        def prop(n: int) -> None:
            seen.append(n)

        prop()
        return seen

    ci = settings.get_profile("ci")
    assert draws(ci) == draws(ci)
    # the local profile is random: 30 draws of an unbounded integer repeat with
    # probability far below 1e-30
    local = settings.get_profile("hami")
    assert draws(local) != draws(local)


def test_the_environment_selects_the_profile() -> None:
    code = ("import tests.conftest; from hypothesis import settings; "
            "print(settings.default.derandomize)")
    # A host that sets CI (most CI systems do) makes hypothesis load its own derandomized
    # profile on import; the choice between hami's profiles must not depend on it.
    for value, host_ci, expected in (("ci", None, "True"), (None, None, "False"),
                                     ("ci", "true", "True"), (None, "true", "False"),
                                     (None, "1", "False")):
        env = {k: v for k, v in os.environ.items()
               if k not in ("HAMI_HYPOTHESIS_PROFILE", "CI", "GITHUB_ACTIONS", "GITLAB_CI")}
        if value is not None:
            env["HAMI_HYPOTHESIS_PROFILE"] = value
        if host_ci is not None:
            env["CI"] = host_ci
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        assert out.split() == [expected]
    assert "HAMI_HYPOTHESIS_PROFILE=ci" in (ROOT / ".ci" / "run").read_text()


def test_no_test_drops_the_too_slow_suppression() -> None:
    """A test's own ``suppress_health_check`` replaces the profile's list: one that names
    other checks only is again failed by too_slow when its data generation is slow on a
    loaded machine."""
    dropped = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.keyword) and node.arg == "suppress_health_check"
                    and "too_slow" not in ast.unparse(node.value)):
                dropped.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    assert dropped == []
