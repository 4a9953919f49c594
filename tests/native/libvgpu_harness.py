"""Harness for the libvgpu tests: a fresh "container" (region file + stub state) per test."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "libvgpu"
BUILD = NATIVE / "build"


def build(target: str | None = None) -> None:
    """``make -C native/libvgpu [target]``; skips the calling test when there is no C toolchain."""
    import pytest

    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C toolchain")
    cmd = ["make", "-s", "-C", str(NATIVE)]
    if target:
        cmd.append(target)
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class Env:
    """A fresh container: its own region file and stub-driver state."""

    tmp: Path
    build: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def region_path(self) -> Path:
        return self.tmp / "vgpu.cache"

    def environ(self, preload: bool = True, **kv: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "VGPU_", "GPU_CORE", "LIBCUDA"))}
        env.update(
            LD_LIBRARY_PATH=str(self.build / "stub"),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.region_path),
            VGPU_STUB_STATE=str(self.tmp / "stub.state"),
        )
        if preload:
            env["LD_PRELOAD"] = str(self.build / "libvgpu.so")
        env.update(self.extra)
        env.update(kv)
        return env

    def run(self, *args: str, prog: str = "vgtest", check: bool = True, preload: bool = True,
            timeout: float = 60, **kv: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([str(self.build / "tests" / prog), *args], env=self.environ(preload, **kv),
                           capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{prog} {' '.join(args)} failed rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def popen(self, *args: str, **kv: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.build / "tests" / "vgtest"), *args], env=self.environ(True, **kv),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(out: str, tag: str) -> list[list[int]]:
    """Numeric fields of every stdout line starting with ``tag``."""
    return [[int(x) for x in ln.split()[1:]] for ln in out.splitlines() if ln.split()[:1] == [tag]]
