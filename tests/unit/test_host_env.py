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
