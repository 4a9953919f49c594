"""The vendor device interface (HAMi ``pkg/device/devices.go`` ``Devices``) as one Protocol.

Source (HAMi v2.10): (the interface and the vendor summaries),
(per-vendor keys), (how the filter calls a vendor), (quota names),
(reason vocabulary). Everything here is pure: no clock, no API calls. What HAMi reads
from the clock (``predicate-time``) is passed in through :class:`PatchContext`.

Mapping of HAMi's Go methods to ours:

========================  ==========================================================
HAMi                      here
========================  ==========================================================
``CommonWord()``          :attr:`Vendor.common_word`
``GetResourceNames()``    :meth:`Vendor.resource_names`
``MutateAdmission``       :meth:`Vendor.mutate_admission` (raises :class:`AdmissionError`)
``GenerateResourceReqs``  :meth:`Vendor.request_for_pod` (None = no request)
``GetNodeDevices``        :meth:`Vendor.node_devices` (raises ``CodecError``)
``Fit``                   :meth:`Vendor.fit` -> :class:`hami.core.fit.FitOutcome`
``AddResourceUsage``      :meth:`Vendor.add_usage`
``ScoreNode``             :meth:`Vendor.score_node` (:attr:`Vendor.scores_nodes`)
``PatchAnnotations``      :meth:`Vendor.pod_annotations` (MIG instances in :class:`PatchContext`)
(pod informer)            :meth:`Vendor.decode_allocation`, :meth:`Vendor.decode_mig`
``LockNode``              :attr:`Vendor.lock_annotation` (None = generic node lock)
``CheckHealth``           :attr:`Vendor.handshake_key` (the handshake loop is generic)
========================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hami.core.codec_mig import MigAllocation
from hami.core.fit import DeviceState, FitOutcome, QuotaCheck
from hami.core.model import (
    CardFilters,
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    DeviceInfo,
    PodSingleDevice,
)


class AdmissionError(ValueError):
    """A container's value for a vendor resource is invalid (webhook answers 500, step 4).

    Also raised by :meth:`Vendor.container_request` for values that cannot be a request
    (HAMi would silently drop the request; we refuse, as :mod:`hami.core.request` does).
    """


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """``GetResourceNames()``: the names quota and the webhook care about (HAMi v2.10).

    ``memory_factor`` multiplies quota limits of ``memory`` (only Hygon and NVIDIA have
    one in HAMi; 1 elsewhere). ``memory_unit_mib`` is how many MiB one unit of the memory
    resource is (Cambricon 256, Mthreads 512, Iluvatar 256, Metax-SGPU 1024, else 1).
    """

    count: str
    memory: str = ""
    cores: str = ""
    memory_factor: int = 1
    memory_unit_mib: int = 1
    others: tuple[str, ...] = ()

    def all(self) -> tuple[str, ...]:
        """Every non-empty resource name of the vendor."""
        return tuple(n for n in (self.count, self.memory, self.cores, *self.others) if n)


@dataclass(frozen=True, slots=True)
class EnvIsolation:
    """What the webhook and :mod:`hami.core.isolation` read of a vendor whose containers
    are isolated through env and the container runtime (HAMi v2.10: NVIDIA's device-config
    section; ``Vendor.env_isolation``).

    ``resources``: names whose presence in a container's limits or requests makes it ask
    for the vendor before any mutation (count, memory, memory share, cores).
    ``overwrite_env``: a container that asks for none ends with
    ``NVIDIA_VISIBLE_DEVICES=none`` (``overwriteEnv``). ``runtime_class_name``: set on a
    pod that asks for devices and names none (``runtimeClassName``; "" sets none).
    ``priority_resource``: the limit the webhook writes as ``CUDA_TASK_PRIORITY``;
    ``core_policy``: written as ``GPU_CORE_UTILIZATION_POLICY`` ("" and ``default`` write
    nothing).
    """

    resources: tuple[str, ...] = ()
    overwrite_env: bool = False
    runtime_class_name: str = ""
    priority_resource: str = ""
    core_policy: str = ""


@dataclass(frozen=True, slots=True)
class FitContext:
    """What a vendor's Fit may read besides the devices and the request (HAMi v2.10).

    ``allocated`` is what this pod already got from this vendor on this node, one entry
    per earlier container (HAMi's ``allocated`` argument). ``quota_ok`` is the fit-time
    quota check (None = unlimited).
    """

    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    node_annotations: Mapping[str, str] = field(default_factory=dict)
    node_name: str = ""
    gpu_policy: str = "spread"
    allocated: tuple[ContainerDevices, ...] = ()
    quota_ok: QuotaCheck | None = None

    @property
    def cordoned(self) -> frozenset[str]:
        """UUIDs of ``hami.io/device-cordon`` (comma list, trimmed, empties ignored)."""
        raw = self.node_annotations.get("hami.io/device-cordon", "")
        return frozenset(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True, slots=True)
class PatchContext:
    """Inputs of ``PatchAnnotations`` besides the device grant: the chosen node, the
    scheduler's clock (Unix nanoseconds), so that the backends stay pure, the pod's
    annotations, and ``mig``: the MIG instances the Fit placed on the grant's cards (only
    for a vendor whose cards may be in MIG mode, :attr:`CardFilters.mig`; ``()`` else).
    """

    node_name: str = ""
    now_ns: int = 0
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    mig: tuple[MigAllocation, ...] = ()


@runtime_checkable
class Vendor(Protocol):
    """One accelerator vendor's scheduler-side behaviour (HAMi v2.10)."""

    @property
    def common_word(self) -> str:
        """The vendor key (``NVIDIA``, ``MLU``, ``DCU``, ``Ascend910B3``, ...)."""
        ...

    @property
    def handshake_key(self) -> str:
        """Node annotation of the register handshake (HAMi v2.10)."""
        ...

    @property
    def register_key(self) -> str | None:
        """Node annotation the device plugin registers devices in; None when devices are
        synthesised from node capacity (Cambricon, Kunlun, AWS Neuron, ...)."""
        ...

    @property
    def lock_annotation(self) -> str | None:
        """The vendor's own node lock key (Cambricon), None for the generic node lock."""
        ...

    @property
    def to_allocate_key(self) -> str | None:
        """Pod annotation consumed by the device plugin (None when HAMi writes none)."""
        ...

    @property
    def allocated_key(self) -> str:
        """Pod annotation the scheduler's pod informer reads back (HAMi v2.10)."""
        ...

    @property
    def policy_neutral(self) -> bool:
        """HAMi's "policy-neutral" marker: ScoreNode is scaled by ±10000 (HAMi v2.10 step 5)."""
        ...

    @property
    def env_isolation(self) -> EnvIsolation | None:
        """The vendor's env and runtime isolation settings (NVIDIA's), None for a vendor
        whose containers the isolation rules do not guard."""
        ...

    @property
    def filters(self) -> CardFilters:
        """The pod annotation keys that filter this vendor's cards (its table row's)."""
        ...

    def resource_names(self) -> ResourceNames:
        """Resource names and memory factor (``GetResourceNames``)."""
        ...

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Webhook mutation of one container in place; True if it asks for this vendor.

        Raises:
            AdmissionError: a value of this vendor's resources is invalid.
        """
        ...

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        """The container's request of this vendor, None when it asks for none.

        Raises:
            AdmissionError: a value is malformed.
        """
        ...

    def request_for_pod(self, container: Mapping[str, Any],
                        pod_annotations: Mapping[str, str]) -> ContainerDeviceRequest | None:
        """:meth:`container_request` given the pod's annotations (``GenerateResourceRequests``
        sees the whole pod: Ascend's ``huawei.com/vnpu-mode`` chooses its request shape).

        Raises:
            AdmissionError: a value is malformed.
        """
        ...

    @property
    def share_prefilter(self) -> bool:
        """True when this vendor's Fit follows the GPU-share rules (slots, memory, cores,
        exclusive cards: :func:`hami.core.fit.fit_shares`), so the vectorised share
        prefilter is a necessary condition of it; else only its device count is checked."""
        ...

    @property
    def fast_path(self) -> bool:
        """True when the core serves this vendor's requests on its vectorised share path
        (:attr:`hami.core.model.PodRequest.containers`, ``FilterResult.devices`` and
        ``mig``, the share prefilter's masks, the namespace :class:`~hami.core.quota.QuotaLedger`)
        instead of the per-vendor entries. That path runs :func:`hami.core.fit.fit_shares`
        itself, so only a vendor whose :meth:`fit` is that Fit may say True. A registry's
        fast-path vendor is :func:`fast_path_vendor`."""
        ...

    @property
    def scores_nodes(self) -> bool:
        """True when :meth:`score_node` can be non-zero or the vendor is policy-neutral,
        so the filter must fit every candidate instead of taking the first that fits."""
        ...

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        """Parse the node object (annotations, capacity) into devices of this vendor.

        Returns ``()`` when the node has none of this vendor's devices.

        Raises:
            hami.core.gowire.CodecError: the register annotation is malformed.
        """
        ...

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        """Choose devices for one container among this vendor's devices (best first)."""
        ...

    def add_usage(self, state: DeviceState, device: ContainerDevice) -> None:
        """Account one granted device on the node's working copy (``AddResourceUsage``)."""
        ...

    def score_node(self, devices: Sequence[DeviceState], grant: Sequence[ContainerDevices],
                   ctx: FitContext) -> float:
        """Added to the node score (``ScoreNode``); most vendors return 0."""
        ...

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        """Pod annotations the vendor's device plugin expects (``PatchAnnotations``).

        ``grant`` has one entry per container (init first); empty when nothing granted.
        """
        ...

    def decode_allocation(self, annotations: Mapping[str, str]) -> PodSingleDevice:
        """This vendor's allocation read back from a pod's annotations (pod informer, HAMi v2.10).

        Raises:
            hami.core.gowire.CodecError: the annotation is malformed.
        """
        ...

    def decode_mig(self, annotations: Mapping[str, str]) -> tuple[MigAllocation, ...]:
        """The MIG instances of this vendor's allocation read back from a pod's
        annotations (what :meth:`pod_annotations` wrote from :attr:`PatchContext.mig`);
        ``()`` for none or a vendor without MIG cards.

        Raises:
            hami.core.gowire.CodecError: the annotation is malformed.
        """
        ...


def fast_path_vendor(registry: Mapping[str, Vendor]) -> tuple[str, Vendor] | None:
    """``(registry key, backend)`` of the vendor whose requests take the core's share fast
    path: the first in key (CommonWord) order whose :attr:`Vendor.fast_path` is True; None
    when no registered vendor says so. Every other vendor, one that also says True
    included, goes through the per-vendor entries (``PodRequest.vendors``)."""
    for word in sorted(registry):
        vendor = registry[word]
        if vendor.fast_path:
            return word, vendor
    return None

