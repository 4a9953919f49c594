"""Allocate mode ``cdi``'s pure decisions (:mod:`hami.deviceplugin.cdimode`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.api import names
from hami.deviceplugin import cdimode as cm
from hami.deviceplugin.allocate import AllocateError, ContainerView, NodeSettings, PodView
from hami.deviceplugin.config import PluginConfig

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
R = "nvidia.com/gpu"


def pod(grant: str, containers: tuple[str, ...] = ("c",), **ann: str) -> PodView:
    return PodView("ns", "p", "uid-p", "n1", "Pending",
                   {names.DEVICES_ALLOCATED: grant, names.VGPU_NODE: "n1",
                    names.DEVICES_TO_ALLOCATE: grant, **ann},
                   tuple(ContainerView(c) for c in containers),
                   labels={names.VGPU_NODE: "n1"})


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=6, unique=True),
       st.randoms())
def test_the_device_name_does_not_depend_on_the_order_of_ids(ids: list[str], rnd: Any) -> None:
    shuffled = list(ids)
    rnd.shuffle(shuffled)
    assert cm.cdi_device_name(R, ids) == cm.cdi_device_name(R, shuffled)
    assert cm.cdi_device_name(R, ids).startswith("hami.io/vgpu=")
    assert cm.cdi_device_name(R, ids) != cm.cdi_device_name("example.com/gpu", ids)


def test_holder_of_wants_exactly_one_container_with_exactly_these_ids() -> None:
    one = cm.Holder("ns", "p", "a", frozenset({"x", "y"}))
    two = cm.Holder("ns", "q", "b", frozenset({"z"}))
    assert cm.holder_of([one, two], ["y", "x"]) is one
    for ids in (["x"], ["x", "y", "z"], ["w"], []):
        with pytest.raises(AllocateError):
            cm.holder_of([one, two], ids)
    with pytest.raises(AllocateError, match="several containers"):
        cm.holder_of([one, cm.Holder("ns", "thief", "c", frozenset({"x", "y"}))], ["x", "y"])


def test_the_container_s_entry_is_taken_by_its_index_not_by_what_is_left() -> None:
    p = pod(f"{A},NVIDIA,100,0:;;{A},NVIDIA,300,0:;", containers=("init", "cpu", "gpu"),
            **{names.DEVICES_TO_ALLOCATE: ";;;"})  # everything already "consumed"
    plan = cm.container_plan_for(p, "gpu", [f"{A}-3"], PluginConfig(), NodeSettings(), "k")
    assert plan.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "300m"
    assert cm.gpu_containers(p) == ("init", "gpu")
    with pytest.raises(AllocateError, match="grants it none"):
        cm.container_plan_for(p, "cpu", [f"{A}-1"], PluginConfig(), NodeSettings(), "k")
    with pytest.raises(AllocateError, match="no container"):
        cm.container_plan_for(p, "nope", [f"{A}-1"], PluginConfig(), NodeSettings(), "k")


@pytest.mark.parametrize("grant", ["", "garbage", "GPU-x,NVIDIA,notanumber,0:;"])
def test_a_missing_or_malformed_grant_is_an_error_not_a_crash(grant: str) -> None:
    with pytest.raises(AllocateError):
        cm.container_plan_for(pod(grant), "c", ["x"], PluginConfig(), NodeSettings(), "k")


def test_completion_patch_is_written_once() -> None:
    p = pod(f"{A},NVIDIA,100,0:;;")
    patch = cm.completion_patch(p)
    assert patch == {names.BIND_PHASE: "success", names.DEVICES_TO_ALLOCATE: ";;"}
    done = pod(f"{A},NVIDIA,100,0:;;", **patch)
    assert cm.completion_patch(done) is None
    assert cm.all_served(p, ["c"]) and not cm.all_served(p, [])


@pytest.mark.parametrize("doc", [None, [], "x", {"annotations": "x"},
                                 {"annotations": {cm.SPEC_POD_UID: 3}}, {}])
def test_spec_owner_of_a_damaged_file_is_none(doc: Any) -> None:
    assert cm.spec_owner(doc) is None


def test_only_the_resource_s_own_stale_specs_are_swept() -> None:
    live = cm.spec_file_name(R, ["a"])
    dead = cm.spec_file_name(R, ["b"])
    other = cm.spec_file_name("example.com/gpu", ["c"])
    files = [live, dead, other, "gpu.hami.io-claim.json", "nvidia.yaml"]
    assert cm.stale_specs(R, files, [live]) == [dead]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_or_one_elsewhere_is_refused(phase: str) -> None:
    from dataclasses import replace

    p = pod(f"{A},NVIDIA,100,0:;")
    cm.check_pod_here(p, "n1")
    with pytest.raises(AllocateError):
        cm.check_pod_here(replace(p, phase=phase), "n1")
    with pytest.raises(AllocateError):
        cm.check_pod_here(p, "n2")
    with pytest.raises(AllocateError):
        cm.check_pod_here(replace(p, annotations={**p.annotations, names.VGPU_NODE: "n2"}), "n1")


def test_completion_patch_adds_the_node_label_when_the_binding_did_not() -> None:
    """On a node in this mode the allocation rides on the Binding; an API server without
    PodTopologyLabelsAdmission drops the Binding's labels, so the plugin writes
    ``hami.io/vgpu-node`` (mirrored into the label by the shell), and only that when the
    Binding already said ``success``."""
    p = replace(pod(f"{A},NVIDIA,100,0:;;"), labels={})
    patch = cm.completion_patch(p)
    assert patch == {names.BIND_PHASE: "success", names.DEVICES_TO_ALLOCATE: ";;",
                     names.VGPU_NODE: "n1"}
    served = replace(pod(f"{A},NVIDIA,100,0:;;", **{names.BIND_PHASE: "success",
                                                    names.DEVICES_TO_ALLOCATE: ";;"}),
                     labels={})
    assert cm.completion_patch(served) == {names.VGPU_NODE: "n1"}
    labelled = replace(served, labels={names.VGPU_NODE: "n1"})
    assert cm.completion_patch(labelled) is None
    wrong = replace(served, labels={names.VGPU_NODE: "n2"})
    assert cm.completion_patch(wrong) == {names.VGPU_NODE: "n1"}


@pytest.mark.parametrize("to_allocate", [";;", f"{A},NVIDIA,100,0:;;", "", "garbage"])
def test_a_pod_whose_binding_said_success_needs_no_completion_write(to_allocate: str) -> None:
    """The scheduler's Binding to a node in this mode says ``bind-phase=success``: the
    allocation is final when it lands, so serving the pod writes nothing, whatever the
    to-allocate string says (nothing in this mode reads it)."""
    done = pod(f"{A},NVIDIA,100,0:;;", **{names.BIND_PHASE: "success",
                                          names.DEVICES_TO_ALLOCATE: to_allocate})
    assert cm.completion_patch(done) is None


@pytest.mark.parametrize("phase", ["allocating", "failed", "", "garbage"])
def test_a_pod_that_does_not_say_success_is_completed(phase: str) -> None:
    """A Binding from before the scheduler marked it final, a pod that also holds another
    vendor's devices, or one marked failed whose container is now served."""
    p = pod(f"{A},NVIDIA,100,0:;", **{names.BIND_PHASE: phase})
    assert cm.completion_patch(p) == {names.BIND_PHASE: "success",
                                      names.DEVICES_TO_ALLOCATE: ";"}


@pytest.mark.parametrize("phase", ["allocating", "success", "", "garbage"])
def test_a_refused_pod_is_marked_failed_once(phase: str) -> None:
    p = pod(f"{A},NVIDIA,100,0:;", **{names.BIND_PHASE: phase})
    assert cm.failure_patch(p) == {names.BIND_PHASE: "failed"}
    assert cm.failure_patch(pod(f"{A},NVIDIA,100,0:;", **{names.BIND_PHASE: "failed"})) is None
