"""What a trace becomes in the scheduling core: ledger nodes and admitted pod requests.

A trace node becomes a :class:`~hami.core.ledger.UsageLedger` node (:func:`build_ledger`:
its GPUs as the device plugin registers them, CPU and memory capacity checked); a trace
task becomes a Kubernetes Pod (:func:`pod_manifest`) that the webhook logic admits and
:func:`hami.core.request.pod_request` parses (:class:`PodShapes`, once per distinct
shape). :mod:`hami.sim.replay` places the requests in arrival order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.api import names
from hami.core.admission import admit
from hami.core.config import SchedulerConfig
from hami.core.ledger import UsageLedger
from hami.core.model import DeviceInfo, PodRequest
from hami.core.request import pod_request
from hami.sim.mig import mig_device, mig_model, require_mig_model
from hami.sim.trace import TraceNode, TracePod

#: GPU memory per trace model, MiB. The trace gives none (README "Columns and units");
#: public models use their marketed size (T4: 15360 MiB as the driver reports it).
#: G1/G2/G3 are undisclosed: we assume 32 GiB cards. Requests are percentages of the
#: card, so this choice changes only integer rounding, never which pod fits where.
GPU_MEMORY_MIB: dict[str, int] = {
    "V100M16": 16384, "V100M32": 32768, "P100": 16384, "T4": 15360, "A10": 24576,
    "G1": 32768, "G2": 32768, "G3": 32768,
}
DEFAULT_GPU_MEMORY_MIB = 16384
#: Default tasks per GPU: the trace's smallest share is 50 milli (5 %), so 20 fit a card.
DEFAULT_SPLIT_COUNT = 20


def device_type(model: str) -> str:
    """HAMi-style device type of a trace GPU model (``NVIDIA-<model>``)."""
    return f"NVIDIA-{model}"


def gpu_memory_mib(model: str, gpu_memory: dict[str, int] | None = None) -> int:
    """Card memory of a trace GPU model, MiB: :data:`GPU_MEMORY_MIB` (or ``gpu_memory``),
    then a MIG-capable model's card memory, else :data:`DEFAULT_GPU_MEMORY_MIB`."""
    memory = gpu_memory or GPU_MEMORY_MIB
    if model in memory:
        return memory[model]
    mig = mig_model(model)
    return mig.card_memory_mib if mig is not None else DEFAULT_GPU_MEMORY_MIB


def build_ledger(nodes: Sequence[TraceNode], split_count: int = DEFAULT_SPLIT_COUNT,
                 gpu_memory: dict[str, int] | None = None) -> UsageLedger:
    """A ledger holding every GPU node, with CPU and memory capacity checked.

    A ``hami-core`` node's GPUs take ``split_count`` tasks each; a ``mig`` node's GPUs are
    MIG-mode devices with their model's profiles (:func:`hami.sim.mig.mig_device`).

    Raises:
        hami.sim.mig.MigModelError: a ``mig`` node whose model has no MIG profiles.
    """
    ledger = UsageLedger(capacity=max(64, sum(n.gpu for n in nodes)))
    for node in nodes:
        if node.mode == names.MODE_MIG:
            model = require_mig_model(node.model, node.name)
            devices = [mig_device(f"{node.name}-gpu{i}", i, device_type(node.model), model)
                       for i in range(node.gpu)]
        else:
            mib = gpu_memory_mib(node.model, gpu_memory)
            devices = [DeviceInfo(uuid=f"{node.name}-gpu{i}", index=i,
                                  split_count=split_count, memory_mib=mib, cores_percent=100,
                                  type=device_type(node.model)) for i in range(node.gpu)]
        ledger.add_node(node.name, devices, cpu_milli=node.cpu_milli,
                        memory_mib=node.memory_mib)
    return ledger


def pod_manifest(pod: TracePod, namespace: str = "default") -> dict[str, Any]:
    """The Kubernetes Pod a trace task becomes (see the module docstring for the map)."""
    limits: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if pod.num_gpu > 0:
        limits = {names.RESOURCE_COUNT: pod.num_gpu,
                  names.RESOURCE_CORES: pod.gpu_milli // 10,
                  names.RESOURCE_MEMORY_PERCENTAGE: pod.gpu_milli // 10}
        if pod.gpu_spec:
            annotations[names.USE_GPUTYPE] = ",".join(pod.gpu_spec)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": namespace, "uid": pod.name,
                     "annotations": annotations},
        "spec": {"containers": [{
            "name": "main",
            "resources": {"limits": limits,
                          "requests": {"cpu": f"{pod.cpu_milli}m",
                                       "memory": f"{pod.memory_mib}Mi"}},
        }]},
    }


class AdmissionError(RuntimeError):
    """The webhook denied a trace pod (never expected for the trace's values)."""


@dataclass
class PodShapes:
    """Admission and request parsing, memoised per pod shape (both are pure): step 2 of
    the replay (:mod:`hami.sim.replay`); :meth:`request` is the pod's own request."""

    config: SchedulerConfig
    #: Per shape, the parsed request's fields (``dataclasses.replace`` costs 3x more).
    cache: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def request(self, pod: TracePod) -> PodRequest:
        """The admitted, parsed request of ``pod``, named after it.

        Raises:
            AdmissionError: the webhook logic denied the pod.
        """
        key = (pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.cpu_milli, pod.memory_mib)
        template = self.cache.get(key)
        if template is None:
            result = admit(pod_manifest(pod), self.config, with_patch=False)
            if not result.allowed:
                raise AdmissionError(f"pod {pod.name} denied: {result.message}")
            parsed = pod_request(result.pod, self.config.registry)
            template = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed)}
            self.cache[key] = template
        return PodRequest(**{**template, "name": pod.name, "uid": pod.name})
