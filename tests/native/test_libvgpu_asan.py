"""Memory-safety run: the library, stubs and C test programs built with
AddressSanitizer + UBSan (``make -C native/libvgpu asan``) exercising every
allocation path, fork, the cudart-style lookup and the parsers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from libvgpu_harness import BUILD, VALGRIND, Env, build, lines

pytestmark = pytest.mark.native

MiB = 1 << 20


@pytest.fixture(scope="module")
def asan_env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    build()  # skips when there is no C toolchain
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not Path(libasan).is_absolute() or not Path(libasan).exists():
        pytest.skip("libasan not available")
    build("asan")
    e = Env(tmp_path_factory.mktemp("asan"), BUILD / "asan")
    e.extra = {
        "LD_PRELOAD": f"{libasan}:{BUILD / 'asan' / 'libvgpu.so'}",
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    return e


def _clean(p: subprocess.CompletedProcess[str]) -> None:
    assert "ERROR: AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr


def test_asan_all_paths_and_fork(asan_env: Env) -> None:
    args = ["init"]
    for kind in ("mem", "managed", "async", "async_ptsz", "pool", "vmm", "vmm_host", "pitch", "array", "array3d",
                "mipmap", "ctx"):
        args += ["alloc", kind, str(3 * MiB), "0"]
    args += ["alloc", "mem", str(64 * MiB), "2", "info", "nvml", "0", "launch", "100", "4", "freeall", "info",
             "fork", "init", "dev", "0", "alloc", "mem", "100", "0", "info"]
    for _ in range(200):
        args += ["alloc", "mem", "4096", "0"]
    args += ["freeall"]
    _clean(asan_env.run(*args, CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_SM_LIMIT="50", VGPU_STUB_CTX_MB="1"))


def test_asan_fork_while_the_watcher_starts(asan_env: Env) -> None:
    """200 children each start their watcher thread (cuInit) and fork at once; every
    grandchild runs LSan's exit-time check. A fork while the new watcher was still in
    its ASan start-up (allocating) once left the child with the sanitizer allocator's
    lock held, and that check hung; a stuck child is killed after 30 s and counted."""
    p = asan_env.run("init", "forkstorm", "200", CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_SM_LIMIT="50",
                     timeout=600)
    _clean(p)
    assert lines(p.stdout, "forkstorm") == [[200, 0]], p.stdout + p.stderr


def test_asan_fake_runtime_and_parser(asan_env: Env) -> None:
    for mode in ("12", "11"):
        _clean(asan_env.run(mode, str(48 * MiB), prog="fake_runtime", CUDA_DEVICE_MEMORY_LIMIT="48m",
                            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(asan_env.tmp / f"r{mode}"),
                            VGPU_STUB_STATE=str(asan_env.tmp / f"s{mode}")))
    _clean(asan_env.run(prog="test_parse", preload=False))
    _clean(asan_env.run("init", "info", CUDA_DEVICE_MEMORY_LIMIT="2gbx",
                        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(asan_env.tmp / "bad")))


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind")
def test_valgrind_memcheck(env: Env) -> None:
    """The optimised (shipped) build under memcheck: no invalid access or uninitialised use."""
    cmd = [*VALGRIND, str(env.build / "tests" / "vgtest"), "init",
           "alloc", "mem", "1000", "0", "alloc", "pitch", "51200", "0", "alloc", "vmm", "4096", "0",
           "alloc", "mipmap", "6000", "0", "alloc", "pool1", "4096", "0", "info", "nvml", "0",
           "launch", "20", "1", "threads", "2", "50", "4096", "freeall", "info"]
    p = subprocess.run(cmd, env=env.environ(CUDA_DEVICE_MEMORY_LIMIT="48m", CUDA_DEVICE_SM_LIMIT="50"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def test_asan_limits_file_and_host_pid_rounds(asan_env: Env) -> None:
    """The limits-file reader (valid, oversized, too many lines, malformed) and the
    retried host-PID detection, with nothing but the preload in the environment (and the
    region's path: the files that name none would else use libvgpu's default,
    /tmp/cudevshr.cache on the host, left behind)."""
    d = asan_env.tmp / "vgpu"
    d.mkdir(exist_ok=True)
    shutil.copy(asan_env.build / "libvgpu.so", d / "libvgpu.so")
    env = {k: v for k, v in asan_env.environ().items() if not k.startswith("CUDA_")}
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(asan_env.tmp / "env.cache")
    env["LD_PRELOAD"] = env["LD_PRELOAD"].replace(str(asan_env.build / "libvgpu.so"), str(d / "libvgpu.so"))
    cases = [f"CUDA_DEVICE_MEMORY_LIMIT_0=48m\nCUDA_DEVICE_SM_LIMIT=30\n# comment\n\n"
             f"CUDA_DEVICE_MEMORY_SHARED_CACHE={d}/x.cache",
             "K=" + "v" * 20000, "".join(f"K{i}=1\n" for i in range(100)), "=\n", "CUDA_DEVICE_SM_LIMIT_0=101\n"]
    for i, text in enumerate(cases):
        (d / "limits.env").write_text(text)
        p = subprocess.run([str(asan_env.build / "tests" / "vgtest"), "init", "alloc", "mem", str(49 * MiB), "2",
                            "info"], env={**env, "VGPU_STUB_PID_OFFSET": "1000",
                                          "VGPU_STUB_STATE": str(asan_env.tmp / f"lim{i}")},
                           capture_output=True, text=True, timeout=120)
        _clean(p)
        assert p.returncode == 0, p.stderr
    assert (d / "x.cache").exists() and (asan_env.tmp / "env.cache").exists()


# the allocation patterns of real frameworks (test_libvgpu_patterns.py): pools with a
# release threshold and trim, VMM map / release / unmap, export and import, CUDA IPC,
# graph memory nodes
PATTERNS = ["init", "poolset", str(64 * MiB), "alloc", "async", str(8 * MiB), "0", "alloc", "pool", str(MiB), "0",
            "free", "free", "sync", "pool", "pooltrim", "0", "alloc", "async", str(MiB), "0", "free", "sync",
            "alloc", "vmm", str(4 * MiB), "0", "vmap", "vexport", "vrelease", "info", "vunmap",
            "alloc", "vmm", str(2 * MiB), "0", "vmap", "vunmap", "free", "info", "phys", "0",
            "graph", str(MiB), "1", "glaunch", "0", "glaunch", "0", "gmem", "gtrim", "free",
            "graph", str(MiB), "0", "glaunch", "0", "gfree", "gtrim", "free",
            "capture", str(MiB), "1", "glaunch", "0", "gtrim", "free", "alloc", "mem", str(40 * MiB), "0",
            "capture", str(16 * MiB), "0", "glaunch", "2", "free", "free", "info",
            "gtree", str(MiB), "2", "1", "move", "0", "glaunch", "0", "gfree", "gtrim", "free",
            "gtree", "0", "2", "1", "clone", "0", "glaunch", "0", "free", "gchildrules"]


def test_asan_framework_patterns(asan_env: Env) -> None:
    _clean(asan_env.run(*PATTERNS, CUDA_DEVICE_MEMORY_LIMIT="48m"))
    a = asan_env.popen("init", "alloc", "mem", str(MiB), "0", "ipcget", "alloc", "vmm", str(MiB), "0", "vexport",
                       "echo", "ready", "hold", CUDA_DEVICE_MEMORY_LIMIT="48m")
    try:
        out = []
        assert a.stdout is not None
        for line in a.stdout:
            out.append(line)
            if line.strip() == "ready":
                break
        hexh = next(ln.split()[1] for ln in out if ln.startswith("ipc "))
        pid, fd = next(ln.split()[1:] for ln in out if ln.startswith("fd "))
        _clean(asan_env.run("init", "ipcopen", hexh, "0", "memfree", "1", "vimport", pid, fd, str(MiB), "0", "vmap",
                            "vunmap", "freeall", "info", CUDA_DEVICE_MEMORY_LIMIT="48m"))
    finally:
        a.kill()
        a.wait()
        for f in (a.stdout, a.stderr):
            if f:
                f.close()


def test_asan_child_graphs_and_their_bounds(asan_env: Env) -> None:
    """Allocation nodes in child graphs refused and counted, and graphs past the walk's
    bounds (17 levels; 2^20 + 1 nodes) refused (test_libvgpu_childgraph.py)."""
    p = asan_env.run("init", "info", "alloc", "mem", str(16 * MiB), "0", "gtree", str(40 * MiB), "2", "0", "move", "0",
                     "glaunch", "2", "free", "free", "gtree", str(40 * MiB), "16", "0", "move", "0", "glaunch", "0",
                     "gfree", "gtrim", "free", "gtree", "4096", "17", "0", "move", "2", "gtree", "0", "17", "1", "clone",
                     "2", "gtree", "4096", "1", str((1 << 20) - 1), "move", "2", "info", CUDA_DEVICE_MEMORY_LIMIT="48m")
    _clean(p)
    assert [ln[0] for ln in lines(p.stdout, "gtree")] == [0, 0, 2, 2, 2]
    before, after = lines(p.stdout, "info")
    assert after == before  # the fixture's region is the module's: other tests' processes may be in it


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind")
def test_valgrind_framework_patterns(env: Env) -> None:
    p = subprocess.run([*VALGRIND, str(env.build / "tests" / "vgtest"), *PATTERNS],
                       env=env.environ(CUDA_DEVICE_MEMORY_LIMIT="48m"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
