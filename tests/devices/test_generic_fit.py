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


def test_fit_shares_reads_the_vendors_own_keys_and_word() -> None:
    # One Fit for every share vendor: the filter keys are the row's, NVIDIA's are not
    # read for another vendor, and grants carry the request's CommonWord.
    cards = [DeviceState(DeviceInfo(f"u{i}", i, 4, 16384, 100, kind, 0, "", True,
                                    vendor="DCU"), 0, 0, 0)
             for i, kind in enumerate(["T4", "A100"])]
    anns = {"x/use": "a100", "nvidia.com/use-gputype": "t4", "x/nouse-uuid": "u9"}
    pod = PodOptions.from_annotations(anns, "spread", FILTERS)
    out = fit_shares(cards, ContainerDeviceRequest(1, "DCU", 1000, PERCENT_UNSET, 0), pod,
                     NodeOptions())
    assert [(d.uuid, d.type) for d in out.devices] == [("u1", "DCU")]
    nvidia = PodOptions.from_annotations(anns, "spread", CARD_FILTERS)
    assert nvidia.use_types == ("t4",) and nvidia.mig and not pod.mig


def test_a_card_in_mig_mode_is_a_plain_share_for_a_vendor_without_mig() -> None:
    card = DeviceState(DeviceInfo("u0", 0, 4, 16384, 100, "X", 0, "mig", True,
                                  vendor="DCU"), 0, 0, 0)
    out = generic_fit([card], ContainerDeviceRequest(1, "DCU", 1000, PERCENT_UNSET, 0),
                      FitContext(), FILTERS, "DCU")
    assert out.ok and out.mig == () and out.devices[0].used_memory_mib == 1000
