"""kube-scheduler for the test control plane: one process per scheduler profile.

:meth:`hami.testing.controlplane.ControlPlane.start_scheduler` checks that the profile is
not running yet and keeps the handle; :func:`start_kube_scheduler` writes the
KubeSchedulerConfiguration (:func:`hami.testing.scheduler_config.render_scheduler_config`),
spawns the binary on a free port and waits for its ``/readyz``, retrying on a lost port
race like every component of the control plane. kube-scheduler v1.29.6 serves no
``/readyz`` (404; v1.31.14 does): there the wait is for ``/healthz`` (:func:`scheduler_ready`).
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import yaml

from hami.testing.clusterconfig import scheduler_argv
from hami.testing.processes import DEFAULT_TIMEOUT_S, HOST, SchedulerHandle, free_port
from hami.testing.scheduler_config import (
    CLIENT_BURST,
    CLIENT_QPS,
    ExtenderConfig,
    render_scheduler_config,
)

if TYPE_CHECKING:
    from hami.testing.controlplane import ControlPlane


def scheduler_ready(base_url: str, ctx: ssl.SSLContext) -> bool:
    """Whether the kube-scheduler at ``base_url`` (``https://127.0.0.1:<port>``) is ready:
    ``/readyz`` answers 200, or, on a release without ``/readyz`` (it answers 404, as
    v1.29.6 does), ``/healthz`` answers 200. Any other answer or error: False."""
    for path in ("/readyz", "/healthz"):
        try:
            with urllib.request.urlopen(base_url + path, timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as err:
            if err.code != 404:
                return False
        except (OSError, ValueError):
            return False
    return False


def start_kube_scheduler(cp: ControlPlane, scheduler_name: str,
                         extender: ExtenderConfig | None = None, *,
                         timeout_s: float = DEFAULT_TIMEOUT_S,
                         client_qps: float | None = CLIENT_QPS,
                         client_burst: int | None = CLIENT_BURST) -> SchedulerHandle:
    """Start a kube-scheduler with the single profile ``scheduler_name`` (and
    ``extender``) on ``cp``; it stops with the control plane. Arguments as
    :meth:`~hami.testing.controlplane.ControlPlane.start_scheduler`'s.

    Raises:
        ControlPlaneError: it exited or was not ready within ``timeout_s``.
    """

    def start() -> SchedulerHandle:
        port = free_port()
        tag = f"kube-scheduler-{scheduler_name}-{port}"
        config_path = cp.workdir / f"{tag}.yaml"
        config = render_scheduler_config(
            kubeconfig=str(cp.kubeconfig), scheduler_name=scheduler_name, extender=extender,
            client_qps=client_qps, client_burst=client_burst,
        )
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        comp = cp._spawn(tag, scheduler_argv(  # noqa: SLF001 - same package's process table
            cp.binaries["kube-scheduler"], config=config_path, port=port,
            pki=cp.pki_dir, kubeconfig=cp.kubeconfig, verbosity=cp.verbosity))
        ctx = cp.ssl_context()
        cp.startup_seconds[tag] = comp.wait_healthy(
            lambda: scheduler_ready(f"https://{HOST}:{port}", ctx), "/readyz", timeout_s)
        return SchedulerHandle(scheduler_name, config_path, port, comp)

    return cp._retry_on_port_clash(start)  # noqa: SLF001
