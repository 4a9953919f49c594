"""Table-driven tests of the small pure pieces: config merge, health rules, registration
values, fake inventory, NUMA from sysfs, the lib installer, the monitor loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hami.deviceplugin.command import install_lib
from hami.deviceplugin.config import (
    PluginConfig,
    PluginConfigError,
    apply_node_config,
    from_device_config,
)
from hami.deviceplugin.discovery import (
    DiscoveryError,
    PhysicalGpu,
    numa_node_of,
    open_backend,
    parse_inventory,
)
from hami.deviceplugin.health import (
    DEFAULT_IGNORED_XIDS,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    gpus_to_mark,
    policy_from_env,
)
from hami.deviceplugin.register import (
    device_type,
    encode_register,
    node_devices,
    registered_memory_mib,
)

# --- config ---------------------------------------------------------------------------------


def test_device_config_defaults_and_values() -> None:
    assert from_device_config(None) == PluginConfig()
    cfg = from_device_config("nvidia:\n  deviceSplitCount: 4\n  deviceMemoryScaling: 2\n"
                             "  deviceCoreScaling: 0.5\n  disableCoreLimit: true\n"
                             "  libCudaLogLevel: 1\n  preConfiguredDeviceMemory: 1024\n"
                             "  resourceCountName: hami.io/gpu\n  enableNumaTopology: true\n")
    assert (cfg.device_split_count, cfg.device_memory_scaling, cfg.device_core_scaling) == (4, 2.0, 0.5)
    assert cfg.disable_core_limit and cfg.libcuda_log_level == "1" and cfg.oversubscribed
    assert cfg.resource_name == "hami.io/gpu" and cfg.preconfigured_memory_mib == 1024


@pytest.mark.parametrize("text", ["nvidia: [1]", "- a", "nvidia:\n  deviceSplitCount: x",
                                  "nvidia:\n  deviceSplitCount: -1", "nvidia:\n  disableCoreLimit: 1",
                                  ": :"])
def test_device_config_errors(text: str) -> None:
    with pytest.raises(PluginConfigError):
        from_device_config(text)


@pytest.mark.parametrize(("text", "check"), [
    (None, lambda c: c == PluginConfig()),
    ('{"nodeconfig":[{"name":"other","devicesplitcount":3}]}', lambda c: c == PluginConfig()),
    ('{"nodeconfig":[{"name":"n","devicesplitcount":3,"devicememoryscaling":0}]}',
     lambda c: c.device_split_count == 3 and c.device_memory_scaling == 1.0),  # zero = keep
    ('{"nodeconfig":[{"name":"n","operatingmode":"mig","libcudaloglevel":"3",'
     '"enablegetpreferredallocation":true,"filterdevices":{"uuid":["GPU-x"],"index":[2]}}]}',
     lambda c: c.operating_mode == "mig" and c.libcuda_log_level == "3"
     and c.enable_get_preferred_allocation and c.filter_uuids == {"GPU-x"}
     and c.filter_indices == {2}),
])
def test_node_config(text: str | None, check) -> None:  # type: ignore[no-untyped-def]
    assert check(apply_node_config(PluginConfig(), text, "n"))


@pytest.mark.parametrize("text", ['{"nodeconfig":[{"name":"n","operatingmode":"x"}]}',
                                  '{"nodeconfig":{}}', "{", '{"nodeconfig":[{"name":"n",'
                                  '"filterdevices":{"index":["a"]}}]}'])
def test_node_config_errors(text: str) -> None:
    with pytest.raises(PluginConfigError):
        apply_node_config(PluginConfig(), text, "n")


# --- health -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "xid", "fatal"), [
    ({}, 79, True), ({}, 48, True), ({}, 13, False), ({}, 31, False), ({}, 43, False),
    ({}, 45, False), ({}, 68, False), ({}, 109, False),
    ({"DP_DISABLE_HEALTHCHECKS": "all"}, 79, False),
    ({"DP_DISABLE_HEALTHCHECKS": "xids"}, 79, False),
    ({"DP_DISABLE_HEALTHCHECKS": "79, 48"}, 79, False),
    ({"DP_DISABLE_HEALTHCHECKS": "79,x"}, 48, True),
    ({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, True),
    ({"DP_ENABLE_HEALTHCHECKS": "all"}, 43, True),
    ({"DP_DISABLE_HEALTHCHECKS": "94", "DP_ENABLE_HEALTHCHECKS": "94"}, 94, True),
])
def test_xid_rules(env: dict[str, str], xid: int, fatal: bool) -> None:
    policy = policy_from_env(env)
    marks = gpus_to_mark(policy, EVENT_XID_CRITICAL, xid, "GPU-a", ["GPU-a", "GPU-b"])
    assert (marks == {"GPU-a"}) is fatal


def test_event_rules() -> None:
    p = policy_from_env({})
    assert p.ignored_xids == DEFAULT_IGNORED_XIDS
    assert gpus_to_mark(p, EVENT_DOUBLE_BIT_ECC, 0, "GPU-a", ["GPU-a"]) == frozenset()
    assert gpus_to_mark(p, EVENT_XID_CRITICAL, 79, "GPU-zz", ["GPU-a", "GPU-b"]) == {"GPU-a", "GPU-b"}
    assert gpus_to_mark(p, EVENT_XID_CRITICAL, 0, None, ["GPU-a", "GPU-b"]) == {"GPU-a", "GPU-b"}
    assert gpus_to_mark(policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all"}), 8, 0, None,
                        ["GPU-a"]) == frozenset()


# --- registration values ------------------------------------------------------------------------

@pytest.mark.parametrize(("mem", "cfg", "expected"), [
    (81920 * 2**20 + 123, PluginConfig(), 81920),
    (15360 * 2**20, PluginConfig(device_memory_scaling=1.5), 23040),
    (15361 * 2**20, PluginConfig(device_memory_scaling=0.3), 4608),        # int(4608.3)
    (None, PluginConfig(preconfigured_memory_mib=2048), 2048),
    (1000 * 2**20, PluginConfig(device_memory_scaling=2, operating_mode="mig"), 1000),
])
def test_registered_memory(mem: int | None, cfg: PluginConfig, expected: int) -> None:
    assert registered_memory_mib(PhysicalGpu("GPU-a", 0, "x", mem), cfg) == expected


def test_type_prefix_and_filters_and_unhealthy() -> None:
    assert device_type("Tesla T4") == "NVIDIA-Tesla T4"
    assert device_type("NVIDIA A100") == "NVIDIA A100"
    gpus = [PhysicalGpu(f"GPU-{i}", i, "NVIDIA X", 2**30, numa=i) for i in range(3)]
    cfg = PluginConfig(filter_uuids=frozenset({"GPU-0"}), filter_indices=frozenset({2}),
                       device_core_scaling=1.5)
    (d,) = node_devices(gpus, cfg, frozenset({"GPU-1"}))
    assert (d.uuid, d.cores_percent, d.health, d.numa) == ("GPU-1", 150, False, 1)
    assert encode_register([d]) == ('[{"id":"GPU-1","index":1,"count":10,"devmem":1024,'
                                    '"devcore":150,"type":"NVIDIA X","numa":1,"mode":"hami-core"}]')
    assert encode_register([]) == "[]"


# --- discovery -------------------------------------------------------------------------------

def test_fake_inventory_parsing() -> None:
    gpus, events = parse_inventory("gpus:\n- {model: Tesla T4, memory_mib: 100, count: 2, numa: 1}\n"
                                   "- {model: NVIDIA A10, uuid: GPU-z, health: false}\n"
                                   "xid_events: [{uuid: GPU-z, xid: 79}]\n")
    assert [(g.uuid, g.index, g.memory_bytes, g.numa, g.healthy) for g in gpus] == [
        ("GPU-fake-0", 0, 100 * 2**20, 1, True), ("GPU-fake-1", 1, 100 * 2**20, 1, True),
        ("GPU-z", 2, None, 0, False)]
    assert events[0].xid == 79
    for bad in ("gpus: 3", "gpus: [3]", "gpus: [{count: -1}]", "gpus: [{count: 2, uuids: [a]}]",
                "xid_events: [{uuid: a}]", "[", "gpus: [{memory_mib: x}]"):
        with pytest.raises(DiscoveryError):
            parse_inventory(bad)
    with pytest.raises(DiscoveryError):
        open_backend("fake", None)
    with pytest.raises(DiscoveryError):
        open_backend("cuda", None)


def test_numa_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "0000:3b:00.0").mkdir()
    (tmp_path / "0000:3b:00.0" / "numa_node").write_text("1\n")
    (tmp_path / "0000:5e:00.0").mkdir()
    (tmp_path / "0000:5e:00.0" / "numa_node").write_text("-1\n")
    assert numa_node_of("00000000:3B:00.0", tmp_path) == 1
    assert numa_node_of("00000000:5E:00.0", tmp_path) == 0
    assert numa_node_of("00000000:AF:00.0", tmp_path) == 0


def test_nvml_backend_with_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    class NVMLError(Exception):
        value = 999

    nv = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_TIMEOUT=10,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetName=lambda h: "Tesla T4" if h else "NVIDIA A100",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=(h + 1) * 2**30),
        nvmlDeviceGetMigMode=lambda h: (1, 1) if h == 0 else (_ for _ in ()).throw(NVMLError()),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:00:00.0"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    b = open_backend("nvml", None)
    gpus = b.devices()
    assert [(g.uuid, g.index, g.name, g.memory_bytes, g.mig_capable) for g in gpus] == [
        ("GPU-0", 0, "NVIDIA A100", 2**30, True), ("GPU-1", 1, "Tesla T4", 2 * 2**30, False)]
    b.close()


# --- installer -----------------------------------------------------------------------------------

def test_install_lib(tmp_path: Path) -> None:
    lib = tmp_path / "build" / "libvgpu.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF-v1")
    dest = tmp_path / "host" / "vgpu"
    written = install_lib(dest, lib, "0.1.0")
    assert {p.name for p in written} == {"libvgpu.so", "libvgpu.so.0.1.0", "ld.so.preload"}
    assert (dest / "ld.so.preload").read_text() == f"{dest}/libvgpu.so\n"
    assert (dest / "libvgpu.so").read_bytes() == b"\x7fELF-v1"
    assert (dest / "containers").is_dir()
    assert install_lib(dest, lib, "0.1.0") == []                # unchanged: nothing rewritten
    lib.write_bytes(b"\x7fELF-v2")
    assert {p.name for p in install_lib(dest, lib, "0.1.0")} == {"libvgpu.so", "libvgpu.so.0.1.0"}
    with pytest.raises(OSError):
        install_lib(dest, tmp_path / "missing.so", "0.1.0")


# --- the monitor loop ----------------------------------------------------------------------------

def test_monitor_loop_serves_and_removes(tmp_path: Path) -> None:
    import urllib.request

    from hami.deviceplugin.allocate import ContainerView, PodView
    from hami.monitor.command import run_monitor
    from tests.node.fakes import FakeKube
    from tests.node.regionfile import Proc, RegionSpec, allocated, build

    hook = tmp_path / "vgpu"
    for key in ("live_main", "gone_main"):
        d = hook / "containers" / key
        d.mkdir(parents=True)
        (d / "x.cache").write_bytes(bytes(build(RegionSpec(
            uuids=("GPU-a",), procs=[Proc(used={0: (0, 0, 5, 0, 5)})]))))
    kube = FakeKube()
    kube.add_pod(PodView("ns", "p", "live", "node-a", "Running",
                         {"hami.io/vgpu-node": "node-a", **allocated(("GPU-a",))},
                         (ContainerView("main"),), labels={"hami.io/vgpu-node": "node-a"}))
    kube.add_pod(PodView("ns", "unlabelled", "live2", "node-a", "Running", {},
                         (ContainerView("main"),)))
    stop = threading.Event()
    from hami.testing.processes import free_port

    port = free_port()  # outside the ephemeral range: no client connection takes it
    t = threading.Thread(target=run_monitor, kwargs=dict(
        node="node-a", hook_path=hook, kube=kube, stop=stop, bind=f"127.0.0.1:{port}",
        interval_s=0.1, grace_s=0.0, mig_lock=tmp_path / "none.lock"), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                if 'pod="p"' in body and not (hook / "containers" / "gone_main").exists():
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert 'hami_vgpu_memory_used_bytes{container="main",device_uuid="GPU-a",namespace="ns",' \
               'pod="p",vdevice_index="0",zone="vGPU"} 5.0' in body
        assert not (hook / "containers" / "gone_main").exists()
    finally:
        stop.set()
        t.join(timeout=10)
