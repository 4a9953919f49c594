"""Annotation keys, label keys, resource names and env var names of HAMi v2.10.

Source: and
HAMi-core 1.2. These strings are the wire contract with
HAMi components in mixed clusters; change none of them.
"""

from typing import Final

# Resource names (defaults; the device config may rename them, HAMi v2.10).
RESOURCE_COUNT: Final = "nvidia.com/gpu"
RESOURCE_MEMORY: Final = "nvidia.com/gpumem"
RESOURCE_MEMORY_PERCENTAGE: Final = "nvidia.com/gpumem-percentage"
RESOURCE_CORES: Final = "nvidia.com/gpucores"
RESOURCE_PRIORITY: Final = "nvidia.com/priority"

NVIDIA: Final = "NVIDIA"  # the vendor's CommonWord
MODE_HAMI_CORE: Final = "hami-core"
MODE_MIG: Final = "mig"
MODE_MPS: Final = "mps"

# Node annotations (HAMi v2.10).
NODE_REGISTER: Final = "hami.io/node-nvidia-register"
NODE_SCORE: Final = "hami.io/node-nvidia-score"
NODE_HANDSHAKE: Final = "hami.io/node-handshake"
NODE_LOCK: Final = "hami.io/mutex.lock"
#: Ours (not HAMi's): how the node's hami device plugin learns which pod an Allocate is
#: for. Absent or ``node-lock``: HAMi's protocol (the scheduler holds the node lock until
#: the plugin serves the pod); ``cdi``: per-container CDI devices filled in at
#: PreStartContainer from the kubelet's pod-resources API, so binds take no node lock.
NODE_ALLOCATE_MODE: Final = "hami.io/node-allocate-mode"
ALLOCATE_MODE_NODE_LOCK: Final = "node-lock"
ALLOCATE_MODE_CDI: Final = "cdi"
#: Ours (not HAMi's): the signing mode of the node's hami device plugin, ``"true"`` when
#: it serves unsigned allocations (``--trust-unsigned-allocations``), ``"false"`` when it
#: serves only allocations hami's scheduler signed (strict signing). ``hami top`` shows
#: it per node; absent (an older hami plugin, HAMi's) or any other value: unknown.
NODE_TRUST_UNSIGNED: Final = "hami.io/node-trust-unsigned-allocations"
NODE_DEVICE_CORDON: Final = "hami.io/device-cordon"

# Pod annotations / labels written by the scheduler (HAMi v2.10).
VGPU_NODE: Final = "hami.io/vgpu-node"
VGPU_TIME: Final = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS: Final = "hami.io/vgpu-mig-allocations"
BIND_PHASE: Final = "hami.io/bind-phase"
BIND_TIME: Final = "hami.io/bind-time"
#: hami only: the scheduler's HMAC over the allocation (HAMi components ignore it).
ALLOCATION_SIGNATURE: Final = "hami.io/vgpu-allocation-signature"

# Pod annotations set by users (HAMi v2.10).
USE_GPUTYPE: Final = "nvidia.com/use-gputype"
NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
USE_GPUUUID: Final = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID: Final = "nvidia.com/nouse-gpuuuid"
NUMA_BIND: Final = "nvidia.com/numa-bind"
VGPU_MODE: Final = "nvidia.com/vgpu-mode"
GPU_SCHEDULER_POLICY: Final = "hami.io/gpu-scheduler-policy"
NODE_SCHEDULER_POLICY: Final = "hami.io/node-scheduler-policy"
DEVICE_SCORING_WEIGHTS: Final = "hami.io/device-scoring-weights"
WEBHOOK_IGNORE_LABEL: Final = "hami.io/webhook"

# Env vars injected by the webhook (HAMi v2.10).
ENV_TASK_PRIORITY: Final = "CUDA_TASK_PRIORITY"
ENV_CORE_POLICY: Final = "GPU_CORE_UTILIZATION_POLICY"
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"

DEFAULT_SCHEDULER: Final = "default-scheduler"

# DRA mode (hami only): the kubelet plugin's per-claim host directories under
# <HOOK_PATH>/vgpu/claims/ and the owner record the monitor reads from the private one.
DRA_CLAIMS_DIR: Final = "claims"
DRA_OWNER_FILE: Final = "owner.json"
