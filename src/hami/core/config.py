"""Settings of scheduling, as one immutable object (HAMi v2.10 scheduler flags).

Loading YAML or flags happens in the shells; the core only sees these values. Each
vendor's own settings (NVIDIA's ``nvidia:`` section of the device config included) belong
to its backend in :mod:`hami.devices`, reached through :attr:`SchedulerConfig.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hami.api import names
from hami.core.vendor import Vendor, fast_path_vendor


class ConfigError(ValueError):
    """A device config value has the wrong type or range."""


#: Node policies (HAMi v2.10) and GPU policies (HAMi v2.10) this build knows.
NODE_POLICIES = ("binpack", "spread", "fragmentation-aware")
GPU_POLICIES = ("spread", "binpack", "topology-aware", "mutex", "fragmentation-aware")
#: What a GPU policy may hold: one of these words or a comma list of them, e.g.
#: ``numa,binpack`` (HAMi v2.10: a chain, or bare ``numa``).
GPU_POLICY_WORDS = (*GPU_POLICIES, "numa")
#: Characters of an unknown policy value quoted in a message (the value is tenant input).
_SHOWN_CHARS = 64


def policy_value_known(key: str, value: object) -> bool:
    """Whether a pod's ``hami.io/node-scheduler-policy`` or ``hami.io/gpu-scheduler-policy``
    annotation (``key``) holds a value this build knows.

    A missing (None), empty or whitespace-only value means "not set" and counts as known.
    A node policy must be one of :data:`NODE_POLICIES`; a GPU policy a comma list whose
    every entry (trimmed, case-sensitive) is one of :data:`GPU_POLICY_WORDS`, so an empty
    entry (``binpack,``) is unknown. A value that is not a string is unknown. HAMi itself
    accepts anything and falls back silently (HAMi v2.10); we do not
    (``docs/decisions.md``). Any other ``key`` raises ``KeyError``.
    """
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    if not value.strip():
        return True
    if key == names.NODE_SCHEDULER_POLICY:
        return value.strip() in NODE_POLICIES
    if key == names.GPU_SCHEDULER_POLICY:
        return all(part.strip() in GPU_POLICY_WORDS for part in value.split(","))
    raise KeyError(key)


def unknown_policy_message(key: str, value: object) -> str:
    """``unknown <key> value '<value>'; valid values: ...`` for a value that
    :func:`policy_value_known` refuses (the value quoted and cut to 64 characters)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    if key == names.GPU_SCHEDULER_POLICY:
        valid = f"{', '.join(GPU_POLICY_WORDS)}, or a comma list of them (e.g. numa,binpack)"
    else:
        valid = ", ".join(NODE_POLICIES)
    return f"unknown {key} value {text!r}; valid values: {valid}"


def unknown_policies(annotations: Mapping[str, object]) -> dict[str, str]:
    """The pod's scheduler-policy annotations whose value is unknown, as annotation key ->
    :func:`unknown_policy_message` (node policy first); empty when both are known or unset."""
    return {key: unknown_policy_message(key, annotations.get(key))
            for key in (names.NODE_SCHEDULER_POLICY, names.GPU_SCHEDULER_POLICY)
            if not policy_value_known(key, annotations.get(key))}


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """Cluster-wide scheduling defaults (flags ``--node-scheduler-policy`` binpack and
    ``--gpu-scheduler-policy`` spread, HAMi v2.10); pods may override both by annotation."""

    node_policy: str = "binpack"
    gpu_policy: str = "spread"


@dataclass(frozen=True, slots=True)
class EffectivePolicies:
    """The policies one pod is placed with, and a message per ignored annotation."""

    node_policy: str
    gpu_policy: str
    warnings: tuple[str, ...] = ()


def effective_policies(annotations: Mapping[str, object],
                       policy: SchedulingPolicy) -> EffectivePolicies:
    """The node and GPU policies after the pod's annotation overrides (HAMi v2.10).

    An empty annotation is "not set". An unknown value (one the webhook denies, so only a
    pod that bypassed it gets here) is ignored: the configured policy applies and a
    warning names the value, the valid ones and the policy used. HAMi instead falls back
    to ``spread`` (GPU) or ``binpack`` (node) whatever is configured (docs/decisions.md).
    """
    unknown = unknown_policies(annotations)
    warnings: list[str] = []

    def pick(key: str, configured: str, kind: str) -> str:
        if key in unknown:
            warnings.append(f"{unknown[key]}; the configured {kind} policy "
                            f"{configured!r} was used")
            return configured
        return str(annotations.get(key) or "").strip() or configured

    node_policy = pick(names.NODE_SCHEDULER_POLICY, policy.node_policy, "node")
    gpu_policy = pick(names.GPU_SCHEDULER_POLICY, policy.gpu_policy, "GPU")
    return EffectivePolicies(node_policy, gpu_policy, tuple(warnings))


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything the pure scheduler needs: policy defaults, the
    webhook's scheduler-name settings (HAMi v2.10 step 3 and HAMi v2.10) and the vendor registry.

    ``hook_path`` is the device plugin's ``$HOOK_PATH`` (it mounts ``<hook_path>/vgpu``
    into GPU containers; :mod:`hami.core.isolation` keeps pods' volumes off it).
    ``other_gpu_schedulers`` are schedulerNames besides hami's whose pods may ask for GPUs;
    the webhook admits them unchanged (HAMi admits every other scheduler's pod).
    ``high_priority_namespaces`` are the namespaces whose GPU pods may ask for task
    priority 0 (``nvidia.com/priority: 0``); elsewhere the webhook and ``/filter`` refuse
    it (:mod:`hami.core.isolation`; HAMi lets every pod ask).

    ``registry`` is HAMi's device map (CommonWord -> backend), built once by the shell
    (``hami.devices.registry.make_config`` / ``build_registry`` of the device config, HAMi
    v2.10). The core reaches every vendor's rules and settings through it, NVIDIA's
    included (its settings are its backend's: ``hami.devices.nvidia.settings``).
    An empty registry registers no vendor: no pod asks for devices.
    """

    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    hook_path: str = "/usr/local"
    other_gpu_schedulers: tuple[str, ...] = ()
    high_priority_namespaces: tuple[str, ...] = ()
    registry: Mapping[str, Vendor] = field(default_factory=dict, hash=False)

    def vendors(self) -> dict[str, Vendor]:
        """The registered vendors other than the share fast path's
        (:func:`~hami.core.vendor.fast_path_vendor`), by CommonWord (sorted)."""
        if not self.registry:
            return {}
        fast = fast_path_vendor(self.registry)
        skip = fast[0] if fast is not None else None
        return {word: self.registry[word] for word in sorted(self.registry) if word != skip}

    def fast_vendor(self) -> Vendor | None:
        """The registry's share fast-path backend (:func:`~hami.core.vendor.fast_path_vendor`),
        None when no registered vendor takes that path."""
        fast = fast_path_vendor(self.registry)
        return fast[1] if fast is not None else None
