"""Fixtures for the libvgpu tests: build once, run C programs under LD_PRELOAD on the stub driver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from libvgpu_harness import BUILD, Env, build


@pytest.fixture(scope="session")
def built() -> Path:
    build()
    return BUILD


@pytest.fixture
def env(built: Path, tmp_path: Path) -> Iterator[Env]:
    yield Env(tmp_path, built)
