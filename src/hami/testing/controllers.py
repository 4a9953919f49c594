"""kube-controller-manager for the test control plane, with chosen controllers only.

DRA mode needs the ``resourceclaim-controller``: it makes each pod's ResourceClaim from
its ResourceClaimTemplate (owned by the pod), records it in the pod's status, removes
deleted pods from ``reservedFor`` and deallocates claims nobody uses. It also needs the
``garbage-collector-controller``: a claim the scheduler allocated for a pod that was
deleted meanwhile keeps its allocation (no consumer left to remove) until the collector
deletes it with its owner; without it that card capacity is lost for good. The binary is built
by ``hack/k8s/build.sh`` next to the others (``kube-controller-manager``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.testing.controlplane import (
    DEFAULT_TIMEOUT_S,
    HOST,
    BinariesMissing,
    Component,
    ControlPlane,
    default_bin_dir,
    free_port,
)

BINARY = "kube-controller-manager"
#: The controllers DRA mode relies on (module docstring).
DRA_CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller")


@dataclass(frozen=True, slots=True)
class ControllerManager:
    """A running kube-controller-manager: its ``/healthz`` ``port`` and process."""

    controllers: tuple[str, ...]
    port: int
    component: Component


def find_controller_manager(bin_dir: Path | None = None) -> Path:
    """Path of ``kube-controller-manager`` in ``bin_dir`` (default: the e2e binaries).

    Raises:
        BinariesMissing: it is not built (the message says how to build it).
    """
    path = (bin_dir or default_bin_dir()) / BINARY
    if not os.access(path, os.X_OK):
        raise BinariesMissing(f"{BINARY} not found in {path.parent}; build it with "
                              "hack/k8s/build.sh (or point HAMI_K8S_BIN_DIR at it)")
    return path


#: The controller that fills in ``kubernetes.io/service-account-token`` Secrets.
TOKEN_CONTROLLER = "serviceaccount-token-controller"


def token_controller_args(cp: ControlPlane) -> list[str]:
    """The flags :data:`TOKEN_CONTROLLER` needs on ``cp``: the key the apiserver's
    ServiceAccount tokens are signed with (``sa.key``, whose public half the apiserver
    checks them against) and the CA it writes into each Secret's ``ca.crt``."""
    return [f"--service-account-private-key-file={cp.pki_dir / 'sa.key'}",
            f"--root-ca-file={cp.ca_file}"]


def start_controller_manager(cp: ControlPlane,
                             controllers: Sequence[str] = DRA_CONTROLLERS,
                             *, timeout_s: float = DEFAULT_TIMEOUT_S,
                             user: str | None = None,
                             extra_args: Sequence[str] = ()) -> ControllerManager:
    """Start kube-controller-manager on ``cp`` running only ``controllers`` (no leader
    election, admin credentials); it stops with the control plane. Waits for ``/healthz``.
    ``user``: the user name its client certificate carries (in ``system:masters``, so it
    keeps every right), e.g. ``system:kube-controller-manager`` as in a cluster without
    ``--use-service-account-credentials``; None: the admin's. ``extra_args``: further
    flags, e.g. :func:`token_controller_args` for the ``serviceaccount-token-controller``.

    Raises:
        BinariesMissing: the binary is not built.
        ControlPlaneError: it exited or was not healthy within ``timeout_s``.
    """
    binary = find_controller_manager(cp.binaries["kube-apiserver"].parent)
    kubeconfig = cp.kubeconfig if user is None else cp.client_kubeconfig(
        cp.workdir / f"{BINARY}-{user.replace(':', '-')}.kubeconfig", user, ["system:masters"])

    def start() -> ControllerManager:
        port = free_port()
        comp = cp._spawn(f"{BINARY}-{port}", [  # noqa: SLF001 - same package's process table
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            f"--tls-cert-file={cp.pki_dir / 'serving.crt'}",
            f"--tls-private-key-file={cp.pki_dir / 'serving.key'}",
            "--kube-api-qps=200", "--kube-api-burst=400",
            f"--v={cp.verbosity}",
            *extra_args,
        ])
        cp.startup_seconds[BINARY] = comp.wait_healthy(
            lambda: cp._https_ok(f"https://{HOST}:{port}/healthz"),  # noqa: SLF001
            "/healthz", timeout_s)
        return ControllerManager(tuple(controllers), port, comp)

    return cp._retry_on_port_clash(start)  # noqa: SLF001
