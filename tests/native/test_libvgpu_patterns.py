"""The allocation paths of real frameworks (issue 26 §3): CUDA IPC, virtual memory
management, stream-ordered pools. Each is counted once, on the right device, and
released once, on the stub driver, which models each API as the CUDA driver API
reference describes it (native/libvgpu/stub/stub_mem.h, stub_pool.h).

``phys N`` is what the stub's device really holds; ``info`` is cuMemGetInfo through
libvgpu (free, total of the slice); the limit is 48 MiB.
"""

from __future__ import annotations

import subprocess

import pytest
from libvgpu_harness import LIM, LIMIT, OOM, Env, MiB, free_of, lines, phys_of, until

pytestmark = pytest.mark.native

def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()
    for f in (p.stdout, p.stderr):
        if f:
            f.close()


# ------------------------------------------------------------ virtual memory management
def test_vmm_handle_released_while_mapped_stays_counted_until_the_last_unmap(env: Env) -> None:
    """create, map, release (the handle is gone, the mapping keeps the memory): still
    counted, so nothing can be allocated past the limit; unmapping frees it, once."""
    p = env.run("init", "alloc", "vmm", str(40 * MiB), "0", "vmap", "vrelease", "info", "phys", "0",
                "alloc", "mem", str(9 * MiB), OOM, "alloc", "mem", str(8 * MiB), "0", "free",
                "vunmap", "info", "phys", "0", "alloc", "mem", str(LIMIT), "0", **LIM)
    assert free_of(p.stdout) == [8 * MiB, LIMIT]
    assert phys_of(p.stdout) == [40 * MiB, 0]


def test_vmm_reserve_map_export_allocate_nothing_and_release_frees_once(env: Env) -> None:
    p = env.run("init", "alloc", "vmm", str(16 * MiB), "0", "info", "vmap", "vexport", "info", "phys", "0",
                "vunmap", "info", "free", "info", "phys", "0", **LIM)
    assert free_of(p.stdout) == [32 * MiB, 32 * MiB, 32 * MiB, LIMIT]
    assert phys_of(p.stdout) == [16 * MiB, 0]


def test_vmm_imported_handle_is_counted_once_by_its_creator(env: Env) -> None:
    """Process A creates and exports 16 MiB; B imports and maps it: no new device memory,
    B sees it counted once (A's); B can still allocate exactly the rest; B's release of
    its reference frees nothing A owns."""
    a = env.popen("init", "alloc", "vmm", str(16 * MiB), "0", "vexport", "echo", "ready", "hold", **LIM)
    try:
        out = until(a, "ready")
        (pid, fd), = lines(out, "fd")
        b = env.run("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "info", "vmap", "info",
                    "alloc", "mem", str(32 * MiB + 1), OOM, "vunmap", "free", "info", "phys", "0",
                    "alloc", "mem", str(32 * MiB), "0", **LIM)
        assert free_of(b.stdout) == [32 * MiB] * 3
        assert phys_of(b.stdout) == [16 * MiB]
    finally:
        _stop(a)


def test_vmm_import_of_a_released_allocation_is_refused(env: Env) -> None:
    a = env.popen("init", "alloc", "vmm", str(16 * MiB), "0", "vexport", "free", "echo", "ready", "hold", **LIM)
    try:
        (pid, fd), = lines(until(a, "ready"), "fd")
        b = env.run("init", "vimport", str(pid), str(fd), str(16 * MiB), "1", "info", "phys", "0", **LIM)
        assert free_of(b.stdout) == [LIMIT] and phys_of(b.stdout) == [0]
    finally:
        _stop(a)


def test_vmm_creator_killed_while_imported_the_memory_stays_until_the_importer_releases(env: Env) -> None:
    """The stub's model of the driver: a killed creator's references go with it, the
    importer's keep the memory on the device; the importer's unmap and release free it."""
    a = env.popen("init", "alloc", "vmm", str(16 * MiB), "0", "vexport", "echo", "ready", "hold", **LIM)
    try:
        (pid, fd), = lines(until(a, "ready"), "fd")
        go = env.tmp / "go"
        b = env.popen("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "vmap", "echo", "imported",
                      "waitfile", str(go), "vunmap", "free", "phys", "0", **LIM)
        try:
            until(b, "imported")
            a.kill()
            a.wait()
            assert phys_of(env.run("init", "phys", "0", **LIM).stdout) == [16 * MiB]
            go.touch()  # only now may the importer unmap and release
            out, err = b.communicate(timeout=60)
            assert "waitfile timeout" not in out
            assert b.returncode == 0, err
            assert phys_of(out) == [0]
        finally:
            _stop(b)
    finally:
        _stop(a)


def test_vmm_import_outliving_the_creators_reference_stays_counted(env: Env) -> None:
    a = env.popen("init", "alloc", "vmm", str(16 * MiB), "0", "vexport", "echo", "ready", "hold", **LIM)
    try:
        (pid, fd), = lines(until(a, "ready"), "fd")
        b = env.popen("init", "vimport", str(pid), str(fd), str(16 * MiB), "0", "echo", "imported", "hold", **LIM)
        try:
            until(b, "imported")
            c = env.run("init", "info", "phys", "0", **LIM)
            assert free_of(c.stdout) == [32 * MiB]
            a.kill()  # the creator's references go with it; B's import keeps the memory
            a.wait()
            c = env.run("init", "info", "phys", "0", **LIM)
            assert phys_of(c.stdout) == [16 * MiB]
            assert free_of(c.stdout) == [32 * MiB]
        finally:
            _stop(b)
    finally:
        _stop(a)


def test_vmm_export_import_exit_cannot_take_more_than_the_limit(env: Env) -> None:
    """The attacker's path: A takes the whole limit with cuMemCreate, exports it; B
    imports and maps it and holds it; A exits. The device still holds the limit's worth
    (B's reference), so a new allocation of the full limit must be refused. Today it is
    granted: the container ends up with twice its limit on the device (and can repeat)."""
    a = env.popen("init", "alloc", "vmm", str(LIMIT), "0", "vexport", "echo", "ready", "hold", **LIM)
    try:
        (pid, fd), = lines(until(a, "ready"), "fd")
        b = env.popen("init", "vimport", str(pid), str(fd), str(LIMIT), "0", "vmap", "echo", "imported", "hold",
                      **LIM)
        try:
            until(b, "imported")
            a.kill()
            a.wait()
            c = env.run("init", "info", "phys", "0", "alloc", "vmm", str(LIMIT), "0", "phys", "0", check=False, **LIM)
            assert phys_of(c.stdout)[:1] == [LIMIT]
            assert c.returncode != 0, f"granted beyond the limit: device holds {phys_of(c.stdout)} bytes"
        finally:
            _stop(b)
    finally:
        _stop(a)


# ------------------------------------------------------------------------- CUDA IPC
def test_ipc_opened_memory_is_counted_once_and_closing_releases_nothing_owned(env: Env) -> None:
    a = env.popen("init", "alloc", "mem", str(16 * MiB), "0", "ipcget", "echo", "ready", "hold", **LIM)
    try:
        out = until(a, "ready")
        hexh = next(ln.split()[1] for ln in out.splitlines() if ln.startswith("ipc "))
        b = env.run("init", "ipcopen", hexh, "0", "info", "ipcopen", hexh, "0", "info",
                    "alloc", "mem", str(32 * MiB + 1), OOM, "alloc", "mem", str(32 * MiB), "0", "free",
                    "free", "info", "memfree", "1", "free", "info", "phys", "0", **LIM)
        # open twice (one mapping, two references), a cuMemFree of the opened address is
        # refused and releases nothing, the closes release nothing: A's 16 MiB stay, once
        assert free_of(b.stdout) == [32 * MiB] * 4
        assert phys_of(b.stdout) == [16 * MiB]
        a.kill()
        a.wait()
        c = env.run("init", "info", "phys", "0", **LIM)
        assert free_of(c.stdout) == [LIMIT] and phys_of(c.stdout) == [0]
    finally:
        _stop(a)


# ------------------------------------------------------------ stream-ordered allocation
def test_pool_memory_freed_async_stays_counted_until_the_pool_gives_it_back(env: Env) -> None:
    """cuMemFreeAsync returns memory to the pool, not to the device: until the next
    synchronisation the pool holds it, and the limit holds on what the pool holds."""
    p = env.run("init", "alloc", "async", str(40 * MiB), "0", "free", "info", "pool", "phys", "0",
                "alloc", "mem", str(9 * MiB), OOM, "sync", "info", "pool", "phys", "0",
                "alloc", "mem", str(LIMIT), "0", **LIM)
    assert free_of(p.stdout) == [8 * MiB, LIMIT]
    assert lines(p.stdout, "pool") == [[40 * MiB, 0], [0, 0]]
    assert phys_of(p.stdout) == [40 * MiB, 0]


def test_pool_release_threshold_and_trim(env: Env) -> None:
    """A release threshold keeps freed memory in the pool across synchronisations (still
    counted, and reused by the pool without a second charge); cuMemPoolTrimTo gives it
    back to the device and the count follows."""
    p = env.run("init", "poolset", str(64 * MiB), "alloc", "async", str(40 * MiB), "0", "free", "sync", "info",
                "pool", "alloc", "mem", str(9 * MiB), OOM, "alloc", "async", str(40 * MiB), "0",
                "alloc", "async", str(8 * MiB), "0", "alloc", "async", "1", OOM, "info",
                "free", "free", "sync", "pooltrim", str(16 * MiB), "info", "pool", "phys", "0",
                "pooltrim", "0", "info", "pool", "phys", "0", **LIM)
    assert free_of(p.stdout) == [8 * MiB, 0, 32 * MiB, LIMIT]
    assert lines(p.stdout, "pool") == [[40 * MiB, 0], [16 * MiB, 0], [0, 0]]
    assert phys_of(p.stdout) == [16 * MiB, 0]


def test_pool_allocation_served_from_the_pool_is_not_refused(env: Env) -> None:
    """The pool holds 40 MiB of which 24 are in use: a 16 MiB allocation needs no new
    device memory and passes although 40 + 16 > 48; 17 MiB needs 1 more and passes; the
    device then holds 41 MiB, counted."""
    p = env.run("init", "poolset", str(64 * MiB), "alloc", "async", str(24 * MiB), "0",
                "alloc", "async", str(16 * MiB), "0", "free", "sync", "info",
                "alloc", "async", str(16 * MiB), "0", "free", "alloc", "async", str(17 * MiB), "0", "info",
                "pool", "phys", "0", "alloc", "mem", str(7 * MiB + 1), OOM, **LIM)
    assert free_of(p.stdout) == [8 * MiB, 7 * MiB]
    assert lines(p.stdout, "pool") == [[41 * MiB, 41 * MiB]]
    assert phys_of(p.stdout) == [41 * MiB]


# ------------------------------------------------------------ CUDA graph memory nodes
def test_graph_memory_is_counted_when_the_graph_runs_and_until_trim(env: Env) -> None:
    """Adding an allocation node and instantiating allocate nothing; the launch takes 40
    MiB into the device's graph pool (counted), which keeps it after the graph's free node
    (still counted, reused by the next launch without a second charge) until
    cuDeviceGraphMemTrim."""
    p = env.run("init", "graph", str(40 * MiB), "1", "info", "phys", "0", "glaunch", "0", "info", "gmem", "phys", "0",
                "alloc", "mem", str(9 * MiB), OOM, "glaunch", "0", "info", "gtrim", "info", "gmem", "phys", "0",
                "alloc", "mem", str(LIMIT), "0", **LIM)
    assert free_of(p.stdout) == [LIMIT, 8 * MiB, 8 * MiB, LIMIT]
    assert lines(p.stdout, "gmem") == [[40 * MiB, 0], [0, 0]]
    assert phys_of(p.stdout) == [0, 40 * MiB, 0]


@pytest.mark.parametrize("made_by", ["graph", "capture"])
def test_graph_launch_past_the_limit_is_refused(env: Env, made_by: str) -> None:
    """16 MiB held: a graph allocating 40 MiB would pass the 48 MiB limit, so its launch
    fails with CUDA_ERROR_OUT_OF_MEMORY and allocates nothing; after the free it runs. Its
    allocation, not freed in the graph, is freed by cuMemFreeAsync into the graph pool
    (still held, still counted) and trimmed. The graph is built with
    cuGraphAddMemAllocNode, or by stream capture of cuMemAllocAsync and instantiated with
    cuGraphInstantiateWithParams (the library reads its allocation nodes from the graph)."""
    p = env.run("init", "alloc", "mem", str(16 * MiB), "0", made_by, str(40 * MiB), "0", "glaunch", OOM, "info",
                "phys", "0", "gmem", **LIM)
    assert free_of(p.stdout) == [32 * MiB]
    assert phys_of(p.stdout) == [16 * MiB]
    assert lines(p.stdout, "gmem") == [[0, 0]]
    q = env.run("init", made_by, str(40 * MiB), "0", "glaunch", "0", "info", "alloc", "mem", str(8 * MiB + 1), OOM,
                "gfree", "info", "gmem", "gtrim", "info", "phys", "0", **LIM)
    assert free_of(q.stdout) == [8 * MiB, 8 * MiB, LIMIT]
    assert lines(q.stdout, "gmem") == [[40 * MiB, 0]]
    assert phys_of(q.stdout) == [0]


def test_pool_memory_given_back_at_event_synchronize_leaves_the_count_for_every_process(env: Env) -> None:
    """Process A's pool gives its 40 MiB back at cuEventSynchronize: the count drops
    then, so process B of the container gets the whole limit while A lives on."""
    a = env.popen("init", "alloc", "async", str(40 * MiB), "0", "free", "esync", "echo", "ready", "hold", **LIM)
    try:
        until(a, "ready")
        b = env.run("init", "info", "alloc", "mem", str(LIMIT), "0", "phys", "0", **LIM)
        assert free_of(b.stdout) == [LIMIT] and phys_of(b.stdout) == [LIMIT]
    finally:
        _stop(a)


def test_pools_graphs_and_vmm_count_on_the_card_the_mask_names(env: Env) -> None:
    """With CUDA_VISIBLE_DEVICES=1 the process's device 0 is card 1 (16 MiB limit): a
    graph needing 17 MiB there is refused, the pool's kept memory, a mapped VMM
    allocation and the graph pool are all counted on card 1, none on card 0."""
    lim = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_MEMORY_LIMIT_1": "16m", "CUDA_VISIBLE_DEVICES": "1"}
    p = env.run("init", "graph", str(17 * MiB), "1", "glaunch", OOM, "free", "graph", str(4 * MiB), "1", "glaunch", "0",
                "poolset", str(64 * MiB), "alloc", "async", str(4 * MiB), "0", "free", "sync",
                "alloc", "vmm", str(4 * MiB), "0", "vmap", "vrelease", "info", "nvml", "0", "nvml", "1",
                "alloc", "mem", str(4 * MiB + 1), OOM, "alloc", "mem", str(4 * MiB), "0", **lim)
    assert free_of(p.stdout) == [4 * MiB]
    assert [ln[:3] for ln in lines(p.stdout, "nvml")] == [[0, 48 * MiB, 0], [1, 16 * MiB, 12 * MiB]]


def test_pool_destroyed_with_live_allocations_stays_counted(env: Env) -> None:
    """cuMemPoolDestroy returns at once while allocations from the pool are live; their
    memory stays on the device until they are freed, so it stays counted (the library
    keeps it counted until the process exits: it does not follow each pointer)."""
    p = env.run("init", "poolmk", "alloc", "cpool", str(24 * MiB), "0", "alloc", "cpool", str(16 * MiB), "0",
                "free", "pooldestroy", "info", "phys", "0", "alloc", "mem", str(24 * MiB + 1), OOM,
                "alloc", "mem", str(24 * MiB), "0", **LIM)
    assert free_of(p.stdout) == [24 * MiB]
    assert phys_of(p.stdout) == [24 * MiB]


def test_many_pools_are_all_counted(env: Env) -> None:
    """A process creating hundreds of pools cannot make one of them uncounted."""
    p = env.run("init", *(["poolmk"] * 300), "alloc", "cpool", str(LIMIT), "0", "alloc", "mem", "1", OOM, "info", **LIM)
    assert free_of(p.stdout) == [0]


def test_graphs_past_the_tracking_table_are_refused_not_unchecked(env: Env) -> None:
    """256 executable graphs with allocation nodes are tracked; the 257th is refused at
    instantiation (CUDA_ERROR_OUT_OF_MEMORY) instead of launching without a check."""
    p = env.run("init", *(["graph", "4096", "1"] * 256), "echo", "tracked", "graph", "4096", "1", check=False, **LIM)
    assert "tracked" in p.stdout.split()
    assert p.returncode == 1 and "cuGraphInstantiate (2 vs 0)" in p.stderr, p.stderr


def test_vmm_handle_value_reused_while_the_old_allocation_is_mapped(env: Env) -> None:
    """A released handle's value may come back from the next cuMemCreate while the old
    allocation is still mapped: the two allocations stay apart, each freed once."""
    p = env.run("init", "alloc", "vmm", str(40 * MiB), "0", "vmap", "vrelease",
                "alloc", "vmm", str(4 * MiB), "0", "info", "free", "info", "alloc", "mem", str(8 * MiB + 1), OOM,
                "vunmap", "info", "phys", "0", **LIM)
    assert free_of(p.stdout) == [4 * MiB, 8 * MiB, LIMIT]
    assert phys_of(p.stdout) == [0]
