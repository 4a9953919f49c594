"""The DRA kubelet plugin: plugin registration (v1 ``GetInfo``) and ``DRAPlugin`` v1.

Two gRPC servers on unix sockets, as the kubelet expects of a DRA driver (Kubernetes
v1.37):

* ``<registry dir>/gpu.hami.io-reg.sock`` (kubelet ``plugins_registry``): ``GetInfo``
  answers type ``DRAPlugin``, the driver name, the DRA socket path and the service
  ``v1.DRAPlugin``.
* ``<plugin dir>/dra.sock``: ``NodePrepareResources`` reads each claim from the API
  (its UID must match the kubelet's), turns its allocation into a CDI spec
  (:mod:`hami.dra.cdi`), creates the claim's cache and lock directories and limits file,
  writes the spec atomically to ``<cdi dir>/gpu.hami.io-<uid>.json`` and (re)writes the
  claim's owner record for the monitor (:func:`hami.dra.cdi.owner_record`, from the pods
  of ``status.reservedFor``, read through ``get_pod``); the answer names
  the CDI device ``gpu.hami.io/claim=<uid>`` for every allocated card.
  ``NodeUnprepareResources`` removes the spec and the claim's directories. Both are
  idempotent (the kubelet retries them). A claim's failure is its own ``error``; the
  other claims of the call are still served.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hami.api import names
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.service import make_host_dirs, write_feedback_files, write_host_files
from hami.deviceplugin.service import write_json_file as _write_json
from hami.deviceplugin.sockets import check_socket_paths
from hami.dra import cdi
from hami.dra.migclaims import ClaimMig, mig_cdi_spec, mig_results
from hami.dra.registration import api_pb2 as regpb
from hami.dra.registration import api_pb2_grpc as reggrpc
from hami.dra.slices import DRIVER
from hami.dra.v1 import api_pb2 as pb
from hami.dra.v1 import api_pb2_grpc as pbgrpc

log = logging.getLogger(__name__)

#: The gRPC service the plugin offers (``k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService``).
DRA_SERVICE = "v1.DRAPlugin"
#: Fetch a claim: (namespace, name) -> the ResourceClaim as a dict, or None when absent.
ClaimGetter = Callable[[str, str], Mapping[str, Any] | None]
#: Fetch a pod: (namespace, name) -> the Pod as a dict, or None when absent.
PodGetter = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class PluginPaths:
    """Where the plugin lives on the host: ``registry_dir`` (kubelet
    ``plugins_registry``), ``plugin_dir`` (holds ``dra.sock``), ``cdi_dir`` (the CDI spec
    directory of the container runtime)."""

    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugin_dir: Path = Path(f"/var/lib/kubelet/plugins/{DRIVER}")
    cdi_dir: Path = Path("/var/run/cdi")

    @property
    def registration_socket(self) -> Path:
        """``<registry_dir>/gpu.hami.io-reg.sock``."""
        return self.registry_dir / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        """``<plugin_dir>/dra.sock``."""
        return self.plugin_dir / "dra.sock"


class DraNode(pbgrpc.DRAPluginServicer):
    """``NodePrepareResources``/``NodeUnprepareResources`` for one node.

    ``uuids`` returns the node's device name -> GPU UUID map now (from discovery);
    ``get_claim`` reads a ResourceClaim, ``get_pod`` a Pod (None: the owner record names
    the pods without their containers); ``cfg``/``settings`` are the device plugin's;
    ``mig`` realizes claims for MIG instance devices (None: no MIG-mode cards).
    """

    def __init__(self, node: str, get_claim: ClaimGetter, uuids: Callable[[], Mapping[str, str]],
                 cfg: PluginConfig, settings: NodeSettings, cdi_dir: Path,
                 get_pod: PodGetter | None = None, mig: ClaimMig | None = None) -> None:
        self.node = node
        self.get_claim = get_claim
        self.get_pod = get_pod
        self.uuids = uuids
        self.cfg = cfg
        self.settings = settings
        self.cdi_dir = cdi_dir
        self.mig = mig
        self._lock = threading.Lock()

    def prepare(self, namespace: str, name: str, uid: str) -> list[pb.Device]:
        """Prepare one claim; returns the devices of the answer. Raises :class:`cdi.ClaimError`."""
        claim = self.get_claim(namespace, name)
        if claim is None:
            raise cdi.ClaimError(f"ResourceClaim {namespace}/{name} not found")
        got_uid = (claim.get("metadata") or {}).get("uid")
        if got_uid != uid:
            raise cdi.ClaimError(f"ResourceClaim {namespace}/{name} has UID {got_uid}, "
                                 f"the kubelet asked for {uid}")
        if self.mig is not None:
            migs = mig_results(claim, self.node, self.mig.targets())
            if migs:
                mig_uuids = self.mig.prepare(uid, migs, (namespace, name))
                _write_json(self.cdi_dir / cdi.spec_file_name(uid), mig_cdi_spec(uid, mig_uuids))
                return [self._device(m.request, m.device, m.share_id, uid) for m in migs]
        cards = cdi.allocated_cards(claim, self.node)
        spec_path = self.cdi_dir / cdi.spec_file_name(uid)
        uuids = self.uuids()
        if not spec_path.exists():  # prepared before: keep its cache file name
            plan = cdi.claim_plan(uid, namespace, name, cards, uuids, self.cfg,
                                  self.settings, str(uuid.uuid4()))
            make_host_dirs(plan.host_dirs)
            write_host_files(plan.host_files)
            write_feedback_files(plan.feedback_files)
            _write_json(spec_path, cdi.cdi_spec(uid, plan))
        self._write_owner(claim, cards, uuids)
        return [self._device(c.request, c.device, c.share_id, uid) for c in cards]

    def _device(self, request: str, device: str, share_id: str | None, uid: str) -> Any:
        d = pb.Device(request_names=[request], pool_name=self.node, device_name=device,
                      cdi_device_ids=[cdi.cdi_device_id(uid)])
        if share_id:
            d.share_id = share_id
        return d

    def _write_owner(self, claim: Mapping[str, Any], cards: list[cdi.AllocatedCard],
                     uuids: Mapping[str, str]) -> None:
        """(Re)write ``<claimUID>.plugin/owner.json``: a shared claim gains pods."""
        meta = claim.get("metadata") or {}
        namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
        pods = []
        for pod_name, pod_uid in cdi.reserved_pods(claim):
            pod = None
            if self.get_pod is not None:
                try:
                    pod = self.get_pod(namespace, pod_name)
                except Exception as exc:  # noqa: BLE001 - the record is for monitoring only
                    log.warning("owner record of %s: cannot read pod %s/%s: %s", uid,
                                namespace, pod_name, exc)
            if pod is None:  # unknown containers: the record still names the pod
                pod = {"metadata": {"name": pod_name, "uid": pod_uid}}
            pods.append(pod)
        private = Path(cdi.claim_dirs(self.settings.hook_path, uid)[1])
        private.mkdir(parents=True, exist_ok=True)
        _write_json(private / names.DRA_OWNER_FILE, cdi.owner_record(claim, cards, uuids, pods))

    def unprepare(self, uid: str) -> None:
        """Remove the claim's CDI spec and its directories (nothing there is fine).
        Raises :class:`cdi.ClaimError` on a malformed UID, ``OSError`` on I/O errors."""
        if not cdi._UID.match(uid):
            raise cdi.ClaimError(f"malformed claim UID {uid!r}")
        if self.mig is not None:
            self.mig.release(uid)
        (self.cdi_dir / cdi.spec_file_name(uid)).unlink(missing_ok=True)
        for d in cdi.claim_dirs(self.settings.hook_path, uid):
            shutil.rmtree(d, ignore_errors=True)

    def sweep(self, grace_s: float, now: float | None = None) -> list[str]:
        """Unprepare the MIG claims whose ResourceClaim has been gone from the API for
        ``grace_s`` seconds (:meth:`hami.dra.migclaims.ClaimMig.stale_claims`): their
        instances are destroyed, their CDI specs and directories removed. Under the
        prepare lock, so never in the middle of a prepare. Then the instances no claim
        has recorded for ``grace_s`` (:meth:`hami.dra.migclaims.ClaimMig.sweep_orphans`:
        created just before a crash). Returns the claim UIDs swept (nothing without
        MIG). ``now``: monotonic seconds (default: now)."""
        if self.mig is None:
            return []

        def uid_of(namespace: str, name: str) -> str | None:
            claim = self.get_claim(namespace, name)
            return None if claim is None else str((claim.get("metadata") or {}).get("uid"))

        swept = []
        with self._lock:
            for uid in self.mig.stale_claims(uid_of, grace_s,
                                             time.monotonic() if now is None else now):
                try:
                    self.unprepare(uid)
                except (cdi.ClaimError, OSError) as exc:
                    log.error("MIG sweep: cannot unprepare claim %s: %s", uid, exc)
                    continue
                log.info("MIG sweep: claim %s is gone; its MIG instances are destroyed", uid)
                swept.append(uid)
            self.mig.sweep_orphans(grace_s, time.monotonic() if now is None else now)
        return swept

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC
        """Prepare every claim of the request; each claim's result (devices or error)
        keyed by its UID."""
        resp = pb.NodePrepareResourcesResponse()
        with self._lock:
            for claim in request.claims:
                try:
                    devices = self.prepare(claim.namespace, claim.name, claim.uid)
                    resp.claims[claim.uid].devices.extend(devices)
                except (cdi.ClaimError, OSError, ValueError) as exc:
                    log.warning("prepare %s/%s (%s): %s", claim.namespace, claim.name,
                                claim.uid, exc)
                    resp.claims[claim.uid].error = str(exc)
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC
        """Unprepare every claim of the request; errors per claim UID."""
        resp = pb.NodeUnprepareResourcesResponse()
        with self._lock:
            for claim in request.claims:
                try:
                    self.unprepare(claim.uid)
                    resp.claims[claim.uid].error = ""
                except (cdi.ClaimError, OSError) as exc:
                    resp.claims[claim.uid].error = str(exc)
        return resp


class Registration(reggrpc.RegistrationServicer):
    """The kubelet's plugin watcher asks who we are (``GetInfo``) and reports the outcome
    (``NotifyRegistrationStatus``, kept in :attr:`registered`/:attr:`error`)."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC
        """``PluginInfo``: type ``DRAPlugin``, our driver, the DRA socket, ``v1.DRAPlugin``."""
        return regpb.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(self.endpoint),
                                supported_versions=[DRA_SERVICE])

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Record the kubelet's verdict."""
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
        else:
            log.error("kubelet refused the DRA plugin: %s", request.error)
        return regpb.RegistrationStatusResponse()


def serve(node: DraNode, paths: PluginPaths) -> tuple[Any, Registration]:
    """Start both servers (removing stale sockets first); returns ``(server, registration)``.
    Stop with ``server.stop(grace)``. Raises ``OSError``/``RuntimeError`` when a socket
    cannot be bound: ``RuntimeError`` naming the path when it is longer than
    :data:`~hami.deviceplugin.sockets.MAX_SOCKET_PATH_BYTES`
    (:class:`~hami.deviceplugin.sockets.SocketPathError`, checked before anything is
    created)."""
    check_socket_paths(listen=(paths.registration_socket, paths.dra_socket))
    for p in (paths.registration_socket, paths.dra_socket):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)
    paths.cdi_dir.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbgrpc.add_DRAPluginServicer_to_server(node, server)  # type: ignore[no-untyped-call]
    reg = Registration(paths.dra_socket)
    reggrpc.add_RegistrationServicer_to_server(reg, server)  # type: ignore[no-untyped-call]
    # One server, both sockets: the kubelet calls each service only on its own socket.
    for p in (paths.dra_socket, paths.registration_socket):
        if not server.add_insecure_port(f"unix://{p}"):
            raise RuntimeError(f"cannot listen on {p}")
    server.start()
    return server, reg
