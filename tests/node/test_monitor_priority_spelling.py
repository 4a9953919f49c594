"""The monitor reads ``CUDA_TASK_PRIORITY`` as C's ``atoi`` (and HAMi's monitor) would:
ASCII digits only. Python's ``\\d`` and ``int`` also take other scripts' digits, so the
monitor read ``"٠"`` (ARABIC-INDIC DIGIT ZERO), ``"０"`` (FULLWIDTH DIGIT ZERO) or
``"०"`` as priority 0, while admission (:mod:`hami.core.isolation`) did not see a 0 in
them: in DRA mode, where a container using hami's claim may set the env itself (only a
0 is refused outside the granted namespaces), a tenant got priority 0 without the grant
and blocked its priority-1 neighbour. Through the real monitor loop (``run_monitor``) on
real region files; an ASCII ``0`` (granted) still blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.core.isolation import security_violations
from hami.devices.registry import make_config
from tests.node.test_monitor_bounds import victim_blocked

SPELLINGS = ("\u0660", "\uff10", "\u0966", " \u0660 ", "\U0001d7ce")


def _victim_blocked_ticks(tmp_path: Path, attacker_priority: str,
                          granted: frozenset[str] | None = None) -> int:
    blocked = victim_blocked(tmp_path, attacker_priority, 5, granted)
    assert len(blocked) == 4
    return sum(blocked)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_another_scripts_zero_is_not_priority_0(tmp_path: Path, spelling: str) -> None:
    assert _victim_blocked_ticks(tmp_path, spelling) == 0      # was 4 of 4


def test_an_ascii_zero_still_blocks(tmp_path: Path) -> None:
    assert _victim_blocked_ticks(tmp_path, "0") == 4


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_admission_lets_through_only_what_the_monitor_does_not_read_as_0(spelling: str) -> None:
    """A container using hami's claim (DRA) may carry these spellings: admission does not
    refuse them, so the monitor must not read them as 0 (the test above)."""
    pod = {"metadata": {"namespace": "tenant"}, "spec": {"containers": [
        {"name": "main", "env": [{"name": "CUDA_TASK_PRIORITY", "value": spelling}]}]}}
    assert security_violations(pod, make_config(), {"main"}) == []
    zero = {"metadata": {"namespace": "tenant"}, "spec": {"containers": [
        {"name": "main", "env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]}]}}
    assert security_violations(zero, make_config(), {"main"})
