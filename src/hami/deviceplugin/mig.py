"""Dynamic MIG in the device plugin (``operatingmode: mig``; HAMi-core 1.2 and HAMi v2.10).

* Registration: :func:`discover` reads each GPU's NVML GI profiles through the driver and
  keeps those the ``migProfileAllowlist`` allows
  (:func:`hami.deviceplugin.migplan.gpu_profiles`).
* Allocate: :class:`MigManager` creates exactly the GPU/compute instances of the pod's
  plan (:func:`hami.deviceplugin.migplan.plan_mig`), answers with the MIG UUIDs (no
  libvgpu env or mounts) and writes ``migUUID``/``gpuInstanceID``/``computeInstanceID``
  back (merge patch with the pod's resourceVersion).
* Reconciler: :meth:`MigManager.reconcile` destroys instances on the node's MIG GPUs that
  no live pod references (by GI id or placement); it runs at start (adopting what pods
  reference) and every 5 s.
* While instances are created or destroyed the apply lock file exists
  (``/tmp/hami/hami-mig-apply.lock``); registration and health checks skip meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami.core.codec import CodecError, encode_pod_devices
from hami.core.codec_mig import MigAllocation
from hami.core.model import MigProfile
from hami.deviceplugin.config import MigAllowEntry
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.migdriver import MigDriver, MigDriverError, MigInstance
from hami.deviceplugin.migplan import (
    MIG_ALLOCATIONS,
    MigPlan,
    References,
    gpu_profiles,
    plan_mig,
    profile_slices,
    references,
    written_back,
)
from hami.deviceplugin.podview import (
    BIND_PHASE,
    DEVICES_TO_ALLOCATE,
    AllocateError,
    PodView,
    decode_entries,
)

log = logging.getLogger(__name__)

#: HAMi's apply lock (HAMi-core 1.2).
DEFAULT_APPLY_LOCK = Path("/tmp/hami/hami-mig-apply.lock")
#: Reconciler period (HAMi-core 1.2).
RECONCILE_INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class MigResult:
    """An Allocate answer: ``NVIDIA_VISIBLE_DEVICES`` per container, and whether the pod
    has nothing left to allocate."""

    envs: tuple[dict[str, str], ...]
    complete: bool


@dataclass
class ReconcileResult:
    """One reconciler pass: instances kept (referenced) and destroyed, per GPU."""

    kept: list[MigInstance] = field(default_factory=list)
    destroyed: list[MigInstance] = field(default_factory=list)
    skipped: str = ""


def _check_unreserved(refs: References, plan: MigPlan, uid: str) -> None:
    """Raise :class:`AllocateError` when another live pod (not ``uid``) reserves a
    placement overlapping one of the plan's."""
    for c in plan.containers:
        for a in c.allocations:
            taken = refs.held_by_others(a.gpu_uuid, a.placement, uid)
            if taken:
                raise AllocateError(
                    f"{a.gpu_uuid}: placement {a.placement.start}+"
                    f"{a.placement.size} for {a.profile} is reserved by live pod "
                    f"{taken[0].owner[1]}")


def _reusable(existing: Sequence[MigInstance], a: MigAllocation,
              slices: int) -> MigInstance | None:
    """An existing whole instance (with its compute instance) at ``a``'s placement and
    slice count, the one with ``a``'s recorded GPU instance id when there is one."""
    same = [i for i in existing if i.placement == a.placement and i.slices == slices
            and i.mig_uuid]
    if a.runtime is not None:
        same = [i for i in same if i.gpu_instance_id == a.runtime.gpu_instance_id] or same
    return same[0] if same else None


def apply_lock_held(path: Path) -> bool:
    """True while the MIG apply lock file exists (the plugin is reconfiguring MIG)."""
    return path.exists()


class MigManager:
    """Creates, adopts and removes MIG instances for this node's MIG-mode GPUs.

    ``profiles`` maps the registered GPU UUIDs to ``(count, migProfiles)``. One lock
    serializes Allocate's creates and the reconciler's destroys.
    """

    def __init__(self, driver: MigDriver, kube: KubeApi, node: str,
                 profiles: Mapping[str, tuple[int, tuple[MigProfile, ...]]],
                 apply_lock: Path = DEFAULT_APPLY_LOCK, patch_attempts: int = 3) -> None:
        self.driver = driver
        self.kube = kube
        self.node = node
        self.profiles = dict(profiles)
        self.apply_lock_path = apply_lock
        self.patch_attempts = patch_attempts
        self.lock = threading.RLock()
        self.passes = 0

    @contextlib.contextmanager
    def applying(self) -> Iterator[None]:
        """Hold the apply lock file (created, removed afterwards) around driver changes."""
        self.apply_lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.apply_lock_path, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.apply_lock_path.unlink()

    def clear_stale_apply_lock(self) -> bool:
        """Remove an apply lock left by a process that died while applying (the file sits
        on a hostPath, so it survives; nothing else would remove it and registration and
        the monitor's feedback would stay paused). Call at start, before any apply.
        Returns True when a stale lock was removed."""
        try:
            self.apply_lock_path.unlink()
        except FileNotFoundError:
            return False
        log.warning("removed a stale MIG apply lock %s (a previous plugin died while "
                    "applying)", self.apply_lock_path)
        return True

    # -- Allocate ---------------------------------------------------------------------------
    def allocate(self, pod: PodView, requests: Sequence[Sequence[str]]) -> MigResult:
        """Realize the pod's next containers (see module docstring).

        On any failure the instances this call created are destroyed and
        :class:`AllocateError` is raised (the caller marks the pod failed).
        """
        plan = plan_mig(pod, requests, self.profiles)
        created: list[MigInstance] = []
        realized: dict[tuple[int, int], MigInstance] = {}
        with self.lock:
            try:
                _check_unreserved(references(self.kube.pods_on_node(self.node)), plan, pod.uid)
                for c in plan.containers:
                    for a in c.allocations:
                        realized[(a.container_index, a.device_index)] = self._realize(
                            pod, a, created)
                self._write_back(pod, plan, realized)
            except (MigDriverError, KubeError, CodecError, AllocateError) as exc:
                self._rollback(created)
                raise AllocateError(str(exc)) from None
        envs = tuple({"NVIDIA_VISIBLE_DEVICES": ",".join(
            realized[(a.container_index, a.device_index)].mig_uuid for a in c.allocations)}
            for c in plan.containers)
        return MigResult(envs, plan.complete)

    def _realize(self, pod: PodView, a: MigAllocation,
                 created: list[MigInstance]) -> MigInstance:
        """The instance of reservation ``a``: an existing one at its placement (reused),
        else a new one (appended to ``created``). A GPU instance left without its compute
        instance is destroyed first; when other instances block the placement, one
        reconciler pass runs before the second try. Raises :class:`MigDriverError`."""
        slices = profile_slices(a.profile)
        if slices is None:
            raise AllocateError(f"MIG profile {a.profile!r} is not <N>g.<name>")
        for attempt in range(2):
            existing = self.driver.instances(a.gpu_uuid)
            same = _reusable(existing, a, slices)
            if same is not None:
                log.info("%s/%s: reusing GPU instance %d at %d+%d on %s", pod.namespace, pod.name,
                         same.gpu_instance_id, a.placement.start, a.placement.size, a.gpu_uuid)
                return same
            existing = self._destroy_half_made(existing, a, slices)
            blocking = [i for i in existing if i.placement.overlaps(a.placement)]
            if not blocking:
                return self._create(pod, a, slices, created)
            if attempt == 0:
                # Orphans of deleted pods may still sit there: one reconciler pass first.
                self.reconcile()
        raise MigDriverError(
            f"{a.gpu_uuid}: placement {a.placement.start}+{a.placement.size} for {a.profile} "
            f"overlaps GPU instance(s) {[i.gpu_instance_id for i in blocking]} that live pods use")

    def _destroy_half_made(self, existing: list[MigInstance], a: MigAllocation,
                           slices: int) -> list[MigInstance]:
        """Destroy GPU instances at ``a``'s placement that have no compute instance (an
        interrupted create); returns ``existing`` without them."""
        half = [i for i in existing if i.placement == a.placement and i.slices == slices
                and not i.mig_uuid]
        if not half:
            return existing
        with self.applying():
            for i in half:
                self.driver.destroy(i.gpu_uuid, i.gpu_instance_id)
        return [i for i in existing if i not in half]

    def _create(self, pod: PodView, a: MigAllocation, slices: int,
                created: list[MigInstance]) -> MigInstance:
        """Create ``a``'s instance under the apply lock and record it in ``created``."""
        with self.applying():
            inst = self.driver.create(a.gpu_uuid, slices, a.placement)
        created.append(inst)
        log.info("%s/%s: created %s GPU instance %d / compute instance %d at %d+%d on %s "
                 "-> %s", pod.namespace, pod.name, a.profile, inst.gpu_instance_id,
                 inst.compute_instance_id, a.placement.start, a.placement.size,
                 a.gpu_uuid, inst.mig_uuid)
        return inst

    def _write_back(self, pod: PodView, plan: MigPlan,
                    realized: Mapping[tuple[int, int], MigInstance]) -> None:
        """One merge patch (resourceVersion-guarded): runtime ids, the emptied
        ``to-allocate`` entries and, when complete, ``bind-phase=success``. On a 409 the
        pod is re-read and the same entries are emptied again (they must still be there)."""
        current = pod
        to_allocate = plan.to_allocate
        for attempt in range(self.patch_attempts):
            update: dict[str, str] = {
                MIG_ALLOCATIONS: written_back(current.annotations.get(MIG_ALLOCATIONS, ""),
                                              realized),
                DEVICES_TO_ALLOCATE: to_allocate,
            }
            if plan.complete:
                update[BIND_PHASE] = "success"
            try:
                self.kube.patch_pod_annotations(current.namespace, current.name, update,
                                                resource_version=current.resource_version or None)
                return
            except KubeError as exc:
                if exc.code != 409 or attempt == self.patch_attempts - 1:
                    raise
            current, to_allocate = self._reread(pod, plan)

    def _reread(self, pod: PodView, plan: MigPlan) -> tuple[PodView, str]:
        """The pod read again after a conflict, and its ``to-allocate`` with the plan's
        entries emptied (they must still be there). Raises :class:`KubeError` (404 when
        the pod is gone or replaced) or :class:`AllocateError`."""
        fresh = self.kube.get_pod(pod.namespace, pod.name)
        if fresh is None or fresh.uid != pod.uid:
            raise KubeError(f"{pod.namespace}/{pod.name} is gone", 404)
        entries = list(decode_entries(fresh))
        for c in plan.containers:
            if not entries[c.entry_index:c.entry_index + 1] or not entries[c.entry_index]:
                raise AllocateError(f"{pod.namespace}/{pod.name}: container entry "
                                    f"{c.entry_index} changed while allocating")
            entries[c.entry_index] = ()
        return fresh, encode_pod_devices(tuple(entries))

    def _rollback(self, created: Sequence[MigInstance]) -> None:
        if not created:
            return
        with self.applying():
            for inst in created:
                try:
                    self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
                except MigDriverError as exc:  # the reconciler retries it
                    log.error("rollback: cannot destroy GPU instance %d on %s: %s",
                              inst.gpu_instance_id, inst.gpu_uuid, exc)

    # -- reconciler -------------------------------------------------------------------------
    def reconcile(self) -> ReconcileResult:
        """Destroy instances on this node's MIG GPUs that no live pod references; keep
        (adopt) the referenced ones. Does nothing when the pods cannot be listed."""
        result = ReconcileResult()
        with self.lock:
            self.passes += 1
            try:
                refs = references(self.kube.pods_on_node(self.node))
            except KubeError as exc:
                result.skipped = f"pod list failed: {exc}"
                log.warning("MIG reconcile skipped: %s", result.skipped)
                return result
            doomed = self._unreferenced(refs, result)
            if doomed:
                with self.applying():
                    for inst in doomed:
                        self._destroy_unreferenced(inst, result)
        return result

    def _unreferenced(self, refs: References, result: ReconcileResult) -> list[MigInstance]:
        """The instances on this node's MIG GPUs that ``refs`` does not keep; the kept
        ones go to ``result.kept`` (a GPU whose instances cannot be listed is skipped)."""
        doomed: list[MigInstance] = []
        for gpu in self.profiles:
            try:
                instances = self.driver.instances(gpu)
            except MigDriverError as exc:
                log.error("MIG reconcile: cannot list instances of %s: %s", gpu, exc)
                continue
            for inst in instances:
                (result.kept if refs.keeps(inst) else doomed).append(inst)
        return doomed

    def _destroy_unreferenced(self, inst: MigInstance, result: ReconcileResult) -> None:
        """Destroy one instance (recorded in ``result.destroyed``); a failure is logged and
        left to the next pass."""
        try:
            self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
            result.destroyed.append(inst)
            log.info("MIG reconcile: destroyed unreferenced GPU instance %d "
                     "(%d+%d) on %s", inst.gpu_instance_id, inst.placement.start,
                     inst.placement.size, inst.gpu_uuid)
        except MigDriverError as exc:
            log.error("MIG reconcile: destroy %d on %s failed: %s",
                      inst.gpu_instance_id, inst.gpu_uuid, exc)

    def run(self, stop: threading.Event, interval_s: float = RECONCILE_INTERVAL_S) -> None:
        """Reconcile every ``interval_s`` until ``stop`` (the first pass runs at start)."""
        while not stop.is_set():
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("MIG reconcile pass failed")
            stop.wait(interval_s)


def discover(driver: MigDriver, gpus: Sequence[tuple[str, str]],
             allowlist: Sequence[MigAllowEntry]) -> dict[str, tuple[int, tuple[MigProfile, ...]]]:
    """``(count, migProfiles)`` for each ``(uuid, NVML name)`` that has allowed profiles
    (GPUs whose profiles cannot be read are left out, with a log line)."""
    out = {}
    for uuid, name in gpus:
        try:
            infos = driver.profiles(uuid)
        except MigDriverError as exc:
            log.error("MIG profiles of %s unavailable: %s", uuid, exc)
            continue
        count, profiles = gpu_profiles(name, infos, allowlist)
        if profiles:
            out[uuid] = (count, profiles)
        else:
            log.warning("%s (%s): no allowed MIG profile; not registered in mig mode", uuid, name)
    return out
