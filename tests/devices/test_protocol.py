"""Every backend satisfies the Protocol and has the spec's keys (§2.1, §2.2, §9)."""

from __future__ import annotations

import pytest

from hami.core.vendor import Vendor
from hami.devices.registry import build_registry

FULL = {"nvidia": {}, "hygon": {}, "cambricon": {}, "mthreads": {}, "amd": {},
        "awsneuron": {}, "kunlun": {}, "metax": {}, "enflame": {}, "vastai": {}, "biren": {},
        "iluvatars": [{"chipName": "MR-V100", "commonWord": "MR-V100"}],
        "vnpus": {"configs": [{"chipName": "910B3", "commonWord": "Ascend910B3",
                               "memoryAllocatable": 65536, "aiCore": 20,
                               "templates": [{"name": "vir05_1c_16g", "memory": 16384,
                                              "aiCore": 5}]}]}}

REGISTRY = build_registry(FULL, enable_ascend=True, enable_iluvatar=True)

# (CommonWord, allocated key, to-allocate key) -- spec §2.2.
KEYS = [
    ("NVIDIA", "hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"),
    ("MLU", "hami.io/cambricon-mlu-devices-allocated", "hami.io/cambricon-mlu-devices-to-allocate"),
    ("DCU", "hami.io/dcu-devices-allocated", "hami.io/dcu-devices-to-allocate"),
    ("Mthreads", "hami.io/mthreads-vgpu-devices-allocated", None),
    ("Metax-GPU", "hami.io/metax-gpu-devices-allocated", "hami.io/metax-gpu-devices-to-allocate"),
    ("Metax-SGPU", "hami.io/metax-sgpu-devices-allocated",
     "hami.io/metax-sgpu-devices-to-allocate"),
    ("XPU", "hami.io/xpu-devices-allocated", "hami.io/xpu-devices-to-allocate"),
    ("AMD", "hami.io/amd-devices-allocated", "hami.io/amd-devices-to-allocate"),
    ("GCU", "hami.io/enflame-gcu-devices-allocated", "hami.io/enflame-gcu-devices-to-allocate"),
    ("Ascend910B3", "hami.io/Ascend910B3-devices-allocated",
     "hami.io/Ascend910B3-devices-to-allocate"),
    ("MR-V100", "hami.io/MR-V100-devices-allocated", "hami.io/MR-V100-devices-to-allocate"),
    ("Vastai", "hami.io/Vastai-devices-allocated", "hami.io/Vastai-devices-to-allocate"),
    ("Biren", "hami.io/Biren-devices-allocated", "hami.io/Biren-devices-to-allocate"),
    ("kunlun", "hami.io/kunlun-allocated", None),
    ("AWSNeuron", "hami.io/aws-neuron-devices-allocated", None),
    ("Enflame", "hami.io/enflame-vgpu-devices-allocated", None),
]

# (CommonWord, register key, handshake key) -- spec §2.1.
REGISTER = [
    ("NVIDIA", "hami.io/node-nvidia-register", "hami.io/node-handshake"),
    ("DCU", "hami.io/node-dcu-register", "hami.io/node-handshake-dcu"),
    ("XPU", "hami.io/node-register-xpu", "hami.io/node-handshake-xpu"),
    ("Vastai", "hami.io/node-va-register", "hami.io/node-handshake-va"),
    ("Biren", "hami.io/node-biren-register", "hami.io/node-handshake-biren"),
    ("AMD", "hami.io/node-amd-register", None),
    ("Ascend910B3", "hami.io/node-register-Ascend910B3", "hami.io/node-handshake-Ascend910B3"),
    ("MR-V100", "hami.io/node-MR-V100-register", "hami.io/node-handshake-MR-V100"),
]


def test_registry_has_every_vendor_sorted() -> None:
    assert list(REGISTRY) == sorted(w for w, _, _ in KEYS)


@pytest.mark.parametrize("word", sorted(w for w, _, _ in KEYS))
def test_backend_is_a_vendor(word: str) -> None:
    vendor = REGISTRY[word]
    assert isinstance(vendor, Vendor)
    assert vendor.common_word == word
    assert vendor.resource_names().count


@pytest.mark.parametrize(("word", "allocated", "to_allocate"), KEYS)
def test_pod_keys(word: str, allocated: str, to_allocate: str | None) -> None:
    assert REGISTRY[word].allocated_key == allocated
    assert REGISTRY[word].to_allocate_key == to_allocate


@pytest.mark.parametrize(("word", "register", "handshake"), REGISTER)
def test_node_keys(word: str, register: str, handshake: str | None) -> None:
    assert REGISTRY[word].register_key == register
    if handshake is not None:
        assert REGISTRY[word].handshake_key == handshake


def test_only_cambricon_has_its_own_lock() -> None:
    locks = {w: v.lock_annotation for w, v in REGISTRY.items() if v.lock_annotation}
    assert locks == {"MLU": "cambricon.com/dsmlu.lock"}


def test_only_metax_sgpu_is_policy_neutral() -> None:
    assert [w for w, v in REGISTRY.items() if v.policy_neutral] == ["Metax-SGPU"]


def test_scores_nodes_only_where_score_node_can_be_non_zero() -> None:
    """The filter fits every candidate only for these vendors (HAMi v2.10 step 5)."""
    assert sorted(w for w, v in REGISTRY.items() if v.scores_nodes) == ["Metax-SGPU", "kunlun"]


def test_ascend_request_reads_the_pod_annotation() -> None:
    """``request_for_pod`` replaces the filter's isinstance(Ascend) dispatch."""
    ascend = build_registry({"vnpus": [{"chipName": "910B3", "commonWord": "Ascend910B3",
                                        "aiCore": 20, "templates": [
                                            {"name": "vir05_1c_16g", "memory": 16384,
                                             "aiCore": 5}]}]}, enable_ascend=True)
    vendor = ascend["Ascend910B3"]
    container = {"name": "c", "resources": {"limits": {
        "huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 1000}}}
    template = vendor.request_for_pod(container, {})
    hami_core = vendor.request_for_pod(container, {"huawei.com/vnpu-mode": "hami-core"})
    assert template is not None and template.memory_mib == 16384
    assert hami_core is not None and hami_core.memory_mib == 1000


def test_share_prefilter_only_for_the_nvidia_like_fit() -> None:
    """Vendors with their own Fit are prefiltered by device count only."""
    own_fit = sorted(w for w, v in REGISTRY.items() if not v.share_prefilter)
    assert own_fit == ["AMD", "AWSNeuron", "Ascend910B3", "NVIDIA", "kunlun"]
