"""Allocate mode ``cdi`` against a tenant who edits or copies a pod's allocation (the
chart's admission policy refuses such edits on Kubernetes 1.30+; this is the plugin's own
line behind it). Real gRPC servers, as in ``test_cdi_mode``."""

from __future__ import annotations

import dataclasses

from hami.api import names
from hami.deviceplugin import allocate as al
from tests.node.conftest import PluginHarness
from tests.node.test_cdi_mode import (  # noqa: F401 - the fixture
    PodResources,
    cdi,
    env_of,
    pod,
    prestart,
    refused,
    spec,
)
from tests.node.test_plugin_grpc import A


def test_a_restart_after_the_grant_was_edited_is_refused(
        cdi: tuple[PluginHarness, PodResources]) -> None:  # noqa: F811
    """The container was served; the tenant then raises its grant to 80000 MiB and the
    container restarts: the signature no longer verifies, the restart is refused and the
    spec written for the signed grant stays as it was."""
    h, pr = cdi
    p = pod(h, "p", f"{A},NVIDIA,1000,10:;")
    pr.listing = [("default", "p", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    first = spec(h, f"{A}-0")
    edited = {**h.kube.pods[("default", "p")].annotations,
              names.DEVICES_ALLOCATED: f"{A},NVIDIA,80000,100:;"}
    h.kube.add_pod(dataclasses.replace(p, annotations=edited))
    assert "signature" in refused(h, f"{A}-0")
    assert spec(h, f"{A}-0") == first
    assert env_of(first)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert h.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "failed"


def test_a_pod_recreated_under_the_same_name_with_the_old_grant_is_refused(
        cdi: tuple[PluginHarness, PodResources]) -> None:  # noqa: F811
    """The signature covers the pod's UID: a new pod (spec.nodeName set, same name) that
    carries the deleted pod's signed annotations gets nothing."""
    h, pr = cdi
    old = pod(h, "p", f"{A},NVIDIA,1000,10:;")
    h.kube.delete_pod("default", "p")
    h.kube.add_pod(dataclasses.replace(old, uid="uid-thief", annotations={
        **old.annotations, al.BIND_PHASE: "allocating"}))
    pr.listing = [("default", "p", "c", [f"{A}-0"])]
    assert "signature" in refused(h, f"{A}-0")


class _StaleWatch:
    """A pod watch that has not seen the deletion and re-creation yet."""

    def __init__(self, pods: list[al.PodView]) -> None:
        self._pods = pods

    def pods(self) -> list[al.PodView]:
        return self._pods


def test_a_pod_recreated_under_the_name_of_one_being_deleted_gets_its_own_grant(
        cdi: tuple[PluginHarness, PodResources]) -> None:  # noqa: F811
    """The kubelet's pod-resources API names pods without their UID. Pod ``p`` (1000 MiB)
    is being deleted and a new pod ``p`` (3000 MiB, its own signed grant) is bound to the
    same node before the plugin's watch caught up: the container is served the new
    pod's grant, not the deleted pod's (whose card the scheduler has already freed)."""
    from hami.core.provenance import SIGNATURE, sign
    from tests.node.test_cdi_mode import KEY, NODE

    h, pr = cdi
    old = pod(h, "p", f"{A},NVIDIA,1000,10:;")
    grant = f"{A},NVIDIA,3000,30:;"
    ann = {**old.annotations, al.DEVICES_TO_ALLOCATE: grant, names.DEVICES_ALLOCATED: grant}
    ann.pop(SIGNATURE)
    ann[SIGNATURE] = sign(KEY, "uid-p2", NODE, ann)
    h.kube.add_pod(dataclasses.replace(old, uid="uid-p2", annotations=ann))
    h.kube.pod_watch = _StaleWatch([dataclasses.replace(old, deleting=True)])  # type: ignore[assignment]
    pr.listing = [("default", "p", "c", [f"{A}-0"])]
    prestart(h, f"{A}-0")
    assert env_of(spec(h, f"{A}-0"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
