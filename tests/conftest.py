"""Shared fixtures.

Field cases are tests in their own modules, each with its scenario written out there
(nodes, cards, quotas, pods); no test reads a file from outside the repository for them.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

# The suite runs on loaded 2-core CI machines: a property test's example may take longer
# than hypothesis' default 200 ms deadline (or its data generation trip the too_slow
# health check) for reasons that have nothing to do with the code under test, and
# hypothesis then fails the test (DeadlineExceeded, or FlakyFailure when a re-run is
# faster). Every property test inherits this profile; speed is measured in bench/.
# It starts from hypothesis' "default" profile, not from settings.default: hypothesis
# loads its own derandomized "ci" profile when the host sets CI (or GITHUB_ACTIONS, ...),
# and a profile built on that would make local-looking runs on such hosts derandomized.
settings.register_profile("hami", settings.get_profile("default"), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# CI (.ci/run sets HAMI_HYPOTHESIS_PROFILE=ci): the same, derandomized. Each property test
# draws the examples its own source code seeds, on every run, with no example database
# (a clean clone has none): a landing is not lost to a counter-example that a random draw
# happened to find that day, and `HAMI_HYPOTHESIS_PROFILE=ci pytest FILE` replays CI's
# examples exactly. Local runs stay random (and keep .hypothesis/'s database), so new
# counter-examples are still found, before a landing, where they can be fixed.
settings.register_profile("ci", settings.get_profile("hami"), derandomize=True, database=None,
                          print_blob=True)
settings.load_profile(os.environ.get("HAMI_HYPOTHESIS_PROFILE", "hami"))

#: Variables hami's components read from their environment as defaults (health-check
#: rules, the node's name and hook path, the kubelet socket, the monitor's resync, the
#: scheduler's own pod). A developer's shell or a CI host that sets one must not change
#: what a test sees: each test that wants one sets it itself (monkeypatch.setenv).
HOST_ENV_READ_BY_HAMI = ("DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS", "NODE_NAME",
                         "HOOK_PATH", "KUBELET_SOCKET", "HAMI_RESYNC_INTERVAL", "POD_NAME",
                         "POD_NAMESPACE")
#: The terminal settings rich (hami's CLI output) reads: with FORCE_COLOR=1 (which CI
#: systems often set) 13 CLI tests failed on escape codes in the text, with COLUMNS=50
#: one on wrapping. A test that wants a width passes COLUMNS to the command it runs.
#: typer forces a colour terminal when GITHUB_ACTIONS or PY_COLORS is set (5 help-text
#: tests failed on escape codes with GITHUB_ACTIONS=true).
HOST_ENV_TERMINAL = ("FORCE_COLOR", "NO_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE",
                     "TTY_INTERACTIVE", "COLUMNS", "LINES", "JUPYTER_COLUMNS", "JUPYTER_LINES",
                     "GITHUB_ACTIONS", "PY_COLORS")


@pytest.fixture(autouse=True)
def _no_host_env_read_by_hami(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HOST_ENV_READ_BY_HAMI + HOST_ENV_TERMINAL:
        monkeypatch.delenv(name, raising=False)
