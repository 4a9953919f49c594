"""``hami monitor``: typer-compatible entry point and the 5 s loop (HAMi-core 1.2)."""

from __future__ import annotations

import contextlib
import logging
import signal
import ssl
import threading
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Annotated, Any

import typer

from hami.api import names
from hami.deviceplugin.allocate import FEEDBACK_FILE, VGPU_NODE, PodView
from hami.durations import seconds
from hami.metricsauth import (
    METRICS_PATH,
    SECURE_HELP,
    MetricsGuard,
    SyncReviewer,
    file_context,
    self_signed_context,
)
from hami.monitor.claims import ClaimLister, attribute, claim_key
from hami.monitor.feedback import ContainerFeedback, observe
from hami.monitor.lister import PLUGIN_SUFFIX, ContainerLister
from hami.monitor.pods import DEFAULT_PRIORITY, container_grants, pod_finished
from hami.monitor.writeback import write_feedback, write_region
from hami.netlimits import LimitedHTTPServer, ServerLimits, raise_open_files_limit
from hami.tlsfiles import TlsReloader

log = logging.getLogger("hami.monitor")

MIG_APPLY_LOCK = Path("/tmp/hami/hami-mig-apply.lock")


def feedback_tick(lister: ContainerLister, pods: Sequence[PodView],
                  claims: ClaimLister | None = None,
                  high_priority_namespaces: AbstractSet[str] | None = None
                  ) -> list[ContainerFeedback]:
    """Read every container, apply :func:`observe`, write the decisions (HAMi-core 1.2).

    ``pods``: the node's pods. A container's GPUs and priority come from its pod
    (:func:`hami.monitor.pods.container_grants`), never from its region; a container of
    no listed pod shares no GPU (it is only ever unblocked). ``claims`` (DRA mode): each
    claim's region takes part as one more container, its GPUs and priority from its
    owner record and pod (:func:`hami.monitor.claims.attribute`). No container is blocked
    in more than 9 of any 12 consecutive ticks (``lister.blocks``,
    :class:`hami.monitor.feedback.BlockBudget`), whatever its neighbours write. Priority 0
    holds only for pods of ``high_priority_namespaces`` (None: every namespace;
    :func:`hami.monitor.pods.granted_priority`).

    The decisions go to two places: the changed region fields (HAMi's tools read them)
    and, every tick, the container's feedback file in its plugin-private directory
    (:mod:`hami.deviceplugin.feedbackfile`), the only source libvgpu trusts when it is
    mounted. A container with a feedback file but no readable region (removed,
    truncated or garbled by the container) still takes part, as inactive: its feedback
    file keeps following its neighbours. Returns the new values (for tests and logs)."""
    grants = {f"{p.uid}_{name}": g for p in pods
              for name, g in container_grants(p, high_priority_namespaces).items()}
    claim_lock = claims.lock if claims is not None else contextlib.nullcontext()
    with lister.lock, claim_lock:  # no file is closed while it is written
        regions: dict[str, tuple[Any, Any]] = dict(lister.read_all())
        targets: dict[str, Path | None] = {key: lister.plugin_dirs.get(key) for key in regions}
        inputs = []
        for key, (_, r) in regions.items():
            g = grants.get(key)
            inputs.append(ContainerFeedback(key, g.uuids if g else (),
                                            g.priority if g else DEFAULT_PRIORITY,
                                            r.recent_kernel, r.utilization_switch))
        for key, plugin_dir in lister.plugin_dirs.items():
            if key in regions or not (plugin_dir / FEEDBACK_FILE).exists():
                continue
            g = grants.get(key)  # no readable region: inactive, limited
            targets[key] = plugin_dir
            inputs.append(ContainerFeedback(key, g.uuids if g else (),
                                            g.priority if g else DEFAULT_PRIORITY, 0, 1))
        if claims is not None:
            for uid, (cf, r, owner) in claims.read_all().items():
                use = attribute(owner, pods, high_priority_namespaces)
                regions[claim_key(uid)] = (cf, r)
                targets[claim_key(uid)] = claims.root / f"{uid}{PLUGIN_SUFFIX}"
                inputs.append(ContainerFeedback(claim_key(uid), use.uuids if use else (),
                                                use.priority if use else DEFAULT_PRIORITY,
                                                r.recent_kernel, r.utilization_switch))
            for uid, owner in claims.owners.items():
                private = claims.root / f"{uid}{PLUGIN_SUFFIX}"
                if claim_key(uid) in regions or not (private / FEEDBACK_FILE).exists():
                    continue
                use = attribute(owner, pods, high_priority_namespaces)  # no readable region
                targets[claim_key(uid)] = private
                inputs.append(ContainerFeedback(claim_key(uid), use.uuids if use else (),
                                                use.priority if use else DEFAULT_PRIORITY, 0, 1))
        result = observe(inputs, lister.blocks)
        for old, new in zip(inputs, result, strict=True):
            if old.key in regions:
                write_region(regions[old.key][0], old, new)
            where = targets.get(old.key)
            if where is not None:
                write_feedback(lister.feedback_errors, old.key, where / FEEDBACK_FILE, new)
    return result


class PodCache:
    """Pods of this node, refreshed by the loop: ``on_node`` (spec.nodeName, for removal
    of stale directories) and ``labelled`` (``hami.io/vgpu-node`` label, for metrics)."""

    def __init__(self, kube: Any, node: str) -> None:
        self.kube = kube
        self.node = node
        self.on_node: list[PodView] | None = None
        self.labelled: list[PodView] = []

    def refresh(self) -> None:
        """One LIST of the node's pods; the metrics use those labelled for this node (a
        cache directory only exists for a pod bound here, so HAMi's second, label-selected
        informer would add nothing that has a cache file)."""
        try:
            self.on_node = self.kube.pods_on_node(self.node)
        except Exception as exc:  # noqa: BLE001 - keep the last good lists
            log.warning("pod list failed: %s", exc)
            return
        self.labelled = [p for p in self.on_node if p.labels.get(VGPU_NODE) == self.node]

    def live_uids(self) -> set[str] | None:
        """UIDs of the node's pods; None before the first successful list."""
        return None if self.on_node is None else {p.uid for p in self.on_node}

    def finished_uids(self) -> set[str]:
        """UIDs of the node's Succeeded or Failed pods (their files are not read)."""
        return {p.uid for p in self.on_node or () if pod_finished(p)}

    def labelled_pods(self) -> Sequence[PodView]:
        return self.labelled

    def node_pods(self) -> Sequence[PodView]:
        """Every pod of the node (DRA claims are attributed among them); [] before the
        first successful list."""
        return self.on_node or []


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


#: The monitor's ``/metrics`` listener: request head within 10 s, at most 64 open
#: connections from other hosts (Prometheus scrapes one at a time), and the default
#: write deadline (10 s) and minimum read rate (1 KiB/s over such a window: Prometheus
#: takes a whole answer within its scrape timeout, hundreds of times faster).
METRICS_LIMITS = ServerLimits(header_timeout_s=10.0, body_timeout_s=10.0,
                              max_remote_connections=64)


def serve_metrics(collector: Any, addr: str, port: int,
                  limits: ServerLimits = METRICS_LIMITS, *, guard: MetricsGuard | None = None,
                  reviewer: SyncReviewer | None = None,
                  ssl_context: ssl.SSLContext | None = None) -> Any:
    """Serve ``collector.render()`` on ``http://addr:port/metrics`` in a daemon thread
    (the same bytes prometheus-client's ``generate_latest`` would produce), with
    ``limits`` (:class:`~hami.netlimits.LimitedHTTPServer`: a request head deadline,
    socket timeouts, a write deadline and minimum read rate, a cap on remote connections).
    Secure mode (``--metrics-secure``):
    ``ssl_context`` makes it HTTPS, and ``guard`` with ``reviewer`` (the API server's
    TokenReview and SubjectAccessReview) answers each scrape 200, 401, 403 or 503
    (:mod:`hami.metricsauth`) before anything is rendered."""

    class Handler(LimitedHTTPServer.handler_base()):  # type: ignore[misc]
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            if guard is not None and reviewer is not None:
                verdict = guard.check(self.headers.get("Authorization"), reviewer,
                                      str(self.client_address[0]))
                if not verdict.allowed:
                    self._refuse(verdict.status, verdict.reason)
                    return
            try:
                body = collector.render()
            except Exception as exc:  # noqa: BLE001 - a scrape must not kill the server
                log.exception("scrape failed")
                self.send_error(500, str(exc))
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.write_body(body)

        def _refuse(self, status: int, reason: str) -> None:
            body = f"{reason}\n".encode()
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="hami-monitor"')
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = LimitedHTTPServer((addr, port), Handler, limits, name="monitor metrics",
                               ssl_context=ssl_context)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def secure_metrics(kube: Any, cert_file: str = "", key_file: str = ""
                   ) -> tuple[MetricsGuard, SyncReviewer, ssl.SSLContext, TlsReloader | None]:
    """The parts of secure mode: a :class:`~hami.metricsauth.MetricsGuard`, the reviews of
    ``kube`` (:class:`~hami.deviceplugin.kube.KubeApi`), the TLS context, and the
    :class:`~hami.tlsfiles.TlsReloader` that owns it when a PEM pair is given (the caller
    calls its ``maybe_reload`` so a rotated pair is served without a restart; None with
    no files: a self-signed context made now).

    Raises:
        OSError, ssl.SSLError: the pair cannot be loaded.
    """
    reviewer: SyncReviewer = (kube.review_token, kube.review_access)
    if cert_file:
        reloader = TlsReloader(cert_file, key_file)
        return MetricsGuard(), reviewer, reloader.context, reloader
    return MetricsGuard(), reviewer, self_signed_context()[0], None


def parse_bind(address: str) -> tuple[str, int]:
    """``:9394`` -> ``("0.0.0.0", 9394)``; ``127.0.0.1:9394`` -> as given."""
    host, _, port = address.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def run_monitor(*, node: str, hook_path: Path, kube: Any, stop: threading.Event,
                bind: str | None = ":9394", legacy: bool = False, interval_s: float = 5.0,
                grace_s: float = 300.0, host: Any = None, version: str = "0.1.0",
                mig_lock: Path = MIG_APPLY_LOCK, secure: tuple[str, str] | None = None,
                high_priority_namespaces: AbstractSet[str] | None = None) -> Any:
    """Run the loop until ``stop``; returns the HTTP server (None when ``bind`` is None).
    ``secure``: serve ``/metrics`` in secure mode (:func:`secure_metrics`) with this
    certificate and key file (``("", "")``: self-signed). ``high_priority_namespaces``:
    the namespaces whose pods' priority 0 is honoured (None: all; the command passes the
    operator's list, empty by default)."""
    from hami.monitor.metrics import MonitorCollector

    lister = ContainerLister(hook_path / "containers", grace_s=grace_s)
    claims = ClaimLister(hook_path / names.DRA_CLAIMS_DIR)
    pods = PodCache(kube, node)
    collector = MonitorCollector(node, lister, pods.labelled_pods, host, legacy, version,
                                 claims=claims, node_pods=pods.node_pods)
    server = None
    tls: TlsReloader | None = None
    if bind is not None:
        addr, port = parse_bind(bind)
        if secure is not None:
            guard, reviewer, context, tls = secure_metrics(kube, *secure)
            server = serve_metrics(collector, addr, port, guard=guard, reviewer=reviewer,
                                   ssl_context=context)
            log.info("metrics on https://%s:%d/metrics (TokenReview + SubjectAccessReview "
                     "for get %s)", addr, port, METRICS_PATH)
        else:
            server = serve_metrics(collector, addr, port)
            log.info("metrics on %s:%d/metrics", addr, port)
    try:
        while not stop.is_set():
            started = time.monotonic()
            if tls is not None:
                tls.maybe_reload()
            pods.refresh()
            lister.update(pods.live_uids(), pods.finished_uids())
            claims.update()
            if mig_lock.exists():
                log.info("MIG apply lock present: feedback paused")
            elif pods.on_node is not None:  # no grants known before the first pod list
                feedback_tick(lister, pods.on_node, claims, high_priority_namespaces)
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        if server is not None:
            server.shutdown()
        lister.close()
        claims.close()
    return server


def monitor(
    hook_path: Annotated[Path | None, typer.Option(
        envvar="HOOK_PATH", show_envvar=True,
        help="required: the directory holding the containers' vGPU caches "
             "(in its containers folder; the chart sets <global.gpuHookPath>/vgpu)")] = None,
    node_name: Annotated[str, typer.Option(
        envvar="NODE_NAME", show_envvar=True,
        help="required: this node (the chart sets it from spec.nodeName)")] = "",
    metrics_bind_address: Annotated[str, typer.Option(help="host:port of /metrics")] = ":9394",
    legacy_metrics: Annotated[bool, typer.Option(help="also emit HAMi's legacy names")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(
        envvar="KUBECONFIG", show_envvar=True,
        help="kubeconfig (default: in-cluster, else ~/.kube/config)")] = None,
    resync_interval: Annotated[float, typer.Option(
        envvar="HAMI_RESYNC_INTERVAL", show_envvar=True, parser=seconds, metavar="DURATION",
        help="how long a container's cache of a pod that is gone is kept (5m, or "
             "seconds)", show_default="5m")] = 300.0,
    metrics_secure: Annotated[bool, typer.Option(
        help=SECURE_HELP)] = False,
    metrics_cert_file: Annotated[str, typer.Option(
        help="with --metrics-secure: PEM certificate of /metrics, loaded again when it "
             "or the key changes (empty: self-signed)")] = "",
    metrics_key_file: Annotated[str, typer.Option(
        help="with --metrics-secure: PEM key of --metrics-cert-file")] = "",
    high_priority_namespaces: Annotated[str, typer.Option(
        help="namespaces whose pods' task priority 0 the feedback loop honours, a,b (the "
             "hami scheduler's list; elsewhere 0 counts as 1; default: none)")] = "",
) -> None:
    """vGPU monitor: per-container metrics and the priority feedback loop (HAMi-core 1.2).

    Needs HOOK_PATH and NODE_NAME (environment, or --hook-path and --node-name), NVML
    for the host GPU metrics (optional) and read access to the node's pods."""
    from hami import __version__
    from hami.deviceplugin.kube import KubeApi, make_client
    from hami.monitor.metrics import NoHostGpus, NvmlHostGpus

    raise_open_files_limit()
    if hook_path is None:
        typer.echo("error: HOOK_PATH (or --hook-path) must be set: the directory holding "
                   "containers/ with the vGPU caches, e.g. /usr/local/vgpu", err=True)
        raise typer.Exit(2)
    if not node_name:
        typer.echo("error: NODE_NAME (or --node-name) must be set to this node's name",
                   err=True)
        raise typer.Exit(2)
    if bool(metrics_cert_file) != bool(metrics_key_file) or (
            metrics_cert_file and not metrics_secure):
        typer.echo("error: --metrics-cert-file and --metrics-key-file go together, with "
                   "--metrics-secure", err=True)
        raise typer.Exit(2)
    if metrics_cert_file:
        try:
            file_context(metrics_cert_file, metrics_key_file)
        except (OSError, ssl.SSLError) as exc:
            typer.echo(f"error: --metrics-cert-file/--metrics-key-file: {exc}", err=True)
            raise typer.Exit(2) from None
    try:
        host: Any = NvmlHostGpus()
    except Exception as exc:  # noqa: BLE001 - no driver: container metrics only
        log.warning("NVML unavailable, host metrics off: %s", exc)
        host = NoHostGpus()
    kube = KubeApi(make_client(kubeconfig))
    MIG_APPLY_LOCK.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_monitor(node=node_name, hook_path=hook_path, kube=kube, stop=stop,
                bind=metrics_bind_address, legacy=legacy_metrics, grace_s=resync_interval,
                host=host, version=__version__,
                secure=(metrics_cert_file, metrics_key_file) if metrics_secure else None,
                high_priority_namespaces=frozenset(
                    n.strip() for n in high_priority_namespaces.split(",") if n.strip()))


def _duration_s(text: str) -> float:
    """Go duration subset: ``90s``, ``5m``, ``1h``, ``1h30m``, ``250ms``."""
    import re

    total = 0.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise typer.BadParameter(f"bad duration {text!r}")
    for num, unit in parts:
        total += float(num) * units[unit]
    return total
