"""Fixtures of the simulator tests: the openb trace directory (skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def openb_dir() -> Path:
    """``$HAMI_OPENB_DIR`` or ``../shared/data/openb`` relative to the repository root."""
    env = os.environ.get("HAMI_OPENB_DIR")
    return Path(env) if env else (REPO / ".." / "shared" / "data" / "openb").resolve()


@pytest.fixture(scope="session")
def trace_dir() -> Path:
    path = openb_dir()
    if not (path / "openb_node_list_gpu_node.csv").is_file():
        pytest.skip(f"openb trace not found at {path}")
    return path
