"""One settings object for ``hami scheduler`` (flags with HAMi's names, HAMi v2.10)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from hami.core.config import GPU_POLICY_WORDS, NODE_POLICIES, ConfigError, SchedulerConfig
from hami.dra.podclaims import TRUSTED_CREATORS
from hami.netlimits import ServerLimits, is_loopback


def default_identity() -> str:
    """Leader-election identity: hostname (as HAMi compares) plus a unique suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


def parse_bind(address: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port`` or ``:port`` (Go style) -> (host, port).

    Raises:
        ConfigError: no port, or a port that is not a number in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"bad bind address {address!r}: expected host:port or :port")
    return (host.strip("[]") or default_host), int(port)


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Everything the scheduler process is configured with; built once, passed in."""

    http_bind: str = "127.0.0.1:8080"
    cert_file: str = ""
    key_file: str = ""
    scheduler_name: str = "hami-scheduler"
    node_scheduler_policy: str = "binpack"
    gpu_scheduler_policy: str = "spread"
    metrics_bind_address: str = ":9395"
    node_label_selector: dict[str, str] = field(default_factory=dict)
    kubeconfig: str = ""
    kube_timeout: timedelta = timedelta(seconds=10)
    #: Most API requests in flight at once (watches not counted).
    kube_max_inflight: int = 32
    node_lock_timeout: timedelta = timedelta(minutes=5)
    node_lock_retry_timeout: timedelta = timedelta(seconds=28)
    force_overwrite_default_scheduler: bool = True
    #: The device plugin's $HOOK_PATH: GPU containers may not mount volumes on <it>/vgpu.
    gpu_hook_path: str = "/usr/local"
    #: schedulerNames besides ours whose GPU pods the webhook admits (unchecked, as HAMi).
    other_gpu_schedulers: tuple[str, ...] = ()
    #: Namespaces whose GPU pods may ask for task priority 0 (``nvidia.com/priority: 0``);
    #: the webhook and /filter refuse it elsewhere.
    high_priority_namespaces: tuple[str, ...] = ()
    leader_elect: bool = False
    leader_elect_resource_name: str = "hami-scheduler"
    leader_elect_resource_namespace: str = "kube-system"
    leader_elect_lease_duration: timedelta = timedelta(seconds=15)
    leader_elect_renew_deadline: timedelta = timedelta(seconds=10)
    leader_elect_retry_period: timedelta = timedelta(seconds=2)
    #: Do not elect: lead iff the Lease (kube-scheduler's) is held by this host (HAMi v2.10).
    leader_elect_follow: bool = False
    #: DRA mode: ``/webhook`` turns GPU requests into ResourceClaimTemplates (hami.dra).
    dra_mode: bool = False
    #: DRA mode: a ResourceClaimTemplate hami made is deleted once no pod has needed it
    #: for this long (hami.dra.templategc).
    dra_template_idle: timedelta = timedelta(minutes=2)
    #: DRA mode: the users whose ResourceClaim CREATEs for a pod are the resourceclaim
    #: controller's (hami.dra.podclaims): those claims book as their pod.
    dra_trusted_claim_creators: tuple[str, ...] = TRUSTED_CREATORS
    device_config_file: str = ""
    #: ``--enable-ascend`` / ``--enable-iluvatar`` (HAMi v2.10): register those vendors.
    enable_ascend: bool = False
    enable_iluvatar: bool = False
    register_interval: timedelta = timedelta(seconds=15)
    max_body_bytes: int = 1 << 20
    #: A request head must be complete this long after the connection (or its TLS
    #: handshake) opened or after the previous response; idle keep-alive connections
    #: close after it too.
    http_header_timeout: timedelta = timedelta(seconds=10)
    #: A request body must be complete this long after its head (0: no deadline).
    http_body_timeout: timedelta = timedelta(seconds=10)
    #: A connection whose peer takes none of the bytes waiting for it (answers it does
    #: not read) for this long is aborted (0: no deadline).
    http_write_timeout: timedelta = timedelta(seconds=10)
    #: With a write deadline, a peer must also take at least this many bytes per second
    #: over any write-timeout window in which bytes waited for it (a slow-read attack
    #: takes a few bytes now and then); 0: only the "took nothing" rule.
    http_min_read_bytes_per_second: int = 1024
    #: Open connections from non-loopback peers per listener beyond which new ones are
    #: closed at once (0: no cap). Loopback peers (kube-scheduler) are never refused.
    http_max_connections: int = 256
    #: A watch that delivers no event and no bookmark for this long is restarted from its
    #: last resourceVersion (the API server sends a bookmark about once a minute).
    watch_idle_timeout: timedelta = timedelta(seconds=120)
    #: Serve /filter, /bind and /status to non-loopback peers too (kube-scheduler in
    #: another pod). Off: anyone who reaches the Service could forge placements.
    extender_allow_remote: bool = False
    #: ``host:port`` of a second, plain-HTTP listener for kube-scheduler in the same pod
    #: (loopback addresses only; "" = none). kube-scheduler's extender client keeps at
    #: most two idle connections and no TLS sessions, so every concurrent bind over HTTPS
    #: costs a full TLS handshake on both sides; over loopback the handshake protects
    #: nothing the pod's network namespace does not.
    extender_http_bind: str = ""
    #: Directory with the allocation-signing key (``current``, ``previous``); "" = the
    #: scheduler writes unsigned allocations (device plugins then need
    #: ``--trust-unsigned-allocations``).
    allocation_key_dir: str = ""
    events: bool = True
    #: Answer /filter once the decision is charged, with its annotation patch in flight;
    #: /bind waits for that patch. False: /filter answers after the patch (HAMi's order).
    async_annotation_patch: bool = True
    #: /filter places a pod among the nodes with the fewest binds in flight when one fits,
    #: so a burst does not queue behind one node's lock (binpack would stack it there).
    avoid_busy_nodes: bool = True
    identity: str = field(default_factory=default_identity)
    pod_name: str = field(default_factory=lambda: os.environ.get("POD_NAME", ""))
    pod_namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE", ""))
    debug: bool = False
    #: HAMi's ``--default-mem``, ``--default-cores``, ``--default-gpu``: replace the device
    #: config's ``defaultMemory`` (MiB), ``defaultCores`` (percent), ``defaultGPUNum``.
    default_memory_mib: int | None = None
    default_cores_percent: int | None = None
    default_gpu_num: int | None = None
    #: Also serve HAMi's pre-2.5 metric names (HAMi v2.10).
    legacy_metrics: bool = False
    #: Secure metrics (hami.metricsauth): /metrics over HTTPS, answered only to scrapers
    #: the API server authenticates (TokenReview) and authorizes for get /metrics
    #: (SubjectAccessReview); the certificate pair ("": self-signed at start-up).
    metrics_secure: bool = False
    metrics_cert_file: str = ""
    metrics_key_file: str = ""
    #: Preempt lower-priority pods for a GPU pod that fits nowhere (ours; HAMi has none):
    #: evictions through the Eviction API, see hami.scheduler.preemptflow.
    preemption: bool = True

    def validate(self) -> None:
        """Raises ConfigError on a bad value (checked once at start-up)."""
        parse_bind(self.http_bind)
        if self.metrics_bind_address not in ("", "0"):
            parse_bind(self.metrics_bind_address)
        if self.extender_http_bind:
            host, _ = parse_bind(self.extender_http_bind, default_host="")
            if not is_loopback(host):
                raise ConfigError(f"--extender-http-bind must be a loopback address such as "
                                  f"127.0.0.1:9444 (plain HTTP), got {self.extender_http_bind!r}")
        if self.node_scheduler_policy not in NODE_POLICIES:
            raise ConfigError(f"--node-scheduler-policy must be one of {', '.join(NODE_POLICIES)}")
        for part in self.gpu_scheduler_policy.split(","):
            if part.strip() not in GPU_POLICY_WORDS:
                raise ConfigError(f"--gpu-scheduler-policy must be among "
                                  f"{', '.join(GPU_POLICY_WORDS)} or a comma list of them")
        if not self.gpu_hook_path.startswith("/"):
            raise ConfigError(f"--gpu-hook-path must be absolute, got {self.gpu_hook_path!r}")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("--cert-file and --key-file go together")
        if bool(self.metrics_cert_file) != bool(self.metrics_key_file) or (
                self.metrics_cert_file and not self.metrics_secure):
            raise ConfigError("--metrics-cert-file and --metrics-key-file go together, "
                              "with --metrics-secure")
        if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration:
            raise ConfigError("--leader-elect-renew-deadline must be below the lease duration")
        if self.http_header_timeout <= timedelta(0):
            raise ConfigError("--http-header-timeout must be positive")
        if (self.http_body_timeout < timedelta(0) or self.http_write_timeout < timedelta(0)
                or self.http_max_connections < 0 or self.http_min_read_bytes_per_second < 0):
            raise ConfigError("--http-body-timeout, --http-write-timeout, "
                              "--http-min-read-bytes-per-second and --http-max-connections "
                              "must not be negative")
        if self.watch_idle_timeout <= timedelta(0):
            raise ConfigError("--watch-idle-timeout must be positive")

    def server_limits(self) -> ServerLimits:
        """The deadlines and connection cap of both listeners."""
        return ServerLimits(header_timeout_s=self.http_header_timeout.total_seconds(),
                            body_timeout_s=self.http_body_timeout.total_seconds(),
                            write_timeout_s=self.http_write_timeout.total_seconds(),
                            min_read_bytes_per_s=float(self.http_min_read_bytes_per_second),
                            max_remote_connections=self.http_max_connections)

    def scheduler_config(self) -> SchedulerConfig:
        """The core's config (device config file, policies, webhook scheduler name)."""
        from dataclasses import replace

        from hami.settings import scheduler_config

        path = Path(self.device_config_file) if self.device_config_file else None
        config = scheduler_config(path, self.node_scheduler_policy, self.gpu_scheduler_policy,
                                  self.scheduler_name, enable_ascend=self.enable_ascend,
                                  enable_iluvatar=self.enable_iluvatar,
                                  default_memory_mib=self.default_memory_mib,
                                  default_cores_percent=self.default_cores_percent,
                                  default_gpu_num=self.default_gpu_num)
        return replace(config,
                       force_overwrite_default_scheduler=self.force_overwrite_default_scheduler,
                       hook_path=self.gpu_hook_path,
                       other_gpu_schedulers=self.other_gpu_schedulers,
                       high_priority_namespaces=self.high_priority_namespaces)


def parse_label_selector(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` -> dict (``--node-label-selector``).

    Raises:
        ConfigError: an entry without ``=``.
    """
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --node-label-selector entry {part!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out
