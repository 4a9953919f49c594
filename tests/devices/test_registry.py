"""Registry construction from the device config (spec §7.1, §7.4)."""

from __future__ import annotations

import pytest

from hami.core.config import ConfigError
from hami.devices.registry import build_registry


def test_empty_config_is_an_error() -> None:
    with pytest.raises(ConfigError, match="all configurations are empty"):
        build_registry({})


def test_sections_select_vendors() -> None:
    reg = build_registry({"nvidia": {}, "kunlun": {}, "metax": {}, "enflame": {}})
    assert list(reg) == ["Enflame", "GCU", "Metax-GPU", "Metax-SGPU", "NVIDIA", "XPU", "kunlun"]


def test_ascend_and_iluvatar_need_their_flag() -> None:
    cfg = {"iluvatars": [{"chipName": "BI-V150", "commonWord": "BI-V150"}],
           "vnpus": {"configs": [{"commonWord": "Ascend310P"}]}}
    assert list(build_registry(cfg)) == ["NVIDIA"]
    assert list(build_registry(cfg, enable_ascend=True, enable_iluvatar=True)) == [
        "Ascend310P", "BI-V150", "NVIDIA"]


@pytest.mark.parametrize(("cfg", "word", "count", "memory", "cores"), [
    ({"hygon": {"resourceCountName": "hygon.com/x", "memoryFactor": 2}}, "DCU",
     "hygon.com/x", "hygon.com/dcumem", "hygon.com/dcucores"),
    ({"cambricon": {"resourceMemoryName": "c/m"}}, "MLU", "cambricon.com/vmlu", "c/m",
     "cambricon.com/mlu.smlu.vcore"),
    ({"metax": {"resourceVCountName": "m/s"}}, "Metax-SGPU", "m/s", "metax-tech.com/vmemory",
     "metax-tech.com/vcore"),
    ({"enflame": {"resourceNameVGCU": "e/v"}}, "Enflame", "e/v", "enflame.com/vgcu-percentage",
     "enflame.com/vgcu-percentage"),
    ({"nvidia": {"resourceCountName": "hami.io/gpu"}}, "NVIDIA", "hami.io/gpu",
     "nvidia.com/gpumem", "nvidia.com/gpucores"),
])
def test_renamed_resources(cfg: dict[str, dict[str, str]], word: str, count: str,
                           memory: str, cores: str) -> None:
    names = build_registry(cfg)[word].resource_names()
    assert (names.count, names.memory, names.cores) == (count, memory, cores)


def test_hygon_memory_factor_reaches_resource_names() -> None:
    assert build_registry({"hygon": {"memoryFactor": 4}})["DCU"].resource_names().memory_factor == 4


def test_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        build_registry({"hygon": {"memoryFactor": "two"}})


def test_managed_resource_names() -> None:
    names = build_registry({"vastai": {}, "biren": {}}).resource_names()
    assert names == {"vastaitech.com/va", "birentech.com/gpu", "nvidia.com/gpu",
                     "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                     "nvidia.com/priority"}


@pytest.mark.parametrize(("section", "resource"), [
    ("kunlun", "kunlunxin.com/xpu"), ("awsneuron", "aws.amazon.com/neuron"),
    ("metax", "metax-tech.com/gpu"), ("enflame", "enflame.com/gcu"),
    ("enflame", "enflame.com/vgcu-percentage"), ("cambricon", "cambricon.com/mlu.smlu.vcore"),
    ("mthreads", "mthreads.com/sgpu-core"),
])
@pytest.mark.parametrize("value", ["2000000", "1e30"])
def test_absurd_capacity_is_refused_not_expanded(section: str, resource: str, value: str) -> None:
    """A broken capacity must not make the scheduler build millions of devices (a breaker
    found 15 s / 800 MiB for 2,000,000 and no return for 1e30)."""
    from hami.core.gowire import CodecError

    registry = build_registry({section: {}})
    node = {"metadata": {"name": "n"}, "status": {"capacity": {resource: value}}}
    refused = 0
    for vendor in registry.values():
        try:
            assert len(vendor.node_devices(node)) <= 256
        except CodecError as exc:
            assert "refused as a broken capacity" in str(exc)
            refused += 1
    assert refused >= 1


def test_nvidia_is_always_registered_over_the_settings_given() -> None:
    """NVIDIA is a backend of the registry like the others, present without its section;
    the shell's settings (after its flags) replace the section's."""
    from hami.devices.nvidia import NvidiaConfig, settings
    from hami.devices.registry import make_config

    assert build_registry({"hygon": {}})["NVIDIA"].resource_names().count == "nvidia.com/gpu"
    given = NvidiaConfig(default_memory_mib=512)
    nvidia = build_registry({"nvidia": {"defaultMemory": 1}}, nvidia=given)["NVIDIA"]
    assert nvidia.config == given  # type: ignore[attr-defined]
    config = make_config(registry=build_registry({"nvidia": {"resourceCountName": "x/g"},
                                                  "hygon": {}}))
    assert settings(config).resource_count_name == "x/g" and set(config.registry) == {"DCU", "NVIDIA"}
    config = make_config(nvidia=given, registry=build_registry({"hygon": {}}))
    assert config.registry["NVIDIA"].config is given  # type: ignore[attr-defined]
