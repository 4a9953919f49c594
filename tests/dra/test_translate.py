"""DRA mode admission: HAMi's GPU resources become a ResourceClaimTemplate reference."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.quota import QuotaLedger
from hami.devices.nvidia import Nvidia, NvidiaConfig
from hami.dra import translate as tr
from hami.dra.webhook import claim_booking

CFG = NvidiaConfig()


def _pod(limits: dict[str, Any], annotations: dict[str, str] | None = None,
         init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x",
                                            "resources": {"limits": dict(limits)}}]}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "team", "annotations": annotations or {}},
            "spec": spec}


def _request(t: tr.Translation) -> dict[str, Any]:
    (template,) = t.templates.values()
    return template["spec"]["spec"]["devices"]["requests"][0]["exactly"]  # type: ignore[no-any-return]


def test_memory_and_cores_become_capacity_requests() -> None:
    t = tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                           "nvidia.com/gpucores": 30, "cpu": "1"}), CFG)
    assert t is not None
    ex = _request(t)
    assert ex["count"] == 1 and ex["deviceClassName"] == "gpu.hami.io"
    assert ex["capacity"] == {"requests": {"memory": "3000Mi", "cores": "30"}}
    (name,) = t.templates
    ctr = t.pod["spec"]["containers"][0]
    assert ctr["resources"]["limits"] == {"cpu": "1"}
    assert ctr["resources"]["claims"] == [{"name": "gpu-0"}]
    assert t.pod["spec"]["resourceClaims"] == [{"name": "gpu-0", "resourceClaimTemplateName": name}]
    assert (t.memory_mib, t.cores_percent) == (3000, 30)
    assert "constraints" not in next(iter(t.templates.values()))["spec"]["spec"]["devices"]


def test_same_request_same_template_and_multi_gpu_distinct() -> None:
    a = tr.translate(_pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}), CFG)
    b = tr.translate(_pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}), CFG)
    assert a is not None and b is not None and a.templates.keys() == b.templates.keys()
    devices = next(iter(a.templates.values()))["spec"]["spec"]["devices"]
    assert devices["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.hami.io/uuid"}]
    assert _request(a)["count"] == 2


def test_whole_card_when_no_memory_and_exclusive_cores() -> None:
    t = tr.translate(_pod({"nvidia.com/gpu": 1}), CFG)
    assert t is not None
    # HAMi's rule: a count alone is an exclusive card (gpucores 100), memory: whole card
    assert _request(t)["capacity"] == {"requests": {"cores": "100"}}


def test_type_and_uuid_annotations_become_cel_selectors() -> None:
    t = tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10}, {
        "nvidia.com/use-gputype": "A100,H100", "nvidia.com/nouse-gpuuuid": "GPU-x"}), CFG)
    assert t is not None
    exprs = [s["cel"]["expression"] for s in _request(t)["selectors"]]
    assert exprs == [
        '["a100", "h100"].exists(t, device.attributes["gpu.hami.io"].type.lowerAscii().contains(t))',
        '!(device.attributes["gpu.hami.io"].uuid in ["GPU-x"])']


def test_cel_injection_refused() -> None:
    with pytest.raises(tr.TranslateError, match="characters"):
        tr.translate(_pod({"nvidia.com/gpu": 1}, {"nvidia.com/use-gpuuuid": 'x"] || true || ["'}),
                     CFG)


def test_percentage_refused_unless_one_card_size() -> None:
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25})
    with pytest.raises(tr.TranslateError, match="gpumem-percentage.*does not know"):
        tr.translate(pod, CFG)
    t = tr.translate(pod, CFG, uniform_memory_mib=16000)
    assert t is not None and _request(t)["capacity"]["requests"]["memory"] == "4000Mi"


def test_pods_with_claims_or_without_gpus_left_alone() -> None:
    with_claims = _pod({"nvidia.com/gpu": 1})
    with_claims["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimName": "mine"}]
    assert tr.translate(with_claims, CFG) is None
    assert tr.translate(_pod({"cpu": "1"}), CFG) is None


def test_quota_enforced_at_admission() -> None:
    quota = QuotaLedger(Nvidia(CFG).resource_names())
    quota.set_quota("team", "gpu", {"limits.nvidia.com/gpumem": 4000})
    quota.charge("team", 3000, 0)
    with pytest.raises(tr.TranslateError, match="exceeding resource quota"):
        tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1001}), CFG, quota=quota)
    assert tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), CFG,
                        quota=quota) is not None


def test_quota_at_admission_adds_a_sidecar_to_the_app_container() -> None:
    """A GPU sidecar (restartPolicy Always) runs beside the app container: 3000 + 3000 MiB
    exceed a 5000 MiB quota (issue 25; an ordinary init container of 3000 MiB does not)."""
    quota = QuotaLedger(Nvidia(CFG).resource_names())
    quota.set_quota("team", "gpu", {"limits.nvidia.com/gpumem": 5000})
    gpu = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}
    side = {"name": "side", "image": "x", "restartPolicy": "Always",
            "resources": {"limits": dict(gpu)}}
    with pytest.raises(tr.TranslateError, match="asks for 6000 MiB"):
        tr.translate(_pod(gpu, init=[side]), CFG, quota=quota)
    del side["restartPolicy"]
    t = tr.translate(_pod(gpu, init=[side]), CFG, quota=quota)
    assert t is not None and t.memory_mib == 3000


def test_malformed_values_are_denials() -> None:
    with pytest.raises(tr.TranslateError):
        tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}), CFG)


def test_claim_booking_counts_requests() -> None:
    t = tr.translate(_pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000,
                           "nvidia.com/gpucores": 10}), CFG)
    assert t is not None
    claim = {"spec": next(iter(t.templates.values()))["spec"]["spec"]}
    assert claim_booking(claim) == (2000, 20)


@pytest.mark.parametrize(("current", "force", "wanted"), [
    (None, True, "hami-scheduler"),                  # none named: hami's profile
    ("default-scheduler", True, "hami-scheduler"),   # extender mode's overwrite rule
    ("default-scheduler", False, "default-scheduler"),
    ("volcano", True, "volcano"),                    # another scheduler keeps its pod
])
def test_translated_pod_goes_to_the_profile_with_the_prioritize_verb(
        current: str | None, force: bool, wanted: str) -> None:
    """The chart's kube-scheduler profile runs hami's prioritize verb: a translated pod is
    sent there by the same rule extender mode uses; no name given leaves it unchanged."""
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    if current:
        pod["spec"]["schedulerName"] = current
    t = tr.translate(pod, CFG, scheduler_name="hami-scheduler",
                     overwrite_default_scheduler=force)
    assert t is not None and t.pod["spec"].get("schedulerName") == wanted
    plain = tr.translate(pod, CFG)
    assert plain is not None and plain.pod["spec"].get("schedulerName") == current


A100_MIG = {("1g.5gb", 4864), ("2g.10gb", 9856), ("1g.10gb", 9856), ("3g.20gb", 19968),
            ("7g.40gb", 40192)}


def _first(t: tr.Translation) -> list[dict[str, Any]]:
    (template,) = t.templates.values()
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    assert "exactly" not in req and req["name"] == "gpu"
    return req["firstAvailable"]  # type: ignore[no-any-return]


def test_gpumem_offers_the_fitting_mig_profiles_smallest_first_then_the_shared_card() -> None:
    """HAMi's extender mode gives a gpumem request the smallest MIG profile that fits; in
    DRA mode the claim lists the fitting profiles smallest first, then the shared card.
    gpucores does not go into a MIG subrequest (a MIG instance has its own compute)."""
    t = tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000,
                           "nvidia.com/gpucores": 30},
                          {"nvidia.com/use-gputype": "A100"}), CFG, mig_offers=A100_MIG)
    assert t is not None
    first = _first(t)
    assert [s["name"] for s in first] == ["mig-1g-10gb", "mig-2g-10gb", "mig-3g-20gb",
                                         "mig-7g-40gb", "shared"]
    type_sel = tr.selectors({"nvidia.com/use-gputype": "A100"})
    mig = first[0]
    assert "capacity" not in mig and mig["count"] == 1
    assert mig["selectors"][:-1] == type_sel
    assert mig["selectors"][-1]["cel"]["expression"] == (
        '"profile" in device.attributes["gpu.hami.io"] && '
        'device.attributes["gpu.hami.io"].profile == "1g.10gb" && device.capacity['
        '"gpu.hami.io"].memory.compareTo(quantity("5000Mi")) >= 0')
    shared = first[-1]
    assert shared["capacity"] == {"requests": {"memory": "5000Mi", "cores": "30"}}
    assert shared["selectors"] == type_sel and shared["deviceClassName"] == "gpu.hami.io"
    assert (t.memory_mib, t.cores_percent) == (5000, 30)  # the quota books the ask
    # the quota booking of such a claim: pending books the ask; on a MIG instance (no
    # consumedCapacity) still the ask
    claim: dict[str, Any] = {"spec": next(iter(t.templates.values()))["spec"]["spec"]}
    assert claim_booking(claim) == (5000, 30)
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu/mig-1g-10gb", "driver": "gpu.hami.io", "pool": "n",
         "device": "gpu-0-1g-10gb-0"}]}}}
    assert claim_booking(claim) == (5000, 30)


def test_mig_offers_only_for_one_card_with_a_memory_amount_that_some_profile_holds() -> None:
    def spec(limits: dict[str, Any], offers: Any = A100_MIG) -> dict[str, Any]:
        t = tr.translate(_pod(limits), CFG, mig_offers=offers)
        assert t is not None
        (template,) = t.templates.values()
        return template["spec"]["spec"]["devices"]["requests"][0]  # type: ignore[no-any-return]

    plain = spec({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, ())
    assert "exactly" in plain  # no MIG published: the claim as before
    assert plain == spec({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, set())
    assert "exactly" in spec({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000})
    assert "exactly" in spec({"nvidia.com/gpu": 1})  # a whole card
    assert "exactly" in spec({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 41000})  # none fits
    big = spec({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000})
    assert [s["name"] for s in big["firstAvailable"]] == ["mig-7g-40gb", "shared"]


def test_mig_choices_stay_within_the_api_limit_and_refuse_unsafe_names() -> None:
    offers = {(f"{k}g.{k}gb", k * 1000) for k in range(1, 12)} | {('x"||true', 99999)}
    assert tr.mig_choices(offers, 1500) == [f"{k}g.{k}gb" for k in range(2, 9)]
    t = tr.translate(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500}), CFG,
                     mig_offers=offers)
    assert t is not None and len(_first(t)) == tr.MAX_SUBREQUESTS


def test_init_containers_book_as_the_extender_collapses_them() -> None:
    """The pod's booking is the core's init-container collapse (hami.core.collapse, as
    extender mode charges a pod): the peak of the init containers or the sum of the app
    containers, whichever is larger, for memory and cores each."""
    from hami.core.collapse import pod_charges, total
    from hami.core.model import ContainerDevice

    def gpu(name: str, mib: int, cores: int) -> dict[str, Any]:
        return {"name": name, "image": "x", "resources": {"limits": {
            "nvidia.com/gpu": 1, "nvidia.com/gpumem": mib, "nvidia.com/gpucores": cores}}}

    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 10},
               init=[gpu("i1", 8000, 5), gpu("i2", 2000, 40)])
    pod["spec"]["containers"].append(gpu("second", 3000, 10))
    t = tr.translate(pod, CFG)
    assert t is not None and (t.memory_mib, t.cores_percent) == (8000, 40)
    expected = total(pod_charges(tuple((ContainerDevice("x", "", m, c),) for m, c in
                                       ((8000, 5), (2000, 40), (3000, 10), (3000, 10))), 2))
    assert (t.memory_mib, t.cores_percent) == expected
    # under a 9000 MiB quota the pod fits (8000), as in extender mode; the sum would not
    quota = QuotaLedger(Nvidia(CFG).resource_names())
    quota.set_quota("team", "gpu", {"limits.nvidia.com/gpumem": 9000})
    assert tr.translate(pod, CFG, quota=quota) is not None
