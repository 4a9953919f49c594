"""A real Kubernetes control plane on 127.0.0.1 for end-to-end tests and local trials.

It runs etcd, kube-apiserver and kube-scheduler as child processes, built from the
Kubernetes release pinned in ``hack/k8s/go.mod`` (``hack/k8s/build.sh`` puts them in
``${HAMI_CACHE_DIR:-~/.cache/hami}/k8s-<version>/bin``). No kubelet and no
kube-controller-manager run: nodes are plain API objects created by :func:`create_gpu_node`.
The apiserver's TaintNodesByCondition admission gives every new node the
``node.kubernetes.io/not-ready:NoSchedule`` taint; :func:`set_node_status` removes it when
it marks the node Ready, as the node-lifecycle controller would. Since that controller
does not run, nothing flips the Ready condition back or taints the node later.

By hand::

    hack/k8s/build.sh
    python -m hami.testing.controlplane up      # prints the kubeconfig path; Ctrl-C stops

From Python::

    with ControlPlane() as cp:
        cp.start()                    # etcd, kube-apiserver, a default-scheduler
        cp.start_scheduler(scheduler_name="hami-scheduler",
                           extender=ExtenderConfig("https://127.0.0.1:8443"))
        client = cp.client()          # a lightkube Client with cluster-admin rights
        create_gpu_node(client, "gpu-0", gpus=40, annotations={...})
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import ssl
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hami.testing.clusterconfig import (
    AUDIT_POLICY,
    KUBERNETES_SERVICE_IP,
    apiserver_argv,
    etcd_argv,
    read_audit_events,
    write_audit_policy,
    write_kubeconfig,
    write_pki,
)
from hami.testing.kubeclients import admin_async_client, admin_client
from hami.testing.kubeobjects import (
    bind_pod,
    create_gpu_node,
    ensure_namespace,
    node_is_ready,
    node_ready_condition,
    pod_binding,
    set_node_status,
    set_pod_phase,
)
from hami.testing.kubescheduler import start_kube_scheduler
from hami.testing.pki import CertificateAuthority, KeyPair
from hami.testing.processes import (
    BINARIES,
    DEFAULT_TIMEOUT_S,
    HOST,
    KUBERNETES_VERSION,
    BinariesMissing,
    Component,
    ControlPlaneError,
    SchedulerHandle,
    default_bin_dir,
    die_with_parent,
    find_binaries,
    free_port,
    spawn,
    wait_until,
)
from hami.testing.scheduler_config import (
    CLIENT_BURST,
    CLIENT_QPS,
    ExtenderConfig,
)

_PORT_ATTEMPTS = 3

_T = TypeVar("_T")


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler) on 127.0.0.1, with fresh certificates.

    Args:
        bin_dir: where the binaries are (default :func:`default_bin_dir`).
        workdir: directory for certificates, configs, etcd data and logs; a new temp dir
            by default. It is removed by :meth:`stop` only if it was created here and
            ``keep_workdir`` is false.
        keep_workdir: keep the directory (and its logs) after :meth:`stop`.
        verbosity: klog ``-v`` level of the Kubernetes components.
        apiserver_args: further kube-apiserver flags (e.g.
            ``--enable-aggregator-routing=true``: webhooks are called on a Service's
            endpoint addresses instead of its ClusterIP, which needs no kube-proxy).

    Raises:
        BinariesMissing: from the constructor, when the binaries are not built.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        *,
        keep_workdir: bool = False,
        verbosity: int = 1,
        apiserver_args: Sequence[str] = (),
    ) -> None:
        self.binaries = find_binaries(bin_dir)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hami-k8s-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep_workdir = keep_workdir
        self.verbosity = verbosity
        self.apiserver_args = list(apiserver_args)
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.audit_log = self.log_dir / "audit.log"
        self.apiserver_port = 0
        self.etcd_port = 0
        self.startup_seconds: dict[str, float] = {}
        self._components: list[Component] = []
        self._admin: KeyPair | None = None
        self._ca: CertificateAuthority | None = None
        self._ca_pem = b""
        self._ssl_context: ssl.SSLContext | None = None
        self._schedulers: list[SchedulerHandle] = []

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        return f"https://{HOST}:{self.apiserver_port}"

    def start(
        self, *, default_scheduler: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> ControlPlane:
        """Start etcd and kube-apiserver, wait for ``/readyz``, and prepare the cluster.

        Prepared means: the ``default`` namespace has its ``default`` ServiceAccount (no
        kube-controller-manager runs to make it, and pod admission needs it). With
        ``default_scheduler`` a kube-scheduler with the ``default-scheduler`` profile and
        no extender is started too. Startup seconds per component land in
        :attr:`startup_seconds`.

        Raises:
            ControlPlaneError: a component died or was not healthy within ``timeout_s``;
                everything started so far is stopped again, and the workdir (with the
                logs) is kept even when it is a temp dir.
        """
        t0 = time.monotonic()
        try:
            self._write_pki()
            self._retry_on_port_clash(lambda: self._start_etcd(timeout_s))
            self._retry_on_port_clash(lambda: self._start_apiserver(timeout_s))
            client = self.client()
            try:
                ensure_namespace(client, "default")
            finally:
                client.close()
            if default_scheduler:
                self.start_scheduler(timeout_s=timeout_s)
        except BaseException:
            self.keep_workdir = True  # the logs explain the failure
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop every process (schedulers first, etcd last) and remove a temp workdir."""
        for comp in reversed(self._components):
            comp.stop()
        self._components.clear()
        self._schedulers.clear()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise :class:`ControlPlaneError` if any component has exited."""
        for comp in self._components:
            comp.check_alive()

    # -- clients -----------------------------------------------------------------------

    def client(self, namespace: str = "default") -> Any:
        """A ``lightkube.Client`` authenticated as cluster admin (system:masters); its
        watches ask for uncompressed bodies (:mod:`hami.testing.kubeclients`)."""
        return admin_client(self.kubeconfig, namespace)

    def async_client(self, namespace: str = "default") -> Any:
        """A ``lightkube.AsyncClient`` authenticated as cluster admin, like :meth:`client`."""
        return admin_async_client(self.kubeconfig, namespace)

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS context for the apiserver: trusts our CA, presents the admin cert.

        Made once per control plane (after :meth:`start` wrote the certificates).
        """
        if self._ssl_context is None:
            ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
            ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
            self._ssl_context = ctx
        return self._ssl_context

    def audit_events(self, username: str | None = None, *,
                     since: _dt.datetime | None = None) -> list[dict[str, Any]]:
        """The apiserver's audit events so far (see :data:`AUDIT_POLICY`: requests made by
        service accounts, at ``Metadata`` level), oldest first, optionally only those of
        ``username`` (e.g. ``system:serviceaccount:ns:name``) and those received at or
        after ``since`` (an aware datetime).

        Each event is audit.k8s.io/v1 ``Event`` JSON: ``verb`` (the RBAC verb: get, list,
        watch, create, update, patch, delete), ``objectRef`` (``apiGroup``, ``resource``,
        ``subresource``, ``namespace``, ``name``), ``responseStatus.code``, ``stage``.
        """
        return read_audit_events(self.audit_log, username, since=since)

    # -- kube-scheduler ----------------------------------------------------------------

    def start_scheduler(
        self,
        *,
        scheduler_name: str = "default-scheduler",
        extender: ExtenderConfig | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client_qps: float | None = CLIENT_QPS,
        client_burst: int | None = CLIENT_BURST,
    ) -> SchedulerHandle:
        """Start one more kube-scheduler with a single profile and wait for ``/readyz``.

        Several may run at once (leader election is off; each serves only pods whose
        ``spec.schedulerName`` is its profile's), as in a HAMi deployment where a second
        kube-scheduler with profile ``hami-scheduler`` runs next to the default one.

        Args:
            scheduler_name: the profile's ``schedulerName``.
            extender: register this extender (see :class:`ExtenderConfig`), or ``None``.
            timeout_s: seconds to wait for readiness.
            client_qps, client_burst: kube-scheduler's API client rate limit
                (``clientConnection``; the chart's 100/200 by default, ``None`` keeps
                kube-scheduler's own 50/100).

        Raises:
            ValueError: a running scheduler of this control plane has that profile name
                (two would race for the same pods).
            ControlPlaneError: it exited or was not ready within ``timeout_s``.
        """
        running = [h for h in self._schedulers if h.component.process.poll() is None]
        if any(h.scheduler_name == scheduler_name for h in running):
            raise ValueError(f"a kube-scheduler with profile {scheduler_name!r} already runs")
        handle = start_kube_scheduler(self, scheduler_name, extender, timeout_s=timeout_s,
                                      client_qps=client_qps, client_burst=client_burst)
        self._schedulers.append(handle)
        return handle

    # -- internals ---------------------------------------------------------------------

    def _retry_on_port_clash(self, start: Callable[[], _T]) -> _T:
        """Run ``start``; if its process lost a port race (the port picked by
        :func:`free_port` was taken before it bound it), stop what it spawned and retry."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            mark = len(self._components)
            try:
                return start()
            except ControlPlaneError as err:
                if "address already in use" not in str(err) or attempt == _PORT_ATTEMPTS:
                    raise
                for comp in self._components[mark:]:
                    comp.stop()
                del self._components[mark:]
        raise AssertionError("unreachable")

    def _spawn(self, name: str, argv: Sequence[str]) -> Component:
        comp = spawn(name, argv, self.log_dir, self.workdir)
        self._components.append(comp)
        return comp

    def _write_pki(self) -> None:
        pki = write_pki(self.pki_dir)
        self._admin = pki.admin
        self._ca = pki.ca
        self._ca_pem = pki.ca.cert_pem

    def _write_kubeconfig(self) -> None:
        assert self._admin is not None, "_write_pki() first"
        write_kubeconfig(self.kubeconfig, self.server, self._ca_pem, "hami-e2e-admin",
                         self._admin)

    def client_kubeconfig(self, path: Path, user: str, groups: Sequence[str] = ()) -> Path:
        """Write a kubeconfig at ``path`` for a client certificate with CN ``user`` and
        O ``groups`` (Kubernetes' x509 user and groups), signed by this cluster's CA;
        e.g. ``system:node:<name>`` in ``system:nodes`` for a kubelet. Returns ``path``.

        Raises:
            ControlPlaneError: the control plane has not been started.
        """
        if self._ca is None or not self.apiserver_port:
            raise ControlPlaneError("start() the control plane first")
        pair = self._ca.issue(user, groups=list(groups), client=True)
        write_kubeconfig(path, self.server, self._ca_pem, user, pair)
        return path

    @property
    def ca_file(self) -> Path:
        """The cluster CA certificate (PEM) that signs every client and serving cert."""
        return self.pki_dir / "ca.crt"

    def _start_etcd(self, timeout_s: float) -> None:
        self.etcd_port = free_port()
        peer_port = free_port()
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)  # fresh after a port clash
        client_url = f"http://{HOST}:{self.etcd_port}"
        comp = self._spawn("etcd", etcd_argv(self.binaries["etcd"], self.workdir / "etcd",
                                             self.etcd_port, peer_port))

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
                    return bool(json.load(resp).get("health") == "true")
            except (OSError, ValueError):
                return False

        self.startup_seconds["etcd"] = comp.wait_healthy(healthy, "/health", timeout_s)

    def _start_apiserver(self, timeout_s: float) -> None:
        self.apiserver_port = free_port()
        audit_policy = write_audit_policy(self.workdir / "audit-policy.yaml")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        comp = self._spawn("kube-apiserver", apiserver_argv(
            self.binaries["kube-apiserver"], etcd_port=self.etcd_port,
            port=self.apiserver_port, pki=self.pki_dir, audit_policy=audit_policy,
            audit_log=self.audit_log, verbosity=self.verbosity, extra=self.apiserver_args))
        self._write_kubeconfig()
        self.startup_seconds["kube-apiserver"] = comp.wait_healthy(
            lambda: self._https_ok(f"{self.server}/readyz"), "/readyz", timeout_s
        )

    def _https_ok(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=self.ssl_context()) as resp:
                return bool(resp.status == 200)
        except (OSError, ValueError):
            return False


__all__ = ["AUDIT_POLICY", "BINARIES", "DEFAULT_TIMEOUT_S", "HOST", "KUBERNETES_SERVICE_IP",
           "KUBERNETES_VERSION", "BinariesMissing", "Component", "ControlPlane",
           "ControlPlaneError", "SchedulerHandle", "bind_pod", "create_gpu_node",
           "default_bin_dir", "die_with_parent", "ensure_namespace", "find_binaries",
           "free_port", "node_is_ready", "node_ready_condition", "pod_binding",
           "set_node_status", "set_pod_phase", "wait_until"]


if __name__ == "__main__":
    # ``python -m hami.testing.controlplane up``: the command lives in controlplane_cli,
    # which imports this module (as hami.testing.controlplane, not as __main__).
    from hami.testing.controlplane_cli import main

    sys.exit(main())
