"""One DRA-mode bed on its own real control plane, for the ``test_dra_*`` modules.

:func:`dra_bed` starts, in this order and each only when asked: etcd, kube-apiserver
(and the default kube-scheduler), kube-controller-manager with the resourceclaim and
garbage-collector controllers, a namespace, the ``gpu.hami.io`` DeviceClass, nodes whose
fake cards are published as ResourceSlices (no kubelet: pods are bound, not run), a GPU
ResourceQuota, further objects, ``hami scheduler --dra-mode`` processes (several behind a
round-robin forwarder, as a Service in front of replicas), and hami's webhooks registered
as the chart registers them in DRA mode: pods through a MutatingWebhookConfiguration,
ResourceClaims and ResourceClaimTemplates through a ValidatingWebhookConfiguration (it
sees the claim's UID). Everything stops when the ``with`` block ends.

When a Kubernetes binary is missing the calling test is skipped, or fails where
``HAMI_E2E_REQUIRED=1`` (see ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import FakeBackend
from hami.dra.node import DraAgent, SlicePublisher
from hami.testing.controllers import ControllerManager, start_controller_manager
from hami.testing.controlplane import (
    BinariesMissing,
    ControlPlane,
    create_gpu_node,
    ensure_namespace,
)
from hami.testing.dranode import device_class
from hami.testing.gpupods import wait_webhook_serving, webhook_configuration

from .conftest import REQUIRED
from .hami_harness import HamiProcess, RoundRobinForwarder, Tls

#: ``hami scheduler`` arguments of DRA mode whose translated pods stay with the default
#: kube-scheduler (``--scheduler-name=``: no schedulerName is written).
DRA_ARGS = ("--dra-mode", "--scheduler-name=")


@dataclass(frozen=True)
class Cards:
    """One node's fake cards: ``count`` cards of ``model`` with ``memory_mib`` MiB each."""

    count: int = 2
    memory_mib: int = 16384
    model: str = "Tesla T4"


def wait_for(check: Callable[[], Any], timeout_s: float = 90.0, what: str = "", *,
             interval_s: float = 0.5, state: Callable[[], str] | None = None) -> Any:
    """Call ``check`` every ``interval_s`` seconds until it returns something true, and
    return that. Raises ``AssertionError`` naming ``what`` (and ``state()``, e.g. the
    objects and logs that explain it, when given) after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}"
                         + (f"; {state()}" if state is not None else ""))


def publish_cards(client: Any, node: str, inventory: Path, cards: Cards,
                  split: int = 10) -> DraAgent:
    """Write ``node``'s fake inventory to ``inventory`` (cards ``GPU-<node>-<i>``) and
    publish its ResourceSlice once, as hami's DRA agent does (``split`` shares a card);
    the node object must exist. Returns the agent (publishing again writes nothing while
    the cards are unchanged)."""
    inventory.write_text(json.dumps({"gpus": [{
        "model": cards.model, "memory_mib": cards.memory_mib, "count": cards.count,
        "uuids": [f"GPU-{node}-{i}" for i in range(cards.count)]}]}))
    agent = DraAgent(node, FakeBackend(inventory), PluginConfig(device_split_count=split),
                     client)
    assert SlicePublisher(client, node).sync(agent.devices())
    return agent


def ensure_device_class(client: Any) -> None:
    """Create hami's DeviceClass; one already there (another test of a shared control
    plane made it) is fine, any other refusal is raised (``lightkube.ApiError``)."""
    from lightkube import ApiError, codecs

    try:
        client.create(codecs.from_dict(device_class()))
    except ApiError as exc:
        if exc.status.code != 409:
            raise


def gpu_quota(namespace: str, limit_mib: int) -> dict[str, Any]:
    """A ResourceQuota ``gpu`` of ``limit_mib`` MiB of GPU memory
    (``limits.nvidia.com/gpumem``) in ``namespace``."""
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(limit_mib)}}}


def claims_webhook_configuration(name: str, url: str, ca_pem: bytes) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration ``name`` like the chart's in DRA mode: CREATE of
    ResourceClaims and ResourceClaimTemplates, sent to ``<url>/webhook``, otherwise as
    :func:`~hami.testing.gpupods.webhook_configuration`'s pod webhook."""
    hook = json.loads(json.dumps(webhook_configuration(name, url, ca_pem)["webhooks"][0]))
    hook["name"] = "claims.vgpu.hami.io"
    hook.pop("reinvocationPolicy")
    hook["rules"] = [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                      "operations": ["CREATE"],
                      "resources": ["resourceclaims", "resourceclaimtemplates"]}]
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": [hook]}


@dataclass
class DraBed:
    """What :func:`dra_bed` started: ``client`` is cluster admin on ``cp``; ``work`` the
    bed's directory (inventories, logs, TLS); ``agents`` the published nodes' DRA agents
    by node name; ``hamis`` the scheduler processes (``hami`` the first); ``forwarder``
    the round-robin forwarder when there are several."""

    cp: ControlPlane
    client: Any
    work: Path
    manager: ControllerManager | None = None
    agents: dict[str, DraAgent] = field(default_factory=dict)
    tls: Tls | None = None
    hamis: list[HamiProcess] = field(default_factory=list)
    forwarder: RoundRobinForwarder | None = None

    @property
    def hami(self) -> HamiProcess:
        return self.hamis[0]


def _missing(err: BinariesMissing) -> NoReturn:
    if REQUIRED:
        pytest.fail(str(err))
    pytest.skip(str(err))


@contextlib.contextmanager
def dra_bed(work: Path, *, default_scheduler: bool = True, controller_manager: bool = True,
            manager_user: str | None = None, namespace: str | None = None,
            nodes: Mapping[str, Cards] | None = None, split: int = 10,
            quota_mib: int | None = None, objects: Sequence[dict[str, Any]] = (),
            hami_args: Sequence[str] | None = None, hami_names: Sequence[str] = ("hami-dra",),
            webhook: str = "", webhooks: Collection[str] = ("pods",),
            serving_namespace: str | None = None) -> Iterator[DraBed]:
    """Start a DRA bed (module docstring) under ``work`` (control plane in ``work/cp``).

    Args:
        default_scheduler: start the default kube-scheduler with the control plane.
        controller_manager: start kube-controller-manager (``manager_user``: the user its
            certificate names, e.g. ``system:kube-controller-manager``; None: the admin).
        namespace: created when given; ``quota_mib`` needs it (a :func:`gpu_quota` there).
        nodes: node name -> its cards, each node made Ready and its slice published
            (``split``: shares per card).
        objects: created (as dicts) after the quota, before hami starts.
        hami_args: ``hami scheduler`` arguments (e.g. :data:`DRA_ARGS`); None: no hami.
        hami_names: one process per name; with several, the webhooks go through a
            :class:`RoundRobinForwarder`.
        webhook: the webhook configurations' name; ``webhooks`` says which are
            registered: ``"pods"`` (mutating) and/or ``"claims"`` (validating).
        serving_namespace: wait until the apiserver calls the pod webhook there.

    Raises:
        lightkube.ApiError, ControlPlaneError: a step failed (the bed is stopped).
    """
    from lightkube import codecs

    try:
        cp = ControlPlane(workdir=work / "cp")
    except BinariesMissing as err:
        _missing(err)
    cp.start(default_scheduler=default_scheduler)
    bed = DraBed(cp=cp, client=None, work=work)
    try:
        if controller_manager:
            try:
                bed.manager = start_controller_manager(cp, user=manager_user)
            except BinariesMissing as err:
                _missing(err)
        client = bed.client = cp.client()
        if namespace is not None:
            ensure_namespace(client, namespace)
        client.create(codecs.from_dict(device_class()))
        for node, cards in (nodes or {}).items():
            create_gpu_node(client, node, gpus=0)
            bed.agents[node] = publish_cards(client, node, work / f"{node}.yaml", cards, split)
        if quota_mib is not None:
            assert namespace is not None, "a quota needs the namespace"
            client.create(codecs.from_dict(gpu_quota(namespace, quota_mib)))
        for obj in objects:
            client.create(codecs.from_dict(obj))
        if hami_args is not None:
            tls = bed.tls = Tls(work / "tls")
            for name in hami_names:
                bed.hamis.append(HamiProcess(cp, tls, work, args=hami_args, name=name).start())
            url = bed.hami.url
            if len(bed.hamis) > 1:
                bed.forwarder = RoundRobinForwarder(bed.hamis)
                url = bed.forwarder.url
            if "pods" in webhooks:
                client.create(codecs.from_dict(webhook_configuration(webhook, url, tls.ca_pem)))
            if "claims" in webhooks:
                client.create(codecs.from_dict(
                    claims_webhook_configuration(webhook, url, tls.ca_pem)))
            if serving_namespace is not None:
                wait_webhook_serving(client, serving_namespace)
        yield bed
    finally:
        if bed.forwarder is not None:
            bed.forwarder.close()
        for hami in bed.hamis:
            hami.stop()
        cp.stop()
