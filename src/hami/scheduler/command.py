"""``hami scheduler``: the typer command (the lead registers it with
``app.command("scheduler")(scheduler)`` in :mod:`hami.cli`)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Annotated

import typer

from hami.core.config import ConfigError
from hami.dra.podclaims import TRUSTED_CREATORS
from hami.metricsauth import SECURE_HELP
from hami.scheduler.defaultopts import DefaultCores, DefaultGpu, DefaultMem


def _duration(text: str, flag: str) -> timedelta:
    from hami.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{flag}: {exc}") from None


def scheduler(
    http_bind: Annotated[str, typer.Option("--http_bind", "--http-bind",
                                           help="extender/webhook listen address")] = "127.0.0.1:8080",
    cert_file: Annotated[str, typer.Option("--cert-file", "--cert_file",
                                           help="TLS certificate (reloaded when it changes)")] = "",
    key_file: Annotated[str, typer.Option("--key-file", "--key_file", help="TLS key")] = "",
    scheduler_name: Annotated[str, typer.Option(help="schedulerName the webhook sets")] = "hami-scheduler",
    node_scheduler_policy: Annotated[str, typer.Option(help="binpack | spread | fragmentation-aware")] = "binpack",
    gpu_scheduler_policy: Annotated[str, typer.Option(help="spread | binpack | topology-aware | mutex | fragmentation-aware | numa, or a comma list (numa,binpack)")] = "spread",
    metrics_bind_address: Annotated[str, typer.Option(help="metrics listen address ('' or 0: off)")] = ":9395",
    node_label_selector: Annotated[str, typer.Option(help="only nodes with these labels, k=v,...")] = "",
    kubeconfig: Annotated[str, typer.Option(help="kubeconfig (default $KUBECONFIG, else in-cluster)")] = "",
    kube_timeout: Annotated[int, typer.Option(
        metavar="SECONDS",
        help="timeout of one API request, in seconds (0, HAMi's default, is taken as "
             "10)")] = 10,
    kube_max_inflight: Annotated[int, typer.Option(help="most API requests in flight at once")] = 32,
    node_lock_timeout: Annotated[str, typer.Option(help="node lock expiry")] = "5m",
    node_lock_retry_timeout: Annotated[str, typer.Option(help="how long bind waits for a locked node (0: no wait)")] = "28s",
    force_overwrite_default_scheduler: Annotated[bool, typer.Option(help="webhook replaces default-scheduler")] = True,
    gpu_hook_path: Annotated[str, typer.Option(
        help="the device plugin's HOOK_PATH (the chart's global.gpuHookPath): GPU containers "
             "may not mount a volume under this path's vgpu folder")] = "/usr/local",
    other_gpu_schedulers: Annotated[str, typer.Option(
        help="schedulerNames besides ours whose GPU pods the webhook admits unchecked, a,b "
             "(default: none; such pods are refused)")] = "",
    high_priority_namespaces: Annotated[str, typer.Option(
        help="namespaces whose GPU pods may ask for nvidia.com/priority 0, a,b (priority 0 "
             "holds back the priority-1 containers sharing a GPU); default: none, such "
             "pods are refused at admission and at /filter")] = "",
    leader_elect: Annotated[bool, typer.Option(help="run several replicas, one leader")] = False,
    leader_elect_resource_name: Annotated[str, typer.Option(help="Lease name")] = "hami-scheduler",
    leader_elect_resource_namespace: Annotated[str, typer.Option(help="Lease namespace")] = "kube-system",
    leader_elect_lease_duration: Annotated[str, typer.Option(help="lease duration")] = "15s",
    leader_elect_renew_deadline: Annotated[str, typer.Option(help="renew deadline")] = "10s",
    leader_elect_retry_period: Annotated[str, typer.Option(help="retry period")] = "2s",
    legacy_metrics: Annotated[bool, typer.Option(
        help="also serve HAMi's legacy metric names (GPUDeviceMemoryLimit, ...)")] = False,
    dra_mode: Annotated[bool, typer.Option(
        help="DRA mode: the webhook turns nvidia.com/gpu, gpumem and gpucores into "
             "ResourceClaimTemplates for kube-scheduler (docs/dra.md)")] = False,
    dra_template_idle: Annotated[str, typer.Option(
        help="DRA mode: delete a ResourceClaimTemplate hami made once no pod has needed "
             "it for this long")] = "2m",
    dra_trusted_claim_creators: Annotated[str, typer.Option(
        help="DRA mode: the users (comma list) whose ResourceClaim CREATEs for a pod are "
             "kube-controller-manager's resourceclaim controller; those claims book "
             "against the namespace GPU quota as their pod (init containers collapsed), "
             "others each in full")] = ",".join(TRUSTED_CREATORS),
    leader_elect_follow: Annotated[bool, typer.Option(
        help="with --leader-elect: do not elect, follow the named Lease of kube-scheduler "
             "and lead iff its holder is this host (HAMi's rule)")] = False,
    device_config_file: Annotated[str, typer.Option(help="HAMi device-config.yaml")] = "",
    enable_ascend: Annotated[bool, typer.Option(
        help="schedule Ascend NPUs: the chips of the device config's vnpus section")] = False,
    enable_iluvatar: Annotated[bool, typer.Option(
        help="schedule Iluvatar GPUs: the chips of the device config's iluvatars "
             "section")] = False,
    register_interval: Annotated[str, typer.Option(help="node registration/health period")] = "15s",
    events: Annotated[bool, typer.Option(help="post Kubernetes Events for filter/bind")] = True,
    async_annotation_patch: Annotated[bool, typer.Option(help="answer /filter before its annotation patch lands (/bind waits for it)")] = True,
    avoid_busy_nodes: Annotated[bool, typer.Option(
        help="place a pod among the nodes with the fewest binds in flight when one fits "
             "(a burst then does not queue behind one node's lock)")] = True,
    extender_allow_remote: Annotated[bool, typer.Option(
        help="also answer /filter, /bind and /status from non-loopback peers (kube-scheduler "
             "outside this pod); without it only 127.0.0.1/::1 may call them")] = False,
    extender_http_bind: Annotated[str, typer.Option(
        help="host:port of a plain-HTTP listener for kube-scheduler in the same pod (a "
             "loopback address such as 127.0.0.1:9444; serves what --http_bind serves, "
             "without TLS handshakes); empty: none")] = "",
    allocation_key_dir: Annotated[str, typer.Option(
        help="directory of the allocation-signing key shared with the device plugins "
             "(files 'current', 'previous'); empty: allocations are written unsigned, and "
             "device plugins serve them only with --trust-unsigned-allocations")] = "",
    http_header_timeout: Annotated[str, typer.Option(
        help="a request head must arrive within this time of the connection or of the "
             "previous response; also the idle keep-alive timeout")] = "10s",
    http_body_timeout: Annotated[str, typer.Option(
        help="a request body must arrive within this time of its head (0: no deadline)")] = "10s",
    http_write_timeout: Annotated[str, typer.Option(
        help="abort a connection whose peer takes none of the bytes waiting for it (answers "
             "it does not read) for this long (0: no deadline, and no minimum read rate)")] = "10s",
    http_min_read_bytes_per_second: Annotated[int, typer.Option(
        help="with a write timeout: also abort a connection whose peer takes fewer bytes "
             "per second than this over any write-timeout window in which an answer waited "
             "for it (a slow-read attack); 0: only the take-nothing rule")] = 1024,
    http_max_connections: Annotated[int, typer.Option(
        help="open connections from non-loopback peers per listener beyond which new ones "
             "are closed at once (0: no cap); loopback peers are never refused")] = 256,
    watch_idle_timeout: Annotated[str, typer.Option(
        help="restart an API watch that brought no event or bookmark for this long")] = "2m",
    metrics_secure: Annotated[bool, typer.Option(
        help=SECURE_HELP)] = False,
    metrics_cert_file: Annotated[str, typer.Option(
        help="with --metrics-secure: PEM certificate of /metrics, reloaded when it "
             "changes (empty: self-signed)")] = "",
    metrics_key_file: Annotated[str, typer.Option(
        help="with --metrics-secure: PEM key of --metrics-cert-file")] = "",
    preemption: Annotated[bool, typer.Option(
        help="evict the fewest lower-priority pods (Eviction API, PodDisruptionBudgets "
             "respected) whose GPU slices let a pod that fits nowhere fit "
             "(docs/priority-preemption.md); in DRA mode too, by the leader")] = True,
    default_mem: DefaultMem = None,
    default_cores: DefaultCores = None,
    default_gpu: DefaultGpu = None,
) -> None:
    """Run the scheduler extender + mutating webhook (HAMi's hami-scheduler)."""
    from hami.keyring import KeyRing, KeyRingError
    from hami.netlimits import raise_open_files_limit
    from hami.scheduler.server import serve
    from hami.scheduler.settings import SchedulerSettings, parse_label_selector

    if kube_timeout < 0:
        typer.echo(f"error: --kube-timeout must be 0 or more seconds, got {kube_timeout}",
                   err=True)
        raise typer.Exit(2)
    raise_open_files_limit()
    try:
        settings = SchedulerSettings(
            http_bind=http_bind, cert_file=cert_file, key_file=key_file,
            scheduler_name=scheduler_name, node_scheduler_policy=node_scheduler_policy,
            gpu_scheduler_policy=gpu_scheduler_policy, metrics_bind_address=metrics_bind_address,
            node_label_selector=parse_label_selector(node_label_selector), kubeconfig=kubeconfig,
            kube_timeout=timedelta(seconds=kube_timeout or 10),
            kube_max_inflight=max(1, kube_max_inflight),
            node_lock_timeout=_duration(node_lock_timeout, "--node-lock-timeout"),
            node_lock_retry_timeout=_duration(node_lock_retry_timeout, "--node-lock-retry-timeout"),
            force_overwrite_default_scheduler=force_overwrite_default_scheduler,
            gpu_hook_path=gpu_hook_path,
            other_gpu_schedulers=tuple(n.strip() for n in other_gpu_schedulers.split(",")
                                       if n.strip()),
            high_priority_namespaces=tuple(n.strip() for n in high_priority_namespaces.split(",")
                                           if n.strip()),
            leader_elect=leader_elect, leader_elect_resource_name=leader_elect_resource_name,
            leader_elect_resource_namespace=leader_elect_resource_namespace,
            leader_elect_lease_duration=_duration(leader_elect_lease_duration, "--leader-elect-lease-duration"),
            leader_elect_renew_deadline=_duration(leader_elect_renew_deadline, "--leader-elect-renew-deadline"),
            leader_elect_retry_period=_duration(leader_elect_retry_period, "--leader-elect-retry-period"),
            leader_elect_follow=leader_elect_follow, dra_mode=dra_mode,
            dra_template_idle=_duration(dra_template_idle, "--dra-template-idle"),
            dra_trusted_claim_creators=tuple(
                u.strip() for u in dra_trusted_claim_creators.split(",") if u.strip()),
            legacy_metrics=legacy_metrics, metrics_secure=metrics_secure,
            metrics_cert_file=metrics_cert_file, metrics_key_file=metrics_key_file,
            device_config_file=device_config_file,
            enable_ascend=enable_ascend, enable_iluvatar=enable_iluvatar,
            register_interval=_duration(register_interval, "--register-interval"),
            events=events, async_annotation_patch=async_annotation_patch,
            avoid_busy_nodes=avoid_busy_nodes, preemption=preemption,
            extender_allow_remote=extender_allow_remote,
            extender_http_bind=extender_http_bind,
            allocation_key_dir=allocation_key_dir,
            http_header_timeout=_duration(http_header_timeout, "--http-header-timeout"),
            http_body_timeout=_duration(http_body_timeout, "--http-body-timeout"),
            http_write_timeout=_duration(http_write_timeout, "--http-write-timeout"),
            http_min_read_bytes_per_second=http_min_read_bytes_per_second,
            http_max_connections=http_max_connections,
            watch_idle_timeout=_duration(watch_idle_timeout, "--watch-idle-timeout"),
            default_memory_mib=default_mem, default_cores_percent=default_cores,
            default_gpu_num=default_gpu,
            debug=logging.getLogger("hami").isEnabledFor(logging.DEBUG))
        settings.validate()
        settings.scheduler_config()
        if settings.allocation_key_dir:
            KeyRing(settings.allocation_key_dir)
        else:
            logging.getLogger("hami.scheduler").warning(
                "no --allocation-key-dir: allocations are written unsigned, and hami's device "
                "plugins serve them only with --trust-unsigned-allocations")
    except (ConfigError, KeyRingError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from hami.scheduler.server import StartupRefused

    try:
        asyncio.run(serve(settings))
    except StartupRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    """``python -m hami.scheduler.command``: exactly ``hami scheduler`` (the same logging
    set-up and the same one-line errors; the quickstart and the e2e harness start it so)."""
    import sys

    from hami.cli import app

    app(["scheduler", *sys.argv[1:]], prog_name="hami")


if __name__ == "__main__":
    main()
