"""Fixtures for the libvgpu tests: build once, run C programs under LD_PRELOAD on the stub driver."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from libvgpu_harness import BUILD, NATIVE, Env


def build(target: str | None = None) -> None:
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C toolchain")
    cmd = ["make", "-s", "-C", str(NATIVE)]
    if target:
        cmd.append(target)
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def built() -> Path:
    build()
    return BUILD


@pytest.fixture
def env(built: Path, tmp_path: Path) -> Iterator[Env]:
    yield Env(tmp_path, built)
