"""Dynamic MIG in the device plugin (``operatingmode: mig``; HAMi-core 1.2 and HAMi v2.10).

* Registration: :func:`gpu_profiles` turns a GPU's NVML GI profiles and the
  ``migProfileAllowlist`` into the ``count`` and ``migProfiles`` of its register entry.
* Allocate: :func:`plan_mig` (pure) pairs the kubelet's container requests with the pod's
  ``hami.io/vgpu-devices-to-allocate`` entries and ``hami.io/vgpu-mig-allocations``
  reservations; :class:`MigManager` creates exactly those GPU/compute instances, answers
  with the MIG UUIDs (no libvgpu env or mounts) and writes ``migUUID``/``gpuInstanceID``/
  ``computeInstanceID`` back (merge patch with the pod's resourceVersion).
* Reconciler: :meth:`MigManager.reconcile` destroys instances on the node's MIG GPUs that
  no live pod references (by GI id or placement); it runs at start (adopting what pods
  reference) and every 5 s.
* While instances are created or destroyed the apply lock file exists
  (``/tmp/hami/hami-mig-apply.lock``); registration and health checks skip meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami.core.codec import CodecError, encode_pod_devices
from hami.core.codec_mig import (
    MigAllocation,
    MigRuntimeIdentity,
    decode_mig_allocations,
    encode_mig_allocations,
)
from hami.core.model import MigPlacement, MigProfile
from hami.deviceplugin import allocate as al
from hami.deviceplugin.config import MigAllowEntry
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.migdriver import GiProfileInfo, MigDriver, MigDriverError, MigInstance

log = logging.getLogger(__name__)

#: Pod annotation the scheduler writes for MIG pods (HAMi v2.10).
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
#: HAMi's apply lock (HAMi-core 1.2).
DEFAULT_APPLY_LOCK = Path("/tmp/hami/hami-mig-apply.lock")
#: Reconciler period (HAMi-core 1.2).
RECONCILE_INTERVAL_S = 5.0
#: Pod phases whose containers are gone.
_DONE_PHASES = ("Succeeded", "Failed")


def profile_slices(name: str) -> int | None:
    """``<N>`` of a ``<N>g.<anything>`` profile name; None when the name has no such
    prefix (then no NVML profile matches it)."""
    head = name.split(".", 1)[0]
    if "." not in name or len(head) < 2 or not head.endswith("g") or not head[:-1].isdigit():
        return None
    return int(head[:-1])


# --- registration (HAMi v2.10) ------------------------------------------------------------------


def allow_entry(model: str, allowlist: Sequence[MigAllowEntry]) -> MigAllowEntry | None:
    """The first allowlist entry with a model that is a substring of ``model``."""
    return next((e for e in allowlist if any(m in model for m in e.models)), None)


def gpu_profiles(model: str, infos: Sequence[GiProfileInfo],
                 allowlist: Sequence[MigAllowEntry]) -> tuple[int, tuple[MigProfile, ...]]:
    """``(count, migProfiles)`` to register for one GPU (HAMi v2.10).

    The profiles are those of the first allowlist entry matching ``model`` (NVML name),
    in allowlist order, that the GPU supports: the name prefix ``<N>g`` selects the
    NVML GI profile with ``slices == N``; ``memoryMB`` = its NVML memory (MiB);
    ``core = ceil(SMs x 100 / max SMs over the GPU's profiles)``; ``sliceCount`` = N;
    placements = NVML's possible placements. ``count`` = the largest instance count among
    them. ``(0, ())`` when no entry matches or no listed profile is supported.
    """
    entry = allow_entry(model, allowlist)
    if entry is None or not infos:
        return 0, ()
    max_sms = max(i.multiprocessors for i in infos) or 1
    by_slices = {i.slices: i for i in infos}
    profiles, count = [], 0
    for name in entry.profiles:
        slices = profile_slices(name)
        info = by_slices.get(slices) if slices is not None else None
        if info is None:
            continue
        profiles.append(MigProfile(name, info.memory_mib,
                                   math.ceil(info.multiprocessors * 100 / max_sms),
                                   info.slices, info.placements))
        count = max(count, info.instance_count)
    return (count, tuple(profiles)) if profiles else (0, ())


# --- Allocate planning (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigContainerPlan:
    """One kubelet container request: the pod entry it takes and its reservations, in
    device order."""

    entry_index: int
    allocations: tuple[MigAllocation, ...]


@dataclass(frozen=True, slots=True)
class MigPlan:
    """What one Allocate realizes, and the pod's ``to-allocate`` value afterwards."""

    containers: tuple[MigContainerPlan, ...]
    to_allocate: str
    complete: bool


def pod_mig_allocations(pod: al.PodView) -> tuple[MigAllocation, ...]:
    """The pod's ``hami.io/vgpu-mig-allocations``. Raises :class:`al.AllocateError`."""
    try:
        return decode_mig_allocations(pod.annotations.get(MIG_ALLOCATIONS, ""))
    except CodecError as exc:
        raise al.AllocateError(f"{pod.namespace}/{pod.name}: bad {MIG_ALLOCATIONS}: {exc}") from None


def plan_mig(pod: al.PodView, requests: Sequence[Sequence[str]],
             profiles: Mapping[str, tuple[int, tuple[MigProfile, ...]]]) -> MigPlan:
    """Pair each kubelet request with the pod's next non-empty device entry (init
    containers first) and that entry's MIG reservations ``(entry, device)``.

    Checks: device counts match; every device has a reservation on the same GPU; the
    GPU is a MIG GPU of this node (``profiles``); the profile is registered for it and
    the placement is one of its placements. Raises :class:`al.AllocateError`.
    """
    entries = list(al.decode_entries(pod))
    allocations = pod_mig_allocations(pod)
    reservations = {(a.container_index, a.device_index): a for a in allocations}
    who = f"{pod.namespace}/{pod.name}"
    for n, x in enumerate(allocations):
        for y in allocations[n + 1:]:
            if x.gpu_uuid == y.gpu_uuid and x.placement.overlaps(y.placement):
                raise al.AllocateError(
                    f"{who}: MIG allocations of container {x.container_index} device "
                    f"{x.device_index} and container {y.container_index} device "
                    f"{y.device_index} overlap on {x.gpu_uuid} (one instance cannot serve two)")
    out = []
    for ids in requests:
        idx = next((i for i, c in enumerate(entries) if c), None)
        if idx is None:
            raise al.AllocateError(f"{who}: no devices left to allocate")
        devices = entries[idx]
        if len(devices) != len(ids):
            raise al.AllocateError(f"{who}: kubelet asks for {len(ids)} devices, the scheduler "
                                   f"granted {len(devices)} to container entry {idx}")
        chosen = []
        for d, dev in enumerate(devices):
            a = reservations.get((idx, d))
            if a is None:
                raise al.AllocateError(f"{who}: no MIG allocation for container {idx} device {d}")
            if a.gpu_uuid != dev.uuid:
                raise al.AllocateError(f"{who}: MIG allocation for container {idx} device {d} "
                                       f"is on {a.gpu_uuid}, the device entry on {dev.uuid}")
            if a.gpu_uuid not in profiles:
                raise al.AllocateError(f"{who}: {a.gpu_uuid} is not a MIG GPU of this node")
            prof = next((p for p in profiles[a.gpu_uuid][1] if p.name == a.profile), None)
            if prof is None:
                raise al.AllocateError(f"{who}: profile {a.profile} is not registered "
                                       f"for {a.gpu_uuid}")
            if a.placement not in prof.placements:
                raise al.AllocateError(f"{who}: placement {a.placement.start}+{a.placement.size} "
                                       f"is not a {a.profile} placement")
            chosen.append(a)
        out.append(MigContainerPlan(idx, tuple(chosen)))
        entries[idx] = ()
    try:
        value = encode_pod_devices(tuple(entries))
    except (CodecError, ValueError) as exc:
        raise al.AllocateError(f"cannot re-encode {al.DEVICES_TO_ALLOCATE}: {exc}") from None
    return MigPlan(tuple(out), value, complete=not any(entries))


def written_back(value: str, realized: Mapping[tuple[int, int], MigInstance]) -> str:
    """``hami.io/vgpu-mig-allocations`` with the runtime identity of ``realized``
    (keyed by ``(containerIndex, deviceIndex)``) filled in. Raises ``CodecError``."""
    out = []
    for a in decode_mig_allocations(value):
        inst = realized.get((a.container_index, a.device_index))
        if inst is not None:
            a = MigAllocation(a.container_index, a.device_index, a.gpu_uuid, a.profile,
                              a.placement, MigRuntimeIdentity(inst.mig_uuid, inst.gpu_instance_id,
                                                              inst.compute_instance_id))
        out.append(a)
    return encode_mig_allocations(out)


@dataclass(frozen=True, slots=True)
class Claim:
    """One live reservation: which pod (``owner`` = ``(uid, "ns/name")``) holds which
    placement with how many slices (None when the profile name is not ``<N>g.``) and,
    once realized, which GPU instance id."""

    owner: tuple[str, str]
    placement: MigPlacement
    slices: int | None
    gpu_instance_id: int | None


@dataclass
class References:
    """What live pods reserve on each GPU (:class:`Claim` lists by GPU UUID)."""

    claims: dict[str, list[Claim]] = field(default_factory=dict)

    def keeps(self, inst: MigInstance) -> bool:
        """True when a live reservation is this instance: the same placement and slice
        count and, when the reservation is realized, the same GPU instance id. (An id alone
        is not enough: ids are reused after an instance disappears; a placement alone is
        not enough: another profile may sit there.)"""
        return any(c.placement == inst.placement
                   and (c.slices is None or c.slices == inst.slices)
                   and (c.gpu_instance_id is None or c.gpu_instance_id == inst.gpu_instance_id)
                   for c in self.claims.get(inst.gpu_uuid, ()))

    def held_by_others(self, gpu_uuid: str, placement: MigPlacement,
                       uid: str) -> list[Claim]:
        """Other pods' reservations on ``gpu_uuid`` overlapping ``placement``."""
        return [c for c in self.claims.get(gpu_uuid, ())
                if c.owner[0] != uid and c.placement.overlaps(placement)]


def references(pods: Sequence[al.PodView]) -> References:
    """Collect MIG reservations of pods not yet Succeeded/Failed (undecodable annotations
    are skipped: the plugin never created instances for them)."""
    refs = References()
    for p in pods:
        if p.phase in _DONE_PHASES or MIG_ALLOCATIONS not in p.annotations:
            continue
        try:
            allocs = decode_mig_allocations(p.annotations[MIG_ALLOCATIONS])
        except CodecError as exc:
            log.warning("%s/%s: ignoring bad %s: %s", p.namespace, p.name, MIG_ALLOCATIONS, exc)
            continue
        for a in allocs:
            refs.claims.setdefault(a.gpu_uuid, []).append(Claim(
                (p.uid, f"{p.namespace}/{p.name}"), a.placement, profile_slices(a.profile),
                a.runtime.gpu_instance_id if a.runtime is not None else None))
    return refs


# --- the stateful part ---------------------------------------------------------------------


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
    def allocate(self, pod: al.PodView, requests: Sequence[Sequence[str]]) -> MigResult:
        """Realize the pod's next containers (see module docstring).

        On any failure the instances this call created are destroyed and
        :class:`al.AllocateError` is raised (the caller marks the pod failed).
        """
        plan = plan_mig(pod, requests, self.profiles)
        created: list[MigInstance] = []
        realized: dict[tuple[int, int], MigInstance] = {}
        with self.lock:
            try:
                refs = references(self.kube.pods_on_node(self.node))
                for c in plan.containers:
                    for a in c.allocations:
                        taken = refs.held_by_others(a.gpu_uuid, a.placement, pod.uid)
                        if taken:
                            raise al.AllocateError(
                                f"{a.gpu_uuid}: placement {a.placement.start}+"
                                f"{a.placement.size} for {a.profile} is reserved by live pod "
                                f"{taken[0].owner[1]}")
                for c in plan.containers:
                    for a in c.allocations:
                        realized[(a.container_index, a.device_index)] = self._realize(
                            pod, a, created)
                self._write_back(pod, plan, realized)
            except (MigDriverError, KubeError, CodecError, al.AllocateError) as exc:
                self._rollback(created)
                raise al.AllocateError(str(exc)) from None
        envs = tuple({"NVIDIA_VISIBLE_DEVICES": ",".join(
            realized[(a.container_index, a.device_index)].mig_uuid for a in c.allocations)}
            for c in plan.containers)
        return MigResult(envs, plan.complete)

    def _realize(self, pod: al.PodView, a: MigAllocation,
                 created: list[MigInstance]) -> MigInstance:
        slices = profile_slices(a.profile)
        if slices is None:
            raise al.AllocateError(f"MIG profile {a.profile!r} is not <N>g.<name>")
        for attempt in range(2):
            existing = self.driver.instances(a.gpu_uuid)
            same = [i for i in existing if i.placement == a.placement and i.slices == slices
                    and i.mig_uuid]
            if a.runtime is not None:
                same = [i for i in same if i.gpu_instance_id == a.runtime.gpu_instance_id] or same
            if same:
                log.info("%s/%s: reusing GPU instance %d at %d+%d on %s", pod.namespace, pod.name,
                         same[0].gpu_instance_id, a.placement.start, a.placement.size, a.gpu_uuid)
                return same[0]
            half = [i for i in existing if i.placement == a.placement and i.slices == slices
                    and not i.mig_uuid]
            if half:  # a GPU instance without its compute instance (interrupted create)
                with self.applying():
                    for i in half:
                        self.driver.destroy(i.gpu_uuid, i.gpu_instance_id)
                existing = [i for i in existing if i not in half]
            blocking = [i for i in existing if i.placement.overlaps(a.placement)]
            if not blocking:
                with self.applying():
                    inst = self.driver.create(a.gpu_uuid, slices, a.placement)
                created.append(inst)
                log.info("%s/%s: created %s GPU instance %d / compute instance %d at %d+%d on %s "
                         "-> %s", pod.namespace, pod.name, a.profile, inst.gpu_instance_id,
                         inst.compute_instance_id, a.placement.start, a.placement.size,
                         a.gpu_uuid, inst.mig_uuid)
                return inst
            if attempt == 0:
                # Orphans of deleted pods may still sit there: one reconciler pass first.
                self.reconcile()
        raise MigDriverError(
            f"{a.gpu_uuid}: placement {a.placement.start}+{a.placement.size} for {a.profile} "
            f"overlaps GPU instance(s) {[i.gpu_instance_id for i in blocking]} that live pods use")

    def _write_back(self, pod: al.PodView, plan: MigPlan,
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
                al.DEVICES_TO_ALLOCATE: to_allocate,
            }
            if plan.complete:
                update[al.BIND_PHASE] = "success"
            try:
                self.kube.patch_pod_annotations(current.namespace, current.name, update,
                                                resource_version=current.resource_version or None)
                return
            except KubeError as exc:
                if exc.code != 409 or attempt == self.patch_attempts - 1:
                    raise
            fresh = self.kube.get_pod(pod.namespace, pod.name)
            if fresh is None or fresh.uid != pod.uid:
                raise KubeError(f"{pod.namespace}/{pod.name} is gone", 404)
            entries = list(al.decode_entries(fresh))
            for c in plan.containers:
                if not entries[c.entry_index:c.entry_index + 1] or not entries[c.entry_index]:
                    raise al.AllocateError(f"{pod.namespace}/{pod.name}: container entry "
                                           f"{c.entry_index} changed while allocating")
                entries[c.entry_index] = ()
            to_allocate = encode_pod_devices(tuple(entries))
            current = fresh

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
            doomed: list[MigInstance] = []
            for gpu in self.profiles:
                try:
                    instances = self.driver.instances(gpu)
                except MigDriverError as exc:
                    log.error("MIG reconcile: cannot list instances of %s: %s", gpu, exc)
                    continue
                for inst in instances:
                    (result.kept if refs.keeps(inst) else doomed).append(inst)
            if doomed:
                with self.applying():
                    for inst in doomed:
                        try:
                            self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
                            result.destroyed.append(inst)
                            log.info("MIG reconcile: destroyed unreferenced GPU instance %d "
                                     "(%d+%d) on %s", inst.gpu_instance_id, inst.placement.start,
                                     inst.placement.size, inst.gpu_uuid)
                        except MigDriverError as exc:
                            log.error("MIG reconcile: destroy %d on %s failed: %s",
                                      inst.gpu_instance_id, inst.gpu_uuid, exc)
        return result

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
