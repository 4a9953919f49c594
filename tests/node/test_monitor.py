"""The vGPU monitor on cache files written byte for byte at the documented offsets:
finding/mapping/removing, every metric value and label, feedback rules tick by tick,
corrupt files tolerated (hami-core-spec §A.6, §C)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.deviceplugin.allocate import ContainerView, PodView
from hami.monitor.command import feedback_tick, parse_bind
from hami.monitor.feedback import ContainerFeedback, observe
from hami.monitor.lister import ContainerLister, pick_cache_file, split_dir_name
from hami.monitor.metrics import HostGpu, MonitorCollector
from tests.node.regionfile import Proc, RegionSpec, allocated, build, read_feedback

U0 = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
U1 = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MiB = 2**20


def put(root: Path, key: str, data: bytes, name: str = "3f1c.cache", lib: bool = True) -> Path:
    d = root / key
    d.mkdir(parents=True, exist_ok=True)
    if lib:
        (d / "libvgpu.so").touch()
    (d / name).write_bytes(bytes(data))
    return d / name


def scrape(collector: MonitorCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


class FakeHost:
    def gpus(self) -> list[HostGpu]:
        return [HostGpu(0, U0, "A100-SXM4-80GB", 5 * MiB, 37, 12),
                HostGpu(1, U1, "NVIDIA H100", None, None, None)]


def pod(uid: str, name: str, containers: tuple[str, ...], n_init: int = 0,
        annotations: dict[str, str] | None = None, gpus: tuple[str, ...] = (U0, U1),
        priority: int | None = None) -> PodView:
    """A Running pod whose every container was granted ``gpus`` (allocation annotation)
    and, when given, has ``CUDA_TASK_PRIORITY=priority`` in its spec."""
    env = {} if priority is None else {"CUDA_TASK_PRIORITY": str(priority)}
    return PodView("ns1", name, uid, "node-a", "Running",
                   {**allocated(*(gpus for _ in containers)), **(annotations or {})},
                   tuple(ContainerView(c, env) for c in containers), n_init)


# --- names and cache picking ------------------------------------------------------------

@pytest.mark.parametrize(("name", "expected"), [
    ("uid_ctr", ("uid", "ctr")), ("uid_ctr_x", ("uid", "ctr_x")), ("_ctr", None),
    ("uid_", None), ("uidctr", None)])
def test_split_dir_name(name: str, expected: tuple[str, str] | None) -> None:
    assert split_dir_name(name) == expected


def test_pick_cache_file() -> None:
    assert pick_cache_file([]) is None
    assert pick_cache_file(["libvgpu.so"]) is None
    assert pick_cache_file(["libvgpu.so", "b.cache"]) == "b.cache"
    assert pick_cache_file(["x.txt", "a.cache"]) == "a.cache"
    with pytest.raises(Exception, match="too many"):
        pick_cache_file(["libvgpu.so", "a.cache", "b.cache"])


# --- metrics ------------------------------------------------------------------------------

def test_metrics_every_value_and_label(tmp_path: Path) -> None:
    spec = RegionSpec(
        uuids=(U0, U1), limits={0: 3000 * MiB, 1: 5000 * MiB}, last_kernel_time=1_000_000,
        procs=[Proc(pid=10, status=1, used={0: (100, 0, 900, 0, 1000), 1: (7, 0, 3, 0, 10)},
                    sm_util={0: 30, 1: 2}),
               Proc(pid=11, status=2, used={0: (50, 0, 150, 0, 200)}, sm_util={0: 15}),
               Proc(pid=12, status=0, used={0: (1, 1, 1, 1, 99999)}, sm_util={0: 99})])
    root = tmp_path / "containers"
    put(root, "uid1_main", build(spec))
    put(root, "uid1_init", build(RegionSpec(uuids=(U0,))))      # init containers are not reported
    lister = ContainerLister(root)
    lister.update({"uid1"})
    migs = ('[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.10gb",'
            '"placement":{"start":0,"size":1},"migUUID":"MIG-x","gpuInstanceID":3,'
            '"computeInstanceID":0},{"containerIndex":1,"deviceIndex":1,"gpuUUID":"GPU-m",'
            '"profile":"1g.10gb","placement":{"start":1,"size":1}}]')
    p = pod("uid1", "p1", ("init", "main"), n_init=1,
            annotations={"hami.io/vgpu-mig-allocations": migs})
    col = MonitorCollector("node-a", lister, lambda: [p], FakeHost(), legacy=True,
                           clock=lambda: 1_000_042.7)
    m = scrape(col)
    z = {"zone": "vGPU"}

    def lab(i: int, u: str) -> dict[str, str]:
        return {"namespace": "ns1", "pod": "p1", "container": "main", "vdevice_index": str(i),
                "device_uuid": u, **z}

    assert m["hami_vgpu_memory_used_bytes"] == [(lab(0, U0), 1200.0), (lab(1, U1), 10.0)]
    assert m["hami_container_device_memory_bytes"] == [(lab(0, U0), 1200.0), (lab(1, U1), 10.0)]
    assert m["hami_vgpu_memory_limit_bytes"] == [(lab(0, U0), 3000.0 * MiB), (lab(1, U1), 5000.0 * MiB)]
    assert m["hami_container_device_utilization_ratio"] == [(lab(0, U0), 45.0), (lab(1, U1), 2.0)]
    assert m["hami_vgpu_memory_context_bytes"] == [(lab(0, U0), 150.0), (lab(1, U1), 7.0)]
    assert m["hami_vgpu_memory_module_bytes"] == [(lab(0, U0), 0.0), (lab(1, U1), 0.0)]
    assert m["hami_vgpu_memory_buffer_bytes"] == [(lab(0, U0), 1050.0), (lab(1, U1), 3.0)]
    assert m["hami_container_last_kernel_elapsed_seconds"] == [(lab(0, U0), 42.0), (lab(1, U1), 42.0)]
    assert m["hami_mig_device_info"] == [({"namespace": "ns1", "pod": "p1", "container": "main",
                                           "vdevice_index": "0", "device_uuid": "GPU-m",
                                           "mig_uuid": "MIG-x", "profile": "1g.10gb",
                                           "gpu_instance_id": "3", "compute_instance_id": "0",
                                           **z}, 1.0)]
    host = {"node": "node-a", "device_index": "0", "device_uuid": U0,
            "device_type": "NVIDIA-A100-SXM4-80GB", **z}
    assert m["hami_host_gpu_memory_used_bytes"] == [(host, 5.0 * MiB)]
    assert m["hami_host_gpu_utilization_ratio"] == [(host, 37.0)]
    assert m["hami_host_gpu_memory_controller_utilization_ratio"] == [
        ({k: v for k, v in host.items() if k != "node"}, 12.0)]
    (info_labels, info), = m["hami_build_info"]
    assert info == 1.0 and "zone" not in info_labels and set(info_labels) == {
        "version", "revision", "build_date", "go_version", "compiler", "platform"}
    # legacy names
    leg = {"podnamespace": "ns1", "podname": "p1", "ctrname": "main", "vdeviceid": "0",
           "deviceuuid": U0, **z}
    assert m["vGPU_device_memory_usage_in_bytes"][0] == (leg, 1200.0)
    assert m["vGPU_device_memory_limit_in_bytes"][0] == (leg, 3000.0 * MiB)
    assert m["Device_memory_desc_of_container"][0] == (
        {**leg, "context": "150", "module": "0", "data": "1050", "offset": "0"}, 1200.0)
    assert m["Device_utilization_desc_of_container"][0] == (leg, 45.0)
    assert m["Device_last_kernel_of_container"][0] == (leg, 42.0)
    assert m["MigInfo"] == [({"podnamespace": "ns1", "podname": "p1", "ctrname": "main",
                              "vdeviceid": "0", "deviceuuid": "GPU-m", "instanceid": "3", **z}, 1.0)]
    assert m["HostGPUMemoryUsage"] == [({"nodeid": "node-a", "deviceidx": "0", "deviceuuid": U0,
                                         "devicetype": "NVIDIA-A100-SXM4-80GB", **z}, 5.0 * MiB)]
    assert m["HostCoreUtilization"][0][1] == 37.0
    # without --legacy-metrics the legacy names are absent
    col.legacy = False
    assert "MigInfo" not in scrape(col)


def test_v0_legacy_file_and_uuid_rules(tmp_path: Path) -> None:
    bad_utf8 = "GPU-\udcff"       # written raw below
    spec = RegionSpec(version=0, uuids=(U0, "", "X" * 60),
                      limits={0: 1024, 2: 5}, procs=[Proc(used={0: (1, 2, 3, 4, 10), 2: (0, 0, 0, 0, 7)},
                                                           sm_util={0: 9})])
    data = build(spec)
    _ = bad_utf8
    root = tmp_path / "c"
    put(root, "u_c", data)
    lister = ContainerLister(root)
    lister.update({"u"})
    assert lister.containers["u_c"].version == 0
    m = scrape(MonitorCollector("n", lister, lambda: [pod("u", "p", ("c",), gpus=(U0, "X" * 60))]))
    used = m["hami_vgpu_memory_used_bytes"]
    # device 1 has no UUID: skipped; device 2's label is the first 40 characters
    assert [(lbl["vdevice_index"], lbl["device_uuid"], v) for lbl, v in used] == [
        ("0", U0, 10.0), ("2", "X" * 40, 7.0)]
    assert "hami_container_last_kernel_elapsed_seconds" not in m      # v0 has no timestamp


def test_invalid_utf8_uuid_skipped(tmp_path: Path) -> None:
    data = build(RegionSpec(uuids=(U0, U1), procs=[Proc(used={0: (0, 0, 0, 0, 1), 1: (0, 0, 0, 0, 2)})]))
    data[64 + 96 + 5] = 0xFF                                        # corrupt UUID 1
    root = tmp_path / "c"
    put(root, "u_c", data)
    lister = ContainerLister(root)
    lister.update({"u"})
    m = scrape(MonitorCollector("n", lister, lambda: [pod("u", "p", ("c",))]))
    assert [lbl["vdevice_index"] for lbl, _ in m["hami_vgpu_memory_used_bytes"]] == ["0"]


# --- lister lifecycle ---------------------------------------------------------------------

def test_lister_removes_gone_pods_after_grace(tmp_path: Path) -> None:
    root = tmp_path / "c"
    put(root, "live_c", build(RegionSpec(uuids=(U0,))))
    put(root, "gone_c", build(RegionSpec(uuids=(U0,))))
    (root / "notadir_x").write_text("")
    (root / "nounderscore").mkdir()
    now = [time.time()]
    lister = ContainerLister(root, grace_s=300, clock=lambda: now[0])
    lister.update(None)                            # pod list unknown: load all, delete none
    assert set(lister.containers) == {"live_c", "gone_c"}
    lister.update({"live"})                        # within grace: kept
    assert (root / "gone_c").exists()
    now[0] += 301
    lister.update({"live"})
    assert not (root / "gone_c").exists() and set(lister.containers) == {"live_c"}
    assert (root / "nounderscore").exists()
    lister.close()


def test_empty_dir_then_cache_appears(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "u_c").mkdir(parents=True)
    lister = ContainerLister(root)
    lister.update({"u"})
    assert lister.containers == {}
    put(root, "u_c", build(RegionSpec(uuids=(U0,))))
    lister.update({"u"})
    assert set(lister.containers) == {"u_c"}


# --- corrupt files --------------------------------------------------------------------------

def corrupt_cases() -> list[tuple[str, bytes]]:
    good = build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 0, 0, 5)})]))
    wrong_magic = bytearray(good)
    wrong_magic[0] = 0
    wrong_version = bytearray(good)
    wrong_version[4] = 7
    bad_proc_num = bytearray(good)
    bad_proc_num[2_008_896:2_008_900] = (5000).to_bytes(4, "little")
    huge_devnum = bytearray(good)
    huge_devnum[56:64] = (2**40).to_bytes(8, "little")
    rnd = random.Random(7)
    return [
        ("empty", b""), ("tiny", b"\x4e\xf7\x2f\x01"),
        ("truncated-v1", bytes(good[:1_500_000])[:1_197_000]),
        ("truncated-header", bytes(good[:100])),
        ("wrong-magic", bytes(wrong_magic)), ("wrong-version", bytes(wrong_version)),
        ("bad-proc-num", bytes(bad_proc_num)), ("huge-device-num", bytes(huge_devnum)),
        ("random", rnd.randbytes(2_008_953)),
        ("random-with-magic", b"\x4e\xf7\x2f\x01\x01\x00\x00\x00" + rnd.randbytes(2_008_945)),
        ("foreign-text", b"hello world\n" * 10),
    ]


@pytest.mark.parametrize(("name", "data"), corrupt_cases(), ids=[c[0] for c in corrupt_cases()])
def test_corrupt_file_skipped_others_reported(tmp_path: Path, name: str, data: bytes,
                                              caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "c"
    put(root, "good_c", build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 0, 0, 77)})])))
    put(root, "bad_c", data)
    lister = ContainerLister(root)
    lister.update({"good", "bad"})
    pods = [pod("good", "g", ("c",)), pod("bad", "b", ("c",))]
    m = scrape(MonitorCollector("n", lister, lambda: pods))
    feedback_tick(lister, pods)
    good = [(lbl["pod"], v) for lbl, v in m.get("hami_vgpu_memory_used_bytes", [])]
    assert ("g", 77.0) in good
    assert all(p == "g" for p, _ in good) or name.startswith("random")
    lister.close()


def test_file_truncated_regrown_and_grown(tmp_path: Path) -> None:
    """The file is read with pread: a truncated file drops the series (no fault), the same
    file regrown is read again without reopening, a longer file is still a v1 region."""
    root = tmp_path / "c"
    path = put(root, "u_c", build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 0, 0, 3)})])))
    lister = ContainerLister(root)
    lister.update({"u"})
    pods = [pod("u", "p", ("c",))]
    col = MonitorCollector("n", lister, lambda: pods)
    assert scrape(col)["hami_vgpu_memory_used_bytes"][0][1] == 3.0
    os.truncate(path, 4096)                 # a mapping would SIGBUS on the next read
    assert "hami_vgpu_memory_used_bytes" not in scrape(col)
    feedback_tick(lister, pods)             # no crash, nothing written past the end
    assert path.stat().st_size == 4096
    lister.update({"u"})
    path.write_bytes(bytes(build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 0, 0, 4)})]))))
    assert scrape(col)["hami_vgpu_memory_used_bytes"][0][1] == 4.0
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    assert scrape(col)["hami_vgpu_memory_used_bytes"][0][1] == 4.0
    path.unlink()                           # replaced by another file: reopened at update
    path.write_bytes(bytes(build(RegionSpec(uuids=(U0,), procs=[Proc(used={0: (0, 0, 0, 0, 5)})]))))
    lister.update({"u"})
    assert scrape(col)["hami_vgpu_memory_used_bytes"][0][1] == 5.0
    lister.close()


def test_growing_file_during_creation(tmp_path: Path) -> None:
    """A file still being written (shorter than any layout) is retried each tick."""
    root = tmp_path / "c"
    data = bytes(build(RegionSpec(uuids=(U0,))))
    path = put(root, "u_c", data[:12])
    lister = ContainerLister(root)
    for cut in (12, 4096, 1_000_000):
        path.write_bytes(data[:cut])
        lister.update({"u"})
        assert lister.containers == {}
    path.write_bytes(data)
    lister.update({"u"})
    assert set(lister.containers) == {"u_c"}


# --- feedback rules --------------------------------------------------------------------------

def fb(key: str, uuids: tuple[str, ...], prio: int, rk: int, sw: int = 1) -> ContainerFeedback:
    return ContainerFeedback(key, uuids, prio, rk, sw)


@pytest.mark.parametrize(("inputs", "expected"), [
    # a launch (rk 2) counts once, then decays to 0; alone -> switch off
    ([fb("a", (U0,), 1, 2)], [(1, 0)]),
    ([fb("a", (U0,), 1, 1)], [(0, 0)]),
    ([fb("a", (U0,), 1, 0)], [(0, 0)]),
    # high priority (0) active blocks low priority (1) on the same GPU
    ([fb("hi", (U0,), 0, 2), fb("lo", (U0,), 1, 2)], [(1, 0), (-1, 1)]),
    # ... but not on another GPU
    ([fb("hi", (U0,), 0, 2), fb("lo", (U1,), 1, 2)], [(1, 0), (1, 0)]),
    # blocked stays blocked while hi is active; unblocks (0) when hi is idle
    ([fb("hi", (U0,), 0, 2), fb("lo", (U0,), 1, -1)], [(1, 0), (-1, 1)]),
    ([fb("hi", (U0,), 0, 1), fb("lo", (U0,), 1, -1)], [(0, 0), (0, 0)]),
    # two of the same priority active on one GPU -> both throttled, none blocked
    ([fb("a", (U0,), 1, 2), fb("b", (U0,), 1, 2)], [(1, 1), (1, 1)]),
    # one of them idle -> the other alone
    ([fb("a", (U0,), 1, 2), fb("b", (U0,), 1, 1)], [(1, 0), (0, 0)]),
    # negative priority never counts as active and is never blocked
    ([fb("a", (U0,), -1, 2), fb("b", (U0,), 0, 2)], [(1, 0), (1, 0)]),
    # an idle blocked low-priority container with rk -1 is left negative only when blocking
    ([fb("lo", (U0,), 1, -1)], [(0, 0)]),
    # high priority is never blocked by a low one; switch follows same-priority only
    ([fb("hi", (U0,), 0, 2), fb("lo", (U0,), 1, 2), fb("lo2", (U0,), 1, 2)],
     [(1, 0), (-1, 1), (-1, 1)]),
    # multi-GPU container: blocked if any of its GPUs has a higher-priority active one
    ([fb("hi", (U1,), 0, 2), fb("lo", (U0, U1), 2, 2)], [(1, 0), (-1, 1)]),
])
def test_observe_rules(inputs: list[ContainerFeedback], expected: list[tuple[int, int]]) -> None:
    assert [(c.recent_kernel, c.utilization_switch) for c in observe(inputs)] == expected


def test_a_forged_recent_kernel_blocks_neighbours_for_one_tick_only() -> None:
    # The region is the container's own file: a priority-0 tenant that writes 2^31-1 into
    # its recent_kernel once (and launches nothing) must not keep a priority-1 neighbour on
    # its GPU blocked; libvgpu itself writes 2 at each launch.
    state = [fb("attacker", (U0,), 0, 2**31 - 1), fb("victim", (U0,), 1, 2)]
    victim_rk = []
    for _ in range(3):
        state = observe(state)
        victim_rk.append(state[1].recent_kernel)
    assert victim_rk == [-1, 0, 0]


def test_feedback_tick_by_tick_on_files(tmp_path: Path) -> None:
    root = tmp_path / "c"
    hi = put(root, "h_c", build(RegionSpec(uuids=(U0,), priority=0, recent_kernel=2)))
    lo = put(root, "l_c", build(RegionSpec(uuids=(U0,), priority=1, recent_kernel=2)))
    legacy = put(root, "o_c", build(RegionSpec(version=0, uuids=(U1,), priority=1, recent_kernel=2)))
    lister = ContainerLister(root)
    lister.update({"h", "l", "o"})
    pods = [pod("h", "h", ("c",), gpus=(U0,), priority=0), pod("l", "l", ("c",), gpus=(U0,), priority=1),
            pod("o", "o", ("c",), gpus=(U1,), priority=1)]
    feedback_tick(lister, pods)                 # tick 1: hi active -> lo blocked
    assert read_feedback(hi.read_bytes()) == (0, 1)
    assert read_feedback(lo.read_bytes()) == (1, -1)
    assert read_feedback(legacy.read_bytes(), version=0) == (0, 1)
    feedback_tick(lister, pods)                 # tick 2: hi decays to 0 -> lo unblocked
    assert read_feedback(hi.read_bytes()) == (0, 0)
    assert read_feedback(lo.read_bytes()) == (0, 0)
    assert read_feedback(legacy.read_bytes(), version=0) == (0, 0)
    # the library records a new launch in lo (rk = 2): lo alone -> runs unthrottled
    with open(lo, "r+b") as f:
        f.seek(2_008_904)
        f.write((2).to_bytes(4, "little"))
    feedback_tick(lister, pods)
    assert read_feedback(lo.read_bytes()) == (0, 1)
    lister.close()


def test_parse_bind() -> None:
    assert parse_bind(":9394") == ("0.0.0.0", 9394)
    assert parse_bind("127.0.0.1:1234") == ("127.0.0.1", 1234)


def test_render_matches_prometheus_client_and_http(tmp_path: Path) -> None:
    import urllib.request

    from hami.monitor.command import serve_metrics

    root = tmp_path / "c"
    put(root, "u_c", build(RegionSpec(uuids=(U0, U1), limits={0: 5}, last_kernel_time=9,
                                      procs=[Proc(used={0: (1, 2, 3, 4, 5)}, sm_util={1: 3})])))
    lister = ContainerLister(root)
    lister.update({"u"})
    weird = PodView('n"s\\', "p\nq", "u", "n", "Running", allocated((U0, U1)), (ContainerView("c"),))
    col = MonitorCollector("node-a", lister, lambda: [weird], FakeHost(), legacy=True,
                           clock=lambda: 20.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)
    assert col.render() == generate_latest(reg)
    server = serve_metrics(col, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert r.read() == col.render()
    finally:
        server.shutdown()


def test_a_running_sidecar_is_reported_an_ordinary_init_container_is_not(tmp_path: Path) -> None:
    """Issue 25 item 1: a sidecar (restartable init container) holds its slice beside the
    app containers for the pod's life, so its usage is reported as theirs is."""
    root = tmp_path / "containers"
    used = RegionSpec(uuids=(U0,), limits={0: 3000 * MiB},
                      procs=[Proc(pid=10, status=1, used={0: (0, 0, 0, 0, 700)})])
    for ctr in ("warm", "side", "main"):
        put(root, f"uid1_{ctr}", build(used))
    lister = ContainerLister(root)
    lister.update({"uid1"})
    p = pod("uid1", "p1", ("warm", "side", "main"), n_init=2, gpus=(U0,))
    p = PodView(p.namespace, p.name, p.uid, p.node_name, p.phase, p.annotations,
                p.containers, p.n_init, sidecars=frozenset({"side"}))
    col = MonitorCollector("node-a", lister, lambda: [p], FakeHost(), clock=lambda: 1.0)
    series = scrape(col)["hami_vgpu_memory_used_bytes"]
    assert sorted(labels["container"] for labels, _ in series) == ["main", "side"]
    assert all(value == 700.0 for _, value in series)
