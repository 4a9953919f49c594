"""DRA mode's namespace GPU quota on ResourceClaims and ResourceClaimTemplates as they are
created, on the real control plane: a real ``hami scheduler --dra-mode`` process is the
webhook the kube-apiserver calls (pods, claims and templates, as the chart registers it
with dra.enabled), its quota is a real ResourceQuota, the claims are made by the real
resourceclaim controller of kube-controller-manager and allocated by the default
kube-scheduler from a published slice (no kubelet: pods are bound, not run).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.dra.slices import DRIVER
from hami.testing.controllers import start_controller_manager
from hami.testing.controlplane import ensure_namespace

from .drabed import DRA_ARGS, Cards, dra_bed, wait_for
from .hami_harness import gpu_pod

pytestmark = pytest.mark.e2e

NS = "claimquota"
LIMIT_MIB = 20000
CARD_MIB = 16384


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Control plane + controller manager + one node with two published cards + hami
    scheduler --dra-mode registered as the webhook for pods, claims and templates + a
    ResourceQuota of 20000 MiB of GPU memory in :data:`NS`."""
    # the apiserver calls it (every test, not only the first, needs that; NS has a
    # quota a probe pod could meet, default has none)
    with dra_bed(tmp_path_factory.mktemp("k8s-claimquota"), namespace=NS,
                 nodes={"claimquota-0": Cards(2, CARD_MIB)}, quota_mib=LIMIT_MIB,
                 hami_args=DRA_ARGS, webhook="hami-claimquota", webhooks=("pods", "claims"),
                 serving_namespace="default") as dra:
        yield {"cp": dra.cp, "client": dra.client, "manager": dra.manager, "hami": dra.hami}


def _request(*memory: str) -> dict[str, Any]:
    entries = [{"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": m}}} for m in memory]
    if len(entries) == 1:
        return {"name": "gpu", "exactly": entries[0]}
    return {"name": "gpu", "firstAvailable": [{"name": f"e{i}", **e}
                                              for i, e in enumerate(entries)]}


def _template(name: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [_request(memory)]}}}}


def _claim(name: str, *memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [_request(*memory)]}}}


def _claiming(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "g", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c", "image": "pause",
                                     "resources": {"claims": [{"name": "g"}]}}]}}


def _claims(client: Any) -> dict[str, dict[str, Any]]:
    from lightkube.resources.resource_v1 import ResourceClaim

    return {c.metadata.name: c.to_dict() for c in client.list(ResourceClaim, namespace=NS)}


def _owner(claim: dict[str, Any]) -> str:
    return str(((claim["metadata"].get("ownerReferences") or [{}])[0]).get("name") or "")


def _refused(client: Any, obj: dict[str, Any]) -> str:
    from lightkube import ApiError, codecs

    with pytest.raises(ApiError) as err:
        client.create(codecs.from_dict(obj))
    return str(err.value.status.message)


def test_claims_and_templates_are_checked_when_created(bed: dict[str, Any]) -> None:
    from lightkube import ApiError, codecs
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate

    client = bed["client"]
    # the scheduler has read the ResourceQuota once a claim over it is refused
    wait_for(lambda: _try_refused(client, _claim("probe", "30000Mi")), 60,
             "the webhook enforces the ResourceQuota")

    # An honest GPU pod: translated, hami's template created, the controller's claim
    # admitted (4000 MiB of 20000, counted as the pod was), allocated, the pod bound.
    client.create(codecs.from_dict(gpu_pod("honest", memory_mib=4000, namespace=NS)))
    wait_for(lambda: client.get(Pod, "honest", namespace=NS).spec.nodeName, what="honest bound")
    (claim,) = [c for c in _claims(client).values() if _owner(c) == "honest"]
    assert (claim.get("status") or {}).get("allocation"), claim

    # A tenant's claim or template over what is left is refused when created; a
    # prioritized list counts its largest entry (17000), not its last (1 MiB).
    message = _refused(client, _template("t", "30000Mi"))
    assert "exceeding resource quota" in message and f"ResourceClaimTemplate {NS}/t" in message
    message = _refused(client, _claim("sly", "17000Mi", "1Mi"))
    assert f"ResourceClaim {NS}/sly asks for 17000 MiB" in message, message

    # The delete-and-recreate path. With the controller stopped, a pod naming a 2000 MiB
    # template is admitted (4000 + 2000 fits). The tenant deletes the template and creates
    # it again asking 30000 MiB: refused. 9000 MiB fits as one claim (4000 + 9000): it is
    # admitted, and the tenant adds a claim of 8000 MiB (12000 in all). When the
    # controller makes the pod's claim from the new template (12000 + 9000 > 20000), it
    # is refused, again at each retry, until there is room.
    bed["manager"].component.stop()
    client.create(codecs.from_dict(_template("t", "2000Mi")))
    client.create(codecs.from_dict(_claiming("p1", "t")))
    client.delete(ResourceClaimTemplate, "t", namespace=NS)
    assert "exceeding resource quota" in _refused(client, _template("t", "30000Mi"))
    client.create(codecs.from_dict(_template("t", "9000Mi")))
    client.create(codecs.from_dict(_claim("filler", "8000Mi")))
    start_controller_manager(bed["cp"])
    time.sleep(5.0)  # the controller tries, and retries
    assert not [c for c in _claims(client).values() if _owner(c) == "p1"]
    assert not client.get(Pod, "p1", namespace=NS).status.resourceClaimStatuses
    client.delete(ResourceClaim, "filler", namespace=NS)
    wait_for(lambda: [c for c in _claims(client).values() if _owner(c) == "p1"], 120,
             "p1's claim made once there is room")

    # UPDATE needs no check: the API server keeps the spec of both kinds as created.
    for kind, name, spec in (
            (ResourceClaim, claim["metadata"]["name"],
             {"devices": {"requests": [_request("30000Mi")]}}),
            (ResourceClaimTemplate, "t", {"spec": {"devices": {"requests": [
                _request("30000Mi")]}}})):
        with pytest.raises(ApiError) as err:
            client.patch(kind, name, {"spec": spec}, namespace=NS,
                         patch_type=_merge())
        assert err.value.status.code == 422 and "immutable" in str(err.value.status.message)


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE


def _try_refused(client: Any, obj: dict[str, Any]) -> bool:
    from lightkube import ApiError, codecs
    from lightkube.resources.resource_v1 import ResourceClaim

    try:
        client.create(codecs.from_dict(obj))
    except ApiError as err:
        return "exceeding resource quota" in str(err.status.message)
    client.delete(ResourceClaim, obj["metadata"]["name"], namespace=NS)
    return False


def test_namespaces_without_a_quota_are_not_checked(bed: dict[str, Any], tmp_path: Path) -> None:
    from lightkube import codecs
    from lightkube.resources.resource_v1 import ResourceClaim

    client = bed["client"]
    ensure_namespace(client, "noquota")
    doc = _claim("huge", "90000Mi")
    doc["metadata"]["namespace"] = "noquota"
    client.create(codecs.from_dict(doc))
    client.delete(ResourceClaim, "huge", namespace="noquota")


def test_a_pod_naming_a_hami_template_without_its_signature_gets_none(
        bed: dict[str, Any]) -> None:
    """The template is made from the scheduler's pod watch, only for what its webhook
    signed: a pod created with a hami template name and no signature, or with the
    signature of a pod of another namespace (copied), gets no template, no claim, and a
    Warning Event; an honest GPU pod in the same namespace gets its template."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Event, Pod
    from lightkube.resources.resource_v1 import ResourceClaimTemplate

    from hami.dra import signedspecs
    from hami.dra import translate as tr

    client = bed["client"]
    ensure_namespace(client, "nosig")
    name, template = tr.template_for(tr.claim_spec(1, 1500, 0, []))
    # the signature of an honest pod of NS, for the same spec
    client.create(codecs.from_dict(gpu_pod("signed", memory_mib=1500, namespace=NS)))
    signed = client.get(Pod, "signed", namespace=NS).metadata.annotations
    assert signed[signedspecs.SPECS_ANNOTATION] and signed[signedspecs.SIGNATURE_ANNOTATION]
    wait_for(lambda: name in [t.metadata.name for t in client.list(ResourceClaimTemplate,
                                                                    namespace=NS)], 30,
             "the honest pod's template")
    copied = {k: signed[k] for k in (signedspecs.SPECS_ANNOTATION,
                                     signedspecs.SIGNATURE_ANNOTATION)}
    for pod_name, carried in (("bare", {}), ("copied", copied)):
        doc = _claiming(pod_name, name)
        doc["metadata"]["namespace"] = "nosig"
        doc["metadata"]["annotations"] = carried
        client.create(codecs.from_dict(doc))

    def refused() -> set[str]:
        return {e.involvedObject.name for e in client.list(Event, namespace="nosig")
                if e.reason == "DraTemplateRefused"}

    assert wait_for(lambda: refused() == {"bare", "copied"}, 60, "both refusals recorded")
    assert [t.metadata.name for t in client.list(ResourceClaimTemplate, namespace="nosig")] == []
    for pod_name in ("bare", "copied"):
        pod = client.get(Pod, pod_name, namespace="nosig")
        assert not pod.spec.nodeName and not pod.status.resourceClaimStatuses
    assert template["metadata"]["name"] == name
