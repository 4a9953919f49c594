"""The share-table vendors' Fit gives exactly NVIDIA's answers (spec §4.9): same devices,
same reasons, for the same cards under another vendor's name and filter keys."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.fit import DeviceState, NodeOptions, PodOptions, fit_shares
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo
from hami.core.vendor import FitContext
from hami.devices.common import Filters, generic_fit
from hami.devices.nvidia import CARD_FILTERS

FILTERS = Filters(use_type="x/use", nouse_type="x/nouse", use_uuid="x/use-uuid",
                  nouse_uuid="x/nouse-uuid")

device = st.builds(
    lambda i, split, mem, cores, health, slots, umem, ucores, kind: (
        DeviceInfo(f"u{i}", i, split, mem, cores, kind, 0, "hami-core", health),
        min(slots, split), min(umem, mem), min(ucores, cores)),
    st.integers(0, 0), st.integers(1, 4), st.sampled_from([8192, 16384]),
    st.sampled_from([100, 50]), st.booleans(), st.integers(0, 4), st.integers(0, 16384),
    st.integers(0, 100), st.sampled_from(["A100", "T4"]))


@settings(max_examples=80, deadline=None)
@given(devs=st.lists(device, min_size=1, max_size=5),
       nums=st.integers(1, 3), mem=st.sampled_from([0, 1000, 9000]),
       cores=st.sampled_from([0, 30, 100, 120]), use=st.sampled_from(["", "a100", "t4"]),
       nouse_uuid=st.sampled_from(["", "u1", "u0,u2"]))
def test_adapter_matches_core(devs: list[tuple[DeviceInfo, int, int, int]], nums: int,
                              mem: int, cores: int, use: str, nouse_uuid: str) -> None:
    infos = [(replace(d, uuid=f"u{i}", index=i), s, m, c) for i, (d, s, m, c) in enumerate(devs)]
    percent = 100 if mem == 0 else PERCENT_UNSET
    nvidia = [DeviceState(replace(d, type="NVIDIA-" + d.type), s, m, c) for d, s, m, c in infos]
    core = fit_shares(nvidia, ContainerDeviceRequest(nums, "NVIDIA", mem, percent, cores),
                      PodOptions.from_annotations({"nvidia.com/use-gputype": use,
                                                   "nvidia.com/nouse-gpuuuid": nouse_uuid},
                                                  "spread", CARD_FILTERS), NodeOptions())
    other = [DeviceState(replace(d, vendor="DCU"), s, m, c) for d, s, m, c in infos]
    mine = generic_fit(other, ContainerDeviceRequest(nums, "DCU", mem, percent, cores),
                       FitContext(pod_annotations={"x/use": use, "x/nouse-uuid": nouse_uuid}),
                       FILTERS, "DCU")
    assert mine.ok == core.ok
    assert mine.reason == core.reason
    assert [(d.uuid, d.used_memory_mib, d.used_cores_percent) for d in mine.devices] == [
        (d.uuid, d.used_memory_mib, d.used_cores_percent) for d in core.devices]
    assert all(d.type == "DCU" for d in mine.devices)
