"""HAMi's metric names (hami-scheduler-spec §8, hami-core-spec §C.4): the dashboard and the
services must keep exactly these so HAMi's dashboards keep working."""

from __future__ import annotations

#: Scheduler (:9395), labels per spec §8 (``zone`` is added to all but build_info).
SCHEDULER: dict[str, tuple[str, ...]] = {
    "hami_build_info": ("version", "revision", "build_date", "go_version", "compiler", "platform"),
    "hami_gpu_memory_limit_bytes": ("node", "device_uuid", "device_index", "device_type"),
    "hami_gpu_core_limit_ratio": ("node", "device_uuid", "device_index", "device_type"),
    "hami_gpu_memory_allocated_bytes": ("node", "device_uuid", "device_index", "device_cores",
                                        "device_type"),
    "hami_gpu_shared_count": ("node", "device_uuid", "device_index", "device_type"),
    "hami_gpu_core_allocated_ratio": ("node", "device_uuid", "device_index", "device_type"),
    "hami_node_gpu_overview": ("node", "device_uuid", "device_index", "device_cores",
                               "device_memory_limit", "device_type"),
    "hami_node_gpu_memory_allocated_ratio": ("node", "device_uuid", "device_index",
                                             "device_type"),
    "hami_node_gpu_mig_instance_info": ("node", "device_uuid", "device_index", "mig_uuid",
                                        "profile", "gpu_instance_id", "compute_instance_id",
                                        "placement_start", "placement_size"),
    "hami_resource_quota_used": ("namespace", "quota_name", "limit"),
    "hami_resource_quota_limit": ("namespace", "quota_name"),
    "hami_vgpu_memory_allocated_bytes": ("namespace", "node", "pod", "container_index",
                                         "device_uuid"),
    "hami_vgpu_core_allocated_ratio": ("namespace", "node", "pod", "container_index",
                                       "device_uuid"),
}

#: vGPU monitor (:9394), spec §C.4.
_CTR = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
MONITOR: dict[str, tuple[str, ...]] = {
    "hami_build_info": SCHEDULER["hami_build_info"],
    "hami_host_gpu_memory_used_bytes": ("node", "device_index", "device_uuid", "device_type"),
    "hami_host_gpu_utilization_ratio": ("node", "device_index", "device_uuid", "device_type"),
    "hami_host_gpu_memory_controller_utilization_ratio": ("device_index", "device_uuid",
                                                          "device_type"),
    "hami_vgpu_memory_used_bytes": _CTR,
    "hami_vgpu_memory_limit_bytes": _CTR,
    "hami_container_device_memory_bytes": _CTR,
    "hami_container_device_utilization_ratio": _CTR,
    "hami_vgpu_memory_context_bytes": _CTR,
    "hami_vgpu_memory_module_bytes": _CTR,
    "hami_vgpu_memory_buffer_bytes": _CTR,
    "hami_container_last_kernel_elapsed_seconds": _CTR,
    "hami_mig_device_info": (*_CTR, "mig_uuid", "profile", "gpu_instance_id",
                             "compute_instance_id"),
}

#: hami's additions (HAMi has none): latency histograms of the scheduler's /filter and
#: /bind, label ``outcome``; dashboards use their ``_bucket``/``_sum``/``_count`` series.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "hami_scheduler_filter_duration_seconds": ("outcome", "le"),
    "hami_scheduler_bind_duration_seconds": ("outcome", "le"),
    # counters: ``# TYPE`` names them with ``_total``, their ``_created`` gauges without
    "hami_scheduler_preemptions_total": ("outcome",),
    "hami_scheduler_preemptions": ("outcome",),
    "hami_scheduler_preemption_victims_total": (),
    "hami_scheduler_preemption_victims": (),
    "hami_scheduler_preemptor_bound_seconds": ("le",),
}

ALL = {**SCHEDULER, **MONITOR, **EXTENSIONS}
