"""The chart's DRA-mode admission policy on the real apiserver: the DRA plugin's account,
with a token bound to its pod on node A, may write node A's ResourceSlices only. Node A
cannot publish cards for node B, replace or empty node B's slice, hijack node B's pool,
or squat a slice name of B's; the honest plugin (the real :class:`SlicePublisher`) creates
and updates its own slice. A token not bound to a pod on a node writes nothing.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceSlice

from hami.core.model import DeviceInfo
from hami.dra import slices
from hami.dra.node import SlicePublisher
from hami.testing.controlplane import ControlPlane, create_gpu_node, wait_until
from tests.deploy.chart import NAMESPACE, render
from tests.deploy.e2e import accounts
from tests.deploy.e2e.accounts import token_client

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("require_helm")]

DRA_SA = "hami-dra-plugin"


def _cards(node: str, n: int = 2) -> tuple[DeviceInfo, ...]:
    return tuple(DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=4, memory_mib=1024,
                            cores_percent=100, type="NVIDIA-Tesla T4") for i in range(n))


def _refused(call: Callable[[], Any], *words: str) -> str:
    with pytest.raises(ApiError) as err:
        call()
    message = str(err.value.status.message)
    assert err.value.status.code == 403, message
    for word in words:
        assert word in message, message
    return message


@pytest.fixture(scope="module")
def dra_policy(kube_client: Any) -> Iterator[list[dict[str, Any]]]:
    """The chart's accounts, RBAC and admission policies with ``dra.enabled``, in force."""
    objs = render({"dra": {"enabled": True}})
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    assert "hami-dra-slices" in names, f"the chart ships no DRA slice policy: {sorted(names)}"
    done = accounts.apply(kube_client, objs)
    try:
        yield objs
    finally:
        accounts.remove(kube_client, done)


def test_dra_plugin_account_writes_only_its_own_nodes_slices(
        dra_policy: list[dict[str, Any]], kube_client: Any, control_plane: ControlPlane) -> None:
    tag = uuid.uuid4().hex[:6]
    node_a, node_b = f"dra-a-{tag}", f"dra-b-{tag}"
    for node in (node_a, node_b):
        create_gpu_node(kube_client, node, gpus=0, labels={"gpu": "dra"})
    plugin_pod = kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"dra-plugin-{tag}", "namespace": NAMESPACE},
        "spec": {"nodeName": node_a, "serviceAccountName": DRA_SA,
                 "schedulerName": "e2e-nobody", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}))
    # node B's real slice, published by node B's own plugin (here: the admin)
    assert SlicePublisher(kube_client, node_b).sync(_cards(node_b))
    plugin = token_client(kube_client, control_plane, DRA_SA, bound_pod=plugin_pod)

    def fake_for_b() -> Any:
        return SlicePublisher(plugin, node_b).sync(_cards(node_b, 1))

    probe = codecs.from_dict(slices.resource_slice(node_b, _cards(node_b, 1)))
    probe.metadata.name = f"{node_b}-gpu.hami.io-mig-0"
    try:
        # the policy needs a moment to be in force after it was applied (a dry run)
        wait_until(lambda: _denied(lambda: plugin.create(probe, dry_run=True)), timeout_s=30,
                   what="DRA slice policy in force")
        # honest: node A's plugin creates, then updates its own slice
        own = SlicePublisher(plugin, node_a)
        assert own.sync(_cards(node_a))
        assert own.sync(_cards(node_a), cordoned=frozenset({f"GPU-{node_a}-1"}))
        stored = kube_client.get(ResourceSlice, slices.slice_name(node_a)).to_dict()
        assert stored["spec"]["devices"][1]["taints"][0]["value"] == "cordoned"

        on_a = f"on node {node_a} may write only that node's ResourceSlices"
        # attacker: replace node B's slice (fake card) or empty it
        _refused(fake_for_b, on_a)
        real_b = kube_client.get(ResourceSlice, slices.slice_name(node_b)).to_dict()
        emptied = slices.resource_slice(node_b, (), generation=99)
        emptied["metadata"]["resourceVersion"] = real_b["metadata"]["resourceVersion"]
        _refused(lambda: plugin.replace(codecs.from_dict(emptied)), on_a)
        # attacker: a new slice publishing cards on node B under another name
        for name, node_name, pool in (
                (f"{node_b}-gpu.hami.io-mig-0", node_b, node_b),   # B's name, B's node
                (f"{node_a}-gpu.hami.io-mig-0", node_b, node_b),   # A's name, B's node
                (f"{node_a}-gpu.hami.io-mig-0", node_a, node_b),   # B's pool (hijack)
                (f"{node_a}-extra", node_a, node_a),               # a name hami never gives
                (f"{node_a}-gpu.hami.io-x", node_a, node_a)):
            doc = slices.resource_slice(node_a, _cards(node_a, 1), generation=99)
            doc["metadata"]["name"] = name
            doc["spec"]["nodeName"] = node_name
            doc["spec"]["pool"]["name"] = pool
            _refused(lambda doc=doc: plugin.create(codecs.from_dict(doc)), on_a)
        # a token that names no node (not bound to a pod on one) writes nothing
        loose = token_client(kube_client, control_plane, DRA_SA)
        _refused(lambda: SlicePublisher(loose, node_a).sync(_cards(node_a, 1)),
                 "needs a token bound to its pod on a node")
        after_b = kube_client.get(ResourceSlice, slices.slice_name(node_b)).to_dict()
        assert after_b["metadata"]["resourceVersion"] == real_b["metadata"]["resourceVersion"]
        assert [d["name"] for d in after_b["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    finally:
        kube_client.delete(Pod, plugin_pod.metadata.name, namespace=NAMESPACE, grace_period=0)
        for node in (node_a, node_b):
            with contextlib.suppress(ApiError):
                kube_client.delete(ResourceSlice, slices.slice_name(node))
            kube_client.delete(Node, node)


def _denied(call: Callable[[], Any]) -> bool:
    try:
        call()
    except ApiError as err:
        if err.status.code == 403:
            return True
        raise
    return False


def test_scheduler_account_deletes_only_hamis_templates(
        dra_policy: list[dict[str, Any]], kube_client: Any, control_plane: ControlPlane) -> None:
    """The scheduler holds ``delete`` on ResourceClaimTemplates for its collector of unused
    templates (hami.dra.templategc); the chart's policy ``hami-dra-templates`` lets it
    delete only those labelled ``hami.io/dra-template=true``: a tenant's own template is
    refused, hami's is collected by the real collector under the scheduler's token."""
    import asyncio

    from lightkube import AsyncClient
    from lightkube.resources.resource_v1 import ResourceClaimTemplate

    from hami.dra import translate as tr
    from hami.dra.templategc import TemplateCollector
    from hami.testing.controlplane import ensure_namespace

    ns = f"tmpl-{uuid.uuid4().hex[:6]}"
    ensure_namespace(kube_client, ns)
    name, ours = tr.template_for(tr.claim_spec(1, 1000, 0, []))
    kube_client.create(codecs.from_dict({**ours, "metadata": {**ours["metadata"],
                                                              "namespace": ns}}))
    tenant = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": "tenant", "namespace": ns},
              "spec": ours["spec"]}
    kube_client.create(codecs.from_dict(tenant))
    scheduler = token_client(kube_client, control_plane, "hami-scheduler")
    _refused(lambda: scheduler.delete(ResourceClaimTemplate, "tenant", namespace=ns),
             "may delete only the ResourceClaimTemplates hami made")

    async def collect() -> list[tuple[str, str]]:
        client = AsyncClient(scheduler.config, trust_env=False)
        try:
            gc = TemplateCollector(client, lambda: True, idle_s=0)
            return await gc.sweep()  # ready now, no idle time: collects at once
        finally:
            await client.close()

    assert (ns, name) in asyncio.run(collect())
    left = {t.metadata.name for t in kube_client.list(ResourceClaimTemplate, namespace=ns)}
    assert left == {"tenant"}
