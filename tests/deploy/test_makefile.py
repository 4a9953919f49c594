"""The Makefile's first-run commands (issue 14 §5): `make simulate` installs only what
simulating needs and lets pip show its progress; `make setup` (and so `make test`) installs
the developer tools too."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT


def dry_run(target: str, tmp_path: Path) -> list[str]:
    """What `make <target>` would run on a fresh clone (a venv that does not exist yet)."""
    if not shutil.which("make"):
        pytest.skip("no make")
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


def test_make_simulate_installs_no_developer_tools_and_shows_progress(tmp_path: Path) -> None:
    lines = dry_run("simulate", tmp_path)
    installs = [ln for ln in lines if "pip install" in ln]
    assert installs and not any("[dev]" in ln for ln in installs), installs
    assert not any(" -q" in ln for ln in installs), "pip runs quietly: no progress shown"
    assert any("hami simulate" in ln for ln in lines)
    assert any("bin/hami" in ln and "activate" in ln for ln in lines if "echo" in ln)


def test_make_setup_installs_the_developer_tools(tmp_path: Path) -> None:
    assert any("pip install" in ln and "'.[dev]'" in ln for ln in dry_run("setup", tmp_path))
