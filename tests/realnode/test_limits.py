"""GPU slices enforced in real containers.

The whole chain: webhook -> kube-scheduler + hami extender (filter, bind) -> the real
kubelet's GetPreferredAllocation/Allocate on hami's device plugin -> containerd/runc start
the container with the injected env, mounts and /etc/ld.so.preload -> libvgpu on the stub
CUDA driver, whose state file on the node is the "physical" card every container shares.
The monitor reads the containers' cache files from the hook path.
"""

from __future__ import annotations

import time
from typing import Any

from lightkube import codecs
from lightkube.resources.core_v1 import Pod
from prometheus_client.parser import text_string_to_metric_families

from hami.testing.controlplane import wait_until
from hami.testing.gpubed import STUB_DIR, GpuBed, gpu_test_pod, wait_pod_done
from tests.realnode.conftest import run_pod

MiB = 1 << 20
SHOW_ENV = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_[A-Z_0-9]*)=' | sort"


def lines(log: str, tag: str) -> list[list[int]]:
    """Numeric fields of the lines starting with ``tag`` (vgtest's output)."""
    return [[int(x) for x in ln.split()[1:]] for ln in log.splitlines() if ln.split()[:1] == [tag]]


def env_of(log: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in log.splitlines() if "=" in ln and ln.split("=")[0].isupper())


def rates(log: str) -> list[float]:
    return [float(ln.split()[1]) for ln in log.splitlines() if ln.startswith("rate ")]


def log_of(bed: GpuBed, pod: str, container: str = "c") -> str:
    assert bed.node is not None
    return bed.node.container_log("default", pod, container)


def delete(client: Any, *names: str) -> None:
    for n in names:
        client.delete(Pod, n, grace_period=0)
    wait_until(lambda: not {p.metadata.name for p in client.list(Pod)} & set(names),
               timeout_s=60, what=f"pods {names} gone")


def test_memory_slice_at_the_limit_succeeds_one_byte_over_fails(bed: GpuBed, client: Any) -> None:
    t0 = time.monotonic()
    pod = run_pod(client, gpu_test_pod(
        "mem-512", f"vgtest init info nvml 0 alloc mem {512 * MiB} 0 alloc mem 1 2 info",
        memory_mib=512))
    elapsed = time.monotonic() - t0
    log = log_of(bed, "mem-512")
    assert pod.status.phase == "Succeeded", log
    info = lines(log, "info")
    assert info[0][:2] == [512 * MiB, 512 * MiB]  # cuMemGetInfo: free, total = the slice
    assert info[1][:2] == [0, 512 * MiB]  # full after exactly 512 MiB; one byte more was OOM
    (nvml,) = lines(log, "nvml")
    assert nvml[1] == 512 * MiB  # NVML total is the slice too
    print(f"pod create to Succeeded: {elapsed:.1f} s")
    delete(client, "mem-512")


def test_two_containers_of_one_pod_each_get_their_own_limit(bed: GpuBed, client: Any) -> None:
    manifest = gpu_test_pod("two-ctr", f"{SHOW_ENV}; vgtest init info", containers=2,
                            memory_mib=700)
    manifest["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpumem"] = "900"
    pod = run_pod(client, manifest)
    assert pod.status.phase == "Succeeded"
    for ctr, mib in (("c0", 700), ("c1", 900)):
        log = log_of(bed, "two-ctr", ctr)
        assert env_of(log)["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mib}m", log
        assert lines(log, "info")[0][1] == mib * MiB, log
    assert env_of(log_of(bed, "two-ctr", "c0"))["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != \
        env_of(log_of(bed, "two-ctr", "c1"))["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    delete(client, "two-ctr")


def test_two_pods_sharing_one_card_each_get_their_own_limit(bed: GpuBed, client: Any) -> None:
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    names = {"share-a": 1100, "share-b": 1300}
    for name, mib in names.items():
        client.create(codecs.from_dict(gpu_test_pod(
            name, f"{SHOW_ENV}; vgtest init info alloc mem {mib * MiB} 0 alloc mem 1 2 info"
                  "; sleep 2", memory_mib=mib, annotations=binpack)))
    seen = {}
    for name, mib in names.items():
        pod = wait_pod_done(client, name, timeout_s=90)
        log = log_of(bed, name)
        assert pod.status.phase == "Succeeded", log
        info = lines(log, "info")
        assert info[0][1] == mib * MiB and info[1][:2] == [0, mib * MiB], log
        seen[name] = env_of(log)["NVIDIA_VISIBLE_DEVICES"]
        # the container got the card the scheduler wrote down for this pod
        assert seen[name] in pod.metadata.annotations["hami.io/vgpu-devices-allocated"]
    assert seen["share-a"] == seen["share-b"]  # binpack: one card, two slices
    delete(client, *names)


def test_sm_limit_cuts_the_launch_rate_of_sharing_containers_only(bed: GpuBed, client: Any) -> None:
    """Two pods with ``gpucores: 30`` busy on one card are held to about 30 % of the
    stub's launch rate (the monitor's feedback loop sees them contend); a pod on the other
    card without a cores limit is not."""
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    # The limit holds while the monitor's feedback (a 5 s tick) sees both containers
    # launch: they start launching together (their containers may start seconds apart
    # on a loaded machine), and the last 4 s window begins 12 s in, two ticks after.
    barrier = f"go-sm-{time.monotonic_ns()}"
    cmd = (f"echo waiting; while [ ! -e {STUB_DIR}/{barrier} ]; do sleep 0.1; done; "
           "vgtest init rate 4 100 rate 4 100 rate 4 100 rate 4 100")
    names = ("sm-a", "sm-b", "sm-free")
    for name in names[:2]:
        client.create(codecs.from_dict(gpu_test_pod(name, cmd, memory_mib=4000, cores_percent=30,
                                                    annotations=binpack)))
    client.create(codecs.from_dict(gpu_test_pod("sm-free", cmd, memory_mib=15000)))
    wait_until(lambda: all("waiting" in log_of(bed, n) for n in names), timeout_s=120,
               what="the three pods' containers at the barrier")
    assert bed.node is not None
    (bed.node.host_path(STUB_DIR) / barrier).write_text("go\n")
    done = {n: wait_pod_done(client, n, timeout_s=120) for n in names}
    assert all(p.status.phase == "Succeeded" for p in done.values())
    free = max(rates(log_of(bed, "sm-free")))
    assert free > 400, log_of(bed, "sm-free")  # about 1 ms per launch unlimited
    for name in ("sm-a", "sm-b"):
        limited = rates(log_of(bed, name))[-1]  # after the limiter converged
        assert 0.15 <= limited / free <= 0.45, (name, limited, free)
    delete(client, "sm-a", "sm-b", "sm-free")


def _container_series(bed: GpuBed, family: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(bed.monitor_metrics()):
        for s in fam.samples:
            if s.name == family:
                out[(s.labels["pod"], s.labels["container"])] = s.value
    return out


def test_monitor_reports_real_containers_and_deletion_frees_the_card(bed: GpuBed,
                                                                     client: Any) -> None:
    """Two pods fill both cards; the monitor shows each one's used and limit bytes from
    its cache file; a third whole-card pod waits. Deleting one pod removes its series and
    its cache directory, the scheduler releases its memory, and the waiting pod runs on
    the freed card."""
    hold = f"vgtest init alloc mem {300 * MiB} 0 echo allocated hold"
    for name in ("full-a", "full-b"):
        client.create(codecs.from_dict(gpu_test_pod(name, hold, memory_mib=16384)))
    for name in ("full-a", "full-b"):
        try:
            wait_until(lambda n=name: "allocated" in log_of(bed, n), timeout_s=90,
                       what=f"{name} allocated")
        except AssertionError:
            raise
        except Exception as err:  # the pods' states say where it stuck
            states = {n: client.get(Pod, n).status for n in ("full-a", "full-b")}
            raise AssertionError(f"{err}; {states}; log: {log_of(bed, name)!r}") from None
    wait_until(lambda: {("full-a", "c"), ("full-b", "c")} <=
               set(_container_series(bed, "hami_vgpu_memory_used_bytes")),
               timeout_s=30, what="monitor series of both pods")
    used = _container_series(bed, "hami_vgpu_memory_used_bytes")
    limit = _container_series(bed, "hami_vgpu_memory_limit_bytes")
    assert used[("full-a", "c")] >= 300 * MiB and limit[("full-a", "c")] == 16384 * MiB
    client.create(codecs.from_dict(gpu_test_pod("waiter", f"{SHOW_ENV}; vgtest init info",
                                                memory_mib=16384)))
    time.sleep(3)
    assert client.get(Pod, "waiter").status.phase == "Pending"  # no card has room
    a = client.get(Pod, "full-a")
    a_card = a.metadata.annotations["hami.io/vgpu-devices-allocated"].split(",")[0]
    cache_dir = bed.hook_path / "vgpu" / "containers" / f"{a.metadata.uid}_c"
    assert cache_dir.is_dir()
    delete(client, "full-a")
    wait_until(lambda: ("full-a", "c") not in _container_series(bed, "hami_vgpu_memory_used_bytes"),
               timeout_s=30, what="full-a's series gone")
    wait_until(lambda: not cache_dir.exists(), timeout_s=30, what="full-a's cache dir removed")
    pod = wait_pod_done(client, "waiter", timeout_s=90)
    assert pod.status.phase == "Succeeded", log_of(bed, "waiter")
    assert env_of(log_of(bed, "waiter"))["NVIDIA_VISIBLE_DEVICES"] in a_card
    assert lines(log_of(bed, "waiter"), "info")[0][1] == 16384 * MiB
    delete(client, "full-b", "waiter")


def test_two_gpu_pod_gets_both_cards_each_with_its_slice(bed: GpuBed, client: Any) -> None:
    """``gpu: 2, gpumem: 3000, gpucores: 25``: the real kubelet's device choice and
    GetPreferredAllocation end in a container that sees exactly the two cards the
    scheduler wrote down, 3000 MiB on each; the bind completes (bind-phase success,
    nothing left to allocate) and the node lock is released."""
    from lightkube.resources.core_v1 import Node

    pod = run_pod(client, gpu_test_pod(
        "two-gpu", f"{SHOW_ENV}; vgtest init info dev 1 info", gpus=2, memory_mib=3000,
        cores_percent=25))
    log = log_of(bed, "two-gpu")
    assert pod.status.phase == "Succeeded", log
    env = env_of(log)
    # HAMi's encoding: containers separated by ';', a container's devices by ':'
    first_container = pod.metadata.annotations["hami.io/vgpu-devices-allocated"].split(";")[0]
    granted = [d.split(",")[0] for d in first_container.split(":") if d]
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == granted and len(set(granted)) == 2
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == \
        ("3000m", "3000m")
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert [i[1] for i in lines(log, "info")] == [3000 * MiB, 3000 * MiB]
    assert pod.metadata.annotations["hami.io/bind-phase"] == "success"
    assert pod.metadata.annotations["hami.io/vgpu-devices-to-allocate"].strip(";") == ""
    assert "hami.io/mutex.lock" not in (client.get(Node, bed.node_name).metadata.annotations
                                        or {})


def _series_by_uuid(bed: GpuBed, family: str, pod: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(bed.monitor_metrics()):
        for s in fam.samples:
            if s.name == family and s.labels["pod"] == pod:
                out[s.labels["device_uuid"]] = s.value
    return out


def test_per_rank_device_masks_keep_each_cards_limit_and_usage(bed: GpuBed, client: Any) -> None:
    """Issue 26 §1: a 2-GPU pod (48 MiB per card) runs three processes as per-rank
    launchers do, with CUDA_VISIBLE_DEVICES=0, =1 and =1,0. Each card's limit holds for
    every process whatever ordinal it has there, and the monitor shows each card's usage
    on that card's UUID (the stub's libcuda orders the cards by PCI bus, NVML and the
    limits by NVIDIA_VISIBLE_DEVICES, as the real libraries do)."""
    from hami.testing.gpupods import stub_uuid

    m = MiB
    cmd = (f"{SHOW_ENV}; "
           f"CUDA_VISIBLE_DEVICES=0 vgtest init alloc mem {10 * m} 0 echo p0 hold >/tmp/p0 2>&1 & "
           f"CUDA_VISIBLE_DEVICES=1 vgtest init alloc mem {20 * m} 0 echo p1 hold >/tmp/p1 2>&1 & "
           "until grep -q p0 /tmp/p0 && grep -q p1 /tmp/p1; do sleep 0.1; done; cat /tmp/p0 /tmp/p1; "
           # ordinal 0 is card 1 (20 MiB used there), ordinal 1 is card 0 (10 MiB used)
           f"CUDA_VISIBLE_DEVICES=1,0 vgtest init alloc mem {28 * m + 1} 2 alloc mem {5 * m} 0 info "
           f"dev 1 alloc mem {38 * m + 1} 2 alloc mem {3 * m} 0 info nvml 0 nvml 1 echo p2 hold & wait")
    client.create(codecs.from_dict(gpu_test_pod("ranks", cmd, gpus=2, memory_mib=48)))
    try:
        wait_until(lambda: "p2" in log_of(bed, "ranks").split(), timeout_s=90,
                   what="three processes holding")
    except Exception as err:  # the pod's log says where it stopped
        raise AssertionError(f"{err}; status {client.get(Pod, 'ranks').status}; "
                             f"log: {log_of(bed, 'ranks')!r}") from None
    log = log_of(bed, "ranks")
    assert "alloc mem 29360129 -> 2" in log and "alloc mem 39845889 -> 2" in log, log
    # host-PID detection looks for the process on the card its CUDA device 0 is
    assert "host PID not found" not in log, log
    assert [i[:2] for i in lines(log, "info")] == [[23 * m, 48 * m], [35 * m, 48 * m]], log
    order = env_of(log)["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert sorted(order) == [stub_uuid(0), stub_uuid(1)]
    expect = {stub_uuid(0): 13 * m, stub_uuid(1): 25 * m}
    nvml = lines(log, "nvml")  # NVML's index i is the container's card i
    assert [n[2] for n in nvml] == [expect[u] for u in order], log
    assert all(n[1] == 48 * m for n in nvml)
    wait_until(lambda: _series_by_uuid(bed, "hami_vgpu_memory_used_bytes", "ranks") == expect,
               timeout_s=30, what=f"monitor shows {expect}")
    assert _series_by_uuid(bed, "hami_vgpu_memory_limit_bytes", "ranks") == \
        {stub_uuid(0): 48 * m, stub_uuid(1): 48 * m}
    delete(client, "ranks")
