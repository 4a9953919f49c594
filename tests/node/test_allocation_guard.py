"""The device plugin serves only allocations hami's scheduler signed (issue 12 §2),
through the real gRPC server behind the fake kubelet."""

from __future__ import annotations

import grpc
import pytest

from hami.api import names
from hami.core.provenance import SIGNATURE, sign
from hami.deviceplugin import allocate as al
from hami.deviceplugin.guard import AllocationGuard
from hami.keyring import KeyRing
from tests.node.conftest import NODE, PluginHarness
from tests.node.test_plugin_grpc import A, up, wait

KEY = b"s" * 64


def pod_with(h: PluginHarness, name: str, grant: str, *, signed_grant: str | None = None,
             key: bytes = KEY, scheduler: str = "hami-scheduler", to_allocate: str | None = None,
             node: str = NODE) -> None:
    """A bound pod holding the node lock; its allocation signed over ``signed_grant``
    (default: ``grant``) for ``node``, or unsigned when ``key`` is empty."""
    annotations = {al.DEVICES_TO_ALLOCATE: to_allocate or grant, names.DEVICES_ALLOCATED: grant,
                   al.VGPU_NODE: NODE, al.BIND_PHASE: "allocating", al.BIND_TIME: "100"}
    if key:
        annotations[SIGNATURE] = sign(key, f"uid-{name}", node,
                                      {**annotations, names.DEVICES_ALLOCATED: signed_grant or grant})
    h.kube.add_pod(al.PodView("default", name, f"uid-{name}", NODE, "Pending", annotations,
                              (al.ContainerView("c", {}),), 0, scheduler_name=scheduler))
    h.kube.patch_node_annotations(NODE, {al.NODE_LOCK: f"2026-11-29T08:00:00Z,default,{name}"})


@pytest.fixture
def guarded(harness: PluginHarness, tmp_path) -> PluginHarness:  # type: ignore[no-untyped-def]
    (tmp_path / "current").write_bytes(KEY)
    up(harness, guard=AllocationGuard(KeyRing(tmp_path)))
    return harness


def refused(h: PluginHarness, why: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        h.kubelet.allocate([f"{A}-0"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert why in err.value.details(), err.value.details()
    assert h.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "failed"


def test_signed_allocation_is_served(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,1000,10:;")
    env = guarded.kubelet.allocate([f"{A}-0"]).container_responses[0].envs
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


def test_hand_written_allocation_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,81920,100:;", key=b"")
    refused(guarded, "was not written by hami's scheduler")


def test_allocation_changed_after_signing_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,81920,100:;", signed_grant=f"{A},NVIDIA,1000,10:;")
    refused(guarded, "does not match its signature")


def test_signature_of_another_node_or_key_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,1000,10:;", node="elsewhere")
    refused(guarded, "does not match its signature")


def test_signature_by_a_foreign_key_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,1000,10:;", key=b"f" * 64)
    refused(guarded, "not accepted")


def test_pod_of_another_scheduler_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,1000,10:;", scheduler="default-scheduler")
    refused(guarded, "schedulerName 'default-scheduler'")


def test_to_allocate_beyond_the_signed_grant_is_refused(guarded: PluginHarness) -> None:
    pod_with(guarded, "p", f"{A},NVIDIA,1000,10:;", to_allocate=f"{A},NVIDIA,81920,100:;")
    refused(guarded, "differs from the signed")


def _guard_of_the_command(monkeypatch: pytest.MonkeyPatch, *flags: str) -> AllocationGuard | None:
    """The guard ``hami device-plugin <flags>`` hands to the plugin (its run is captured)."""
    import typer
    from typer.testing import CliRunner

    from hami.deviceplugin import command

    seen: dict[str, object] = {}
    monkeypatch.setattr(command, "run_plugin", lambda **kw: seen.update(kw))
    cli = typer.Typer()
    cli.command("device-plugin")(command.device_plugin)
    cli.command("other")(lambda: None)  # two commands: the name is an argument
    result = CliRunner().invoke(cli, ["device-plugin", "--node-name", NODE, *flags])
    assert result.exit_code == 0, result.output
    guard = seen["guard"]
    assert guard is None or isinstance(guard, AllocationGuard)
    return guard


def test_the_command_refuses_unsigned_allocations_by_default(
        harness: PluginHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 25 item 4: without --allocation-key-dir the command used to serve a forged
    # pod its hand-written 81920 MiB; now it serves nothing without the key
    up(harness, guard=_guard_of_the_command(monkeypatch))
    pod_with(harness, "p", f"{A},NVIDIA,81920,100:;", key=b"")
    refused(harness, "has no --allocation-key-dir")
    pod_with(harness, "p", f"{A},NVIDIA,1000,10:;")  # even a signed one: no key to check
    refused(harness, "--trust-unsigned-allocations")
    # the Node says strict signing is on (hami top reads it)
    wait(lambda: harness.kube.nodes[NODE][0].get(names.NODE_TRUST_UNSIGNED) == "false",
         what="hami.io/node-trust-unsigned-allocations: false on the node")


def test_the_command_serves_unsigned_allocations_when_told_to(
        harness: PluginHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guard_of_the_command(monkeypatch, "--trust-unsigned-allocations")
    assert guard is None  # HAMi's behaviour, for a migration from HAMi
    # a node whose plugin was strict before: the annotation follows the flag
    harness.kube.patch_node_annotations(NODE, {names.NODE_TRUST_UNSIGNED: "false"})
    up(harness, guard=guard)
    wait(lambda: harness.kube.nodes[NODE][0].get(names.NODE_TRUST_UNSIGNED) == "true",
         what="hami.io/node-trust-unsigned-allocations: true on the node")
    pod_with(harness, "p", f"{A},NVIDIA,3000,10:;", key=b"")
    env = harness.kubelet.allocate([f"{A}-0"]).container_responses[0].envs
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


def test_a_pod_without_hamis_allocation_waiting_on_the_node_blocks_serving(
        guarded: PluginHarness) -> None:
    # A tenant pod of another scheduler (or created with spec.nodeName while the webhook
    # was down) asks for the GPU resource on the node while a hami pod waits for its
    # Allocate: kubelet's request names no pod, so serving the hami pod's grant here could
    # hand the tenant's container that slice.
    pod_with(guarded, "p", f"{A},NVIDIA,20480,50:;")
    guarded.kube.add_pod(al.PodView("tenant", "squatter", "uid-squatter", NODE, "Pending", {},
                                    (al.ContainerView("c", {}),), 0,
                                    scheduler_name="default-scheduler",
                                    resource_names=frozenset({"nvidia.com/gpu"})))
    with pytest.raises(grpc.RpcError) as err:
        guarded.kubelet.allocate([f"{A}-0"])
    assert "pods without hami's allocation wait for nvidia.com/gpu" in err.value.details()
    assert "tenant/squatter" in err.value.details()
    victim = guarded.kube.pods[("default", "p")].annotations
    assert victim[al.BIND_PHASE] == "allocating" and victim[al.DEVICES_TO_ALLOCATE]
    # once the stranger is gone, the hami pod is served its own grant
    guarded.kube.delete_pod("tenant", "squatter")
    env = guarded.kubelet.allocate([f"{A}-0"]).container_responses[0].envs
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"


def test_pod_view_lists_the_resources_its_containers_name() -> None:
    from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    from hami.deviceplugin.kube import pod_view

    pod = Pod(metadata=ObjectMeta(name="p", namespace="n", uid="u"),
              spec=PodSpec(schedulerName="other", containers=[
                  Container(name="a", resources=ResourceRequirements(limits={"nvidia.com/gpu": "1"})),
                  Container(name="b", resources=ResourceRequirements(requests={"cpu": "1"})),
                  Container(name="c")]))
    view = pod_view(pod)
    assert view.resource_names == frozenset({"nvidia.com/gpu", "cpu"})
    assert view.scheduler_name == "other"
    assert not view.deleting


def test_pod_view_says_when_the_pod_is_being_deleted() -> None:
    import datetime

    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    from hami.deviceplugin.kube import pod_view

    pod = Pod(metadata=ObjectMeta(name="p", namespace="n", uid="u",
                                  deletionTimestamp=datetime.datetime(2026, 12, 2)),
              spec=PodSpec(containers=[Container(name="c")]))
    assert pod_view(pod).deleting
