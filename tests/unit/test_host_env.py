"""The suite hides the host's settings of the variables hami reads, and of the terminal
(tests/conftest.py): with DP_DISABLE_HEALTHCHECKS set in a developer's shell the device
plugin's health tests failed, with FORCE_COLOR=1 CLI tests did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import HOST_ENV_READ_BY_HAMI, HOST_ENV_TERMINAL

ROOT = Path(__file__).resolve().parents[2]


def test_variables_hami_reads_are_hidden_from_every_test() -> None:
    if os.environ.get("HAMI_TEST_HOST_ENV_PROBE"):  # the run below, inside pytest
        assert [n for n in HOST_ENV_READ_BY_HAMI + HOST_ENV_TERMINAL if n in os.environ] == []
        return
    env = {**os.environ, "HAMI_TEST_HOST_ENV_PROBE": "1",
           **dict.fromkeys(HOST_ENV_READ_BY_HAMI + HOST_ENV_TERMINAL, "1")}
    node_id = f"{Path(__file__).relative_to(ROOT)}::{test_variables_hami_reads_are_hidden_from_every_test.__name__}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           node_id], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: What CI systems commonly set: CI and GITHUB_ACTIONS (hypothesis loads its derandomized
#: profile on either; typer forces colour on GITHUB_ACTIONS), and the colour forcers.
CI_HOST_ENV = {"CI": "true", "GITHUB_ACTIONS": "true", "PY_COLORS": "1", "FORCE_COLOR": "1"}


def test_help_and_profile_tests_pass_on_a_host_that_looks_like_ci() -> None:
    """The landing of a whole session was lost to two tests that passed here and failed
    on the project's CI host, which sets CI; a GITHUB_ACTIONS host failed five help-text
    tests on colour codes. Both kinds run here under such a host's environment."""
    env = {**os.environ, **CI_HOST_ENV}
    env.pop("HAMI_HYPOTHESIS_PROFILE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/test_hypothesis_profile.py",
         "tests/sim/test_priority_cli.py::test_help_documents_the_option_and_the_mapping",
         "tests/cli/test_help_text.py::test_completion_is_offered_once_by_the_root_command",
         "tests/cli/test_hami_flags.py::test_bad_boolean_value_is_a_usage_error"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
