"""Limits and usage per container device, whatever the process's device mask (issue 26 §1).

The stub's libcuda orders and filters devices as the real driver does (CUDA_DEVICE_ORDER,
CUDA_VISIBLE_DEVICES: ordinals, UUIDs, MIG UUIDs, an invalid entry that ends the list);
its NVML, like the real one, ignores both. The container's device ``i`` is NVML's index
``i``: ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` and the region's ``uuids[i]``/``used[i]`` belong
to it. Every shape below must give each CUDA device the limit of the container device
with its UUID and count its usage there, with the plain build, under ASan and under
valgrind.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from libvgpu_harness import BUILD, FREE, STEADY, VALGRIND, Env, build, lines, steady_busy_percent

from hami.monitor import region as reg
from hami.testing.gpupods import stub_uuid

pytestmark = pytest.mark.native

MiB = 1 << 20
LIMITS = (48 * MiB, 16 * MiB)  # container device 0, 1: distinct, so a wrong device shows
LIMIT_ENV = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_MEMORY_LIMIT_1": "16m"}


def mig_uuid(phys: int) -> str:
    """The stub's MIG instance on physical device ``phys`` (stub_state.h)."""
    return f"MIG-5a1e0000-0000-4000-9000-{phys:012x}"


# shape -> (env, container device of each CUDA ordinal, physical device of each container device)
SHAPES: dict[str, tuple[dict[str, str], list[int], list[int]]] = {
    "unset": ({}, [0, 1], [0, 1]),
    "ordinal_0": ({"CUDA_VISIBLE_DEVICES": "0"}, [0], [0, 1]),
    "ordinal_1": ({"CUDA_VISIBLE_DEVICES": "1"}, [1], [0, 1]),
    "reversed": ({"CUDA_VISIBLE_DEVICES": "1,0"}, [1, 0], [0, 1]),
    "uuid": ({"CUDA_VISIBLE_DEVICES": stub_uuid(1)}, [1], [0, 1]),
    "uuids_reversed": ({"CUDA_VISIBLE_DEVICES": f"{stub_uuid(1)},{stub_uuid(0)}"}, [1, 0], [0, 1]),
    "mig_uuid": ({"CUDA_VISIBLE_DEVICES": mig_uuid(1)}, [1], [0, 1]),
    "invalid_entry_truncates": ({"CUDA_VISIBLE_DEVICES": "1,7,0"}, [1], [0, 1]),
    "fastest_first_default": ({"VGPU_STUB_SM_COUNTS": "10,20"}, [1, 0], [0, 1]),
    "fastest_first_ordinal_0": ({"VGPU_STUB_SM_COUNTS": "10,20", "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
                                 "CUDA_VISIBLE_DEVICES": "0"}, [1], [0, 1]),
    "pci_bus_id": ({"VGPU_STUB_SM_COUNTS": "10,20", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0, 1], [0, 1]),
    # the runtime gives the container its cards in NVIDIA_VISIBLE_DEVICES order (NVML's),
    # CUDA lists them in PCI order
    "runtime_order": ({"VGPU_STUB_RUNTIME": "nvidia",
                       "NVIDIA_VISIBLE_DEVICES": f"{stub_uuid(1)},{stub_uuid(0)}"}, [1, 0], [1, 0]),
    "runtime_order_ordinal_0": ({"VGPU_STUB_RUNTIME": "nvidia", "CUDA_VISIBLE_DEVICES": "0",
                                 "NVIDIA_VISIBLE_DEVICES": f"{stub_uuid(1)},{stub_uuid(0)}"}, [1], [1, 0]),
}


def script(ordinals: list[int]) -> list[str]:
    """Fill every CUDA device to its container device's limit: one byte over fails, the
    limit fits; then print memory info for each container device through NVML."""
    args = ["init"]
    for o, c in enumerate(ordinals):
        args += ["dev", str(o), "alloc", "mem", str(LIMITS[c] + 1), "2", "alloc", "mem", str(LIMITS[c]), "0",
                 "info", "total", str(o)]
    return [*args, "nvml", "0", "nvml", "1"]


def check(out: str, region: Path, ordinals: list[int], phys: list[int]) -> None:
    info, total = lines(out, "info"), lines(out, "total")
    for o, c in enumerate(ordinals):
        assert info[o][:2] == [0, LIMITS[c]], (o, c, out)
        assert total[o] == [o, LIMITS[c]]
    nvml = lines(out, "nvml")
    for c in (0, 1):
        used = LIMITS[c] if c in ordinals else 0
        assert nvml[c] == [c, LIMITS[c], used, LIMITS[c] - used], (c, out)
    r = reg.parse_region(region.read_bytes())
    assert r.uuids[:2] == (stub_uuid(phys[0]), stub_uuid(phys[1]))
    assert r.limit_bytes[:2] == LIMITS


def run_holding(env: Env, shape: str, runner: list[str], extra: dict[str, str]) -> None:
    """Run the script with a holder checking the region while the memory is held."""
    kv, ordinals, phys = SHAPES[shape]
    e = env.environ(**{**LIMIT_ENV, **kv, **extra})
    args = [*script(ordinals), "echo", "filled", "hold"]
    p = subprocess.Popen([*runner, str(env.build / "tests" / "vgtest"), *args], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out = []
    try:
        assert p.stdout is not None
        for line in p.stdout:
            out.append(line)
            if line.strip() == "filled":
                break
        else:
            raise AssertionError("".join(out) + (p.stderr.read() if p.stderr else ""))
        text = "".join(out)
        check(text, env.region_path, ordinals, phys)
        r = reg.parse_region(env.region_path.read_bytes())
        for c in (0, 1):  # the usage sits on the container device with the CUDA device's UUID
            assert r.used_memory_bytes(c) == (LIMITS[c] if c in ordinals else 0), (c, text)
    finally:
        p.kill()
        _, err = p.communicate(timeout=60)
    assert "ERROR: AddressSanitizer" not in err and "runtime error" not in err, err
    assert "Invalid read" not in err and "Invalid write" not in err and "uninitialised" not in err, err


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_device_mask_gets_the_container_devices_limit_and_usage(env: Env, shape: str) -> None:
    run_holding(env, shape, [], {})


@pytest.fixture(scope="module")
def asan_env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    build()
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not Path(libasan).is_absolute() or not Path(libasan).exists():
        pytest.skip("libasan not available")
    build("asan")
    e = Env(tmp_path_factory.mktemp("asan-dev"), BUILD / "asan")
    e.extra = {"LD_PRELOAD": f"{libasan}:{BUILD / 'asan' / 'libvgpu.so'}",
               "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=23",
               "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    return e


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_device_mask_under_asan(asan_env: Env, shape: str, tmp_path: Path) -> None:
    e = Env(tmp_path, asan_env.build, dict(asan_env.extra))
    run_holding(e, shape, [], {})


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind")
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_device_mask_under_valgrind(env: Env, shape: str) -> None:
    run_holding(env, shape, VALGRIND, {})


def test_a_reordered_process_cannot_double_a_card(env: Env) -> None:
    """The measured case: A fills GPU 0; B with CUDA_VISIBLE_DEVICES=1,0 asks for more
    on its ordinal 1 (= GPU 0). Before, B got another 48 MiB there (96 MiB on a card
    granted 48) and its usage showed on GPU 1's UUID."""
    both = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_MEMORY_LIMIT_1": "48m"}
    holder = env.popen("init", "alloc", "mem", str(48 * MiB), "0", "echo", "filled", "hold", **both)
    try:
        assert holder.stdout is not None and holder.stdout.readline()  # alloc line
        assert holder.stdout.readline().strip() == "filled"
        b = env.popen("init", "dev", "1", "alloc", "mem", "1", "2", "info",
                      "dev", "0", "alloc", "mem", str(48 * MiB), "0", "info", "echo", "filled", "hold",
                      CUDA_VISIBLE_DEVICES="1,0", **both)
        try:
            assert b.stdout is not None
            out = []
            for line in b.stdout:
                out.append(line)
                if line.strip() == "filled":
                    break
            text = "".join(out)
            assert lines(text, "info") == [[0, 48 * MiB, 0], [0, 48 * MiB, 0]], text
            r = reg.parse_region(env.region_path.read_bytes())
            assert (r.used_memory_bytes(0), r.used_memory_bytes(1)) == (48 * MiB, 48 * MiB)
            by_pid = {s.pid: s for s in r.active_procs()}
            assert by_pid[b.pid].devices[0].used_memory_bytes == 0  # B's GPU 1 usage is not on GPU 0
            assert by_pid[b.pid].devices[1].used_memory_bytes == 48 * MiB
        finally:
            b.kill()
            b.wait()
    finally:
        holder.kill()
        holder.wait()


def test_sm_limit_follows_the_device_not_the_ordinal(env: Env) -> None:
    """CUDA_DEVICE_SM_LIMIT_1=30: a process that sees only GPU 1 (as its ordinal 0) keeps
    that GPU busy about 30 % of the time (test_libvgpu_compute.py: the simulated GPU's
    busy percent, what an SM limit holds); on GPU 0 it runs free (about 99 %)."""
    busy = {"VGPU_STUB_NS_PER_BLOCK": "10000"}
    p = env.run("init", *STEADY, CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_SM_LIMIT_0="100",
                CUDA_DEVICE_SM_LIMIT_1="30", **busy)
    assert 15 <= steady_busy_percent(p.stdout) <= 45, p.stdout
    p = env.run("init", *FREE, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_SM_LIMIT_0="100",
                CUDA_DEVICE_SM_LIMIT_1="30", **busy)
    assert steady_busy_percent(p.stdout) > 75, p.stdout
