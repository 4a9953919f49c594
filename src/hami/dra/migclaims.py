"""MIG instances for DRA claims: ``NodePrepareResources`` of a MIG partition device.

kube-scheduler allocates a MIG-mode card's instance devices (:mod:`hami.dra.migslices`,
``gpu-<index>-<profile>-<start>``) by their memory-slice counters, so two claims never
hold overlapping placements. Preparing such a claim creates the GPU instance (and its
full compute instance) of that profile at that placement through the device plugin's
MIG driver (:class:`hami.deviceplugin.migdriver.MigDriver`: NVML, or the fake
inventory's table), and the CDI spec gives the containers ``NVIDIA_VISIBLE_DEVICES=<MIG
UUID>`` only (no libvgpu, as the device plugin's MIG Allocate). Unprepare destroys it.

Which claim holds which instance is recorded in the claim's plugin-private directory
(``<H>/vgpu/claims/<claimUID>.plugin/mig.json``: GPU UUID, GPU instance id, slices,
placement, MIG UUID), written after the instances exist. Preparing again returns the
recorded instances while they still exist (the kubelet retries); an instance another
claim's record names is never reused or destroyed (the claim fails with an error
instead); an unrecorded instance at the placement (left by a crash, or by the device
plugin) is adopted when it has the same profile, destroyed when it only overlaps.
Creates and destroys hold the device plugin's apply lock file, which registration and the
monitor's feedback honour.

The record also names the claim (namespace, name). An instance whose claim is never
unprepared (the kubelet lost it, the plugin was down when the pod went) would stay for
ever: :meth:`ClaimMig.stale_claims` finds the recorded claims whose ResourceClaim has
been gone from the API (absent, or its name now held by another UID) for a grace
period, and the kubelet plugin unprepares them (:meth:`hami.dra.kubeletplugin.DraNode.sweep`,
run by the node agent every 30 s, grace 60 s). A claim that exists is never
swept, whatever its state (the API keeps a claim while pods reserve it); a record
without a claim name (older records) or whose claim cannot be read is kept. The same
sweep destroys an instance no record has named for the grace period
(:meth:`ClaimMig.sweep_orphans`): one created just before a crash, before its record
was written, for a claim that is then never prepared again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami.core.model import DeviceInfo, MigPlacement
from hami.deviceplugin.mig import DEFAULT_APPLY_LOCK
from hami.deviceplugin.migdriver import MigDriver, MigDriverError, MigInstance
from hami.dra import cdi
from hami.dra.migslices import instance_name
from hami.dra.slices import DRIVER

log = logging.getLogger(__name__)

#: The claim's record of its instances, in its plugin-private directory.
RECORD_FILE = "mig.json"


@dataclass(frozen=True, slots=True)
class MigTarget:
    """What a MIG instance device stands for: ``profile`` (``1g.5gb``) with ``slices``
    compute slices at ``placement`` on the card ``gpu_uuid``."""

    gpu_uuid: str
    profile: str
    slices: int
    placement: MigPlacement


@dataclass(frozen=True, slots=True)
class MigResult:
    """One allocation result of the claim on a MIG instance device."""

    request: str
    pool: str
    device: str
    share_id: str | None


def mig_targets(devices: Sequence[DeviceInfo]) -> dict[str, MigTarget]:
    """Instance device name -> :class:`MigTarget` for every allowed profile and placement
    of the registered MIG cards (the names :mod:`hami.dra.migslices` publishes). Pure."""
    out = {}
    for d in devices:
        for prof in d.mig_profiles:
            for place in prof.placements:
                out[instance_name(d.index, prof.name, place.start)] = MigTarget(
                    d.uuid, prof.name, prof.slice_count, place)
    return out


def mig_results(claim: Mapping[str, Any], node: str,
                targets: Mapping[str, MigTarget]) -> list[MigResult]:
    """The claim's results (our driver) on MIG instance devices, allocation order; []
    when it holds none. Pure.

    Raises:
        cdi.ClaimError: a MIG result is in another node's pool, or the claim holds MIG
            instances and shared cards together.
    """
    status = claim.get("status") if isinstance(claim, Mapping) else None
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    ours = [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER] \
        if isinstance(results, list) else []
    out = []
    for r in ours:
        if str(r.get("device")) not in targets:
            continue
        if r.get("pool") != node:
            raise cdi.ClaimError(f"MIG device {r.get('device')}: pool {r.get('pool')!r} is "
                                 f"not this node {node!r}")
        share = r.get("shareID")
        out.append(MigResult(str(r.get("request") or ""), node, str(r.get("device")),
                             str(share) if share else None))
    if out and len(out) != len(ours):
        raise cdi.ClaimError("claim holds MIG instances and shared cards together; "
                             "ask for them in separate claims")
    return out


def mig_cdi_spec(claim_uid: str, mig_uuids: Sequence[str]) -> dict[str, Any]:
    """The claim's CDI spec: ``NVIDIA_VISIBLE_DEVICES`` = the MIG UUIDs, nothing else."""
    from hami.deviceplugin.allocate import ContainerPlan

    plan = ContainerPlan(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(mig_uuids)}, mounts=(),
                         host_dirs=(), entry_index=0, container_name="claim", devices=())
    return cdi.cdi_spec(claim_uid, plan)


def _row(inst: MigInstance, claim: tuple[str, str] | None = None) -> dict[str, Any]:
    row = {"gpu_uuid": inst.gpu_uuid, "gpu_instance_id": inst.gpu_instance_id,
           "slices": inst.slices, "start": inst.placement.start, "size": inst.placement.size,
           "mig_uuid": inst.mig_uuid}
    if claim is not None:
        row["namespace"], row["name"] = claim
    return row


def _same(inst: MigInstance, row: Mapping[str, Any]) -> bool:
    return (inst.gpu_uuid == row.get("gpu_uuid") and inst.gpu_instance_id == row.get(
        "gpu_instance_id") and inst.placement == MigPlacement(int(row.get("start", -1)),
                                                              int(row.get("size", -1))))


class ClaimMig:
    """Creates, finds and destroys the MIG instances of this node's claims (module
    docstring). ``targets`` returns :func:`mig_targets` of the node's cards now;
    ``hook_path`` is the host directory holding ``vgpu/``. Not thread-safe: the kubelet
    plugin calls it under its lock."""

    def __init__(self, driver: MigDriver, targets: Callable[[], Mapping[str, MigTarget]],
                 hook_path: str, apply_lock: Path = DEFAULT_APPLY_LOCK) -> None:
        self.driver = driver
        self.targets = targets
        self.hook_path = hook_path
        self.apply_lock = apply_lock
        #: claim UID -> when its ResourceClaim was first seen gone (monotonic seconds).
        self._gone_since: dict[str, float] = {}
        #: (GPU UUID, GPU instance id, start) of an instance no record names -> when a
        #: sweep first saw it so (monotonic seconds).
        self._orphan_since: dict[tuple[str, int, int], float] = {}

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        self.apply_lock.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.apply_lock, os.O_CREAT | os.O_WRONLY, 0o644))
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.apply_lock.unlink()

    def _record_path(self, claim_uid: str) -> Path:
        return Path(cdi.claim_dirs(self.hook_path, claim_uid)[1]) / RECORD_FILE

    @staticmethod
    def _read(path: Path) -> list[dict[str, Any]] | None:
        try:
            rows = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable MIG record %s: %s", path, exc)
            return None
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None

    def held(self, but: str = "") -> dict[tuple[str, int], str]:
        """``(GPU UUID, GPU instance id)`` -> claim UID of every recorded instance (the
        claim ``but`` left out)."""
        base = Path(cdi.claim_dirs(self.hook_path, "x")[0]).parent
        out = {}
        for path in base.glob(f"*.plugin/{RECORD_FILE}") if base.is_dir() else ():
            uid = path.parent.name.removesuffix(".plugin")
            if uid == but:
                continue
            for row in self._read(path) or ():
                out[(str(row.get("gpu_uuid")), int(row.get("gpu_instance_id", -1)))] = uid
        return out

    def records(self) -> dict[str, tuple[str, str] | None]:
        """Claim UID -> ``(namespace, name)`` of every claim with a record (None: the
        record does not name its claim)."""
        base = Path(cdi.claim_dirs(self.hook_path, "x")[0]).parent
        out: dict[str, tuple[str, str] | None] = {}
        for path in base.glob(f"*.plugin/{RECORD_FILE}") if base.is_dir() else ():
            rows = self._read(path)
            if rows is None:
                continue
            named = [(str(r["namespace"]), str(r["name"])) for r in rows
                     if r.get("namespace") and r.get("name")]
            out[path.parent.name.removesuffix(".plugin")] = named[0] if named else None
        return out

    def stale_claims(self, claim_uid_of: Callable[[str, str], str | None], grace_s: float,
                     now: float) -> list[str]:
        """UIDs of recorded claims whose ResourceClaim has been gone for ``grace_s``
        seconds or more at ``now`` (monotonic seconds; gone since the first call that saw
        it gone). ``claim_uid_of(namespace, name)``: the UID of that claim now, None when
        it does not exist; an exception (API error) keeps the record as it is. A claim
        seen again is forgotten. Records without a claim name are never stale."""
        out = []
        recorded = self.records()
        for uid in [u for u in self._gone_since if u not in recorded]:
            del self._gone_since[uid]
        for uid, claim in sorted(recorded.items()):
            if claim is None:
                continue
            try:
                current = claim_uid_of(*claim)
            except Exception as exc:  # noqa: BLE001 - unknown: keep the instances
                log.warning("MIG sweep: cannot read claim %s/%s: %s", *claim, exc)
                continue
            if current == uid:
                self._gone_since.pop(uid, None)
                continue
            since = self._gone_since.setdefault(uid, now)
            if now - since >= grace_s:
                out.append(uid)
        return out

    def sweep_orphans(self, grace_s: float, now: float) -> list[MigInstance]:
        """Destroy the instances on this node's MIG cards that no claim's record has
        named for ``grace_s`` seconds at ``now`` (monotonic; since the first call that saw
        each unrecorded): an instance created just before a crash, whose record was
        never written, and whose claim is never prepared again. The caller holds the
        prepare lock, so no prepare is between its create and its record. Returns the
        instances destroyed; a driver error is logged and the instance kept.
        """
        held = self.held()
        gpus = sorted({t.gpu_uuid for t in self.targets().values()})
        seen: set[tuple[str, int, int]] = set()
        doomed = []
        for gpu in gpus:
            try:
                instances = self.driver.instances(gpu)
            except MigDriverError as exc:
                log.warning("MIG sweep: cannot list the instances of %s: %s", gpu, exc)
                continue
            for inst in instances:
                if (inst.gpu_uuid, inst.gpu_instance_id) in held:
                    continue
                key = (inst.gpu_uuid, inst.gpu_instance_id, inst.placement.start)
                seen.add(key)
                if now - self._orphan_since.setdefault(key, now) >= grace_s:
                    doomed.append(inst)
        for key in [k for k in self._orphan_since if k not in seen]:
            del self._orphan_since[key]
        out = []
        if doomed:
            with self._applying():
                for inst in doomed:
                    try:
                        self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
                    except MigDriverError as exc:
                        log.error("MIG sweep: cannot destroy unrecorded GPU instance %d on "
                                  "%s: %s", inst.gpu_instance_id, inst.gpu_uuid, exc)
                        continue
                    log.info("MIG sweep: destroyed GPU instance %d (%d+%d) on %s, which no "
                             "claim records", inst.gpu_instance_id, inst.placement.start,
                             inst.placement.size, inst.gpu_uuid)
                    self._orphan_since.pop((inst.gpu_uuid, inst.gpu_instance_id,
                                            inst.placement.start), None)
                    out.append(inst)
        return out

    def prepare(self, claim_uid: str, results: Sequence[MigResult],
                claim: tuple[str, str] | None = None) -> list[str]:
        """The MIG UUIDs for the claim's results (created, found or adopted), in order;
        the record is (re)written, naming ``claim`` (namespace, name) when given. On
        failure what this call created is destroyed.

        Raises:
            cdi.ClaimError: a device is not an instance of this node's cards, its
                placement is held by another claim's instance, or the driver refused.
        """
        targets = self.targets()
        wanted = []
        for r in results:
            if r.device not in targets:
                raise cdi.ClaimError(f"device {r.device} is not a MIG instance of this node")
            wanted.append(targets[r.device])
        recorded = self._read(self._record_path(claim_uid)) or []
        others = self.held(but=claim_uid)
        created: list[MigInstance] = []
        got: list[MigInstance] = []
        try:
            for t in wanted:
                got.append(self._realize(claim_uid, t, recorded, others, got, created))
        except MigDriverError as exc:
            self._destroy(created)
            raise cdi.ClaimError(str(exc)) from None
        except cdi.ClaimError:
            self._destroy(created)
            raise
        path = self._record_path(claim_uid)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([_row(i, claim) for i in got]))
        tmp.replace(path)
        return [i.mig_uuid for i in got]

    def _realize(self, claim_uid: str, t: MigTarget, recorded: Sequence[Mapping[str, Any]],
                 others: Mapping[tuple[str, int], str], taken: Sequence[MigInstance],
                 created: list[MigInstance]) -> MigInstance:
        existing = self.driver.instances(t.gpu_uuid)
        mine = [i for i in existing if i.placement == t.placement and i.slices == t.slices
                and i.mig_uuid and i not in taken
                and (i.gpu_uuid, i.gpu_instance_id) not in others]
        ours = [i for i in mine if any(_same(i, row) for row in recorded)]
        if ours or mine:
            inst = (ours or mine)[0]
            if not ours:
                log.info("claim %s: adopting unrecorded %s GPU instance %d at %d+%d on %s",
                         claim_uid, t.profile, inst.gpu_instance_id, t.placement.start,
                         t.placement.size, t.gpu_uuid)
            return inst
        blocking = [i for i in existing if i.placement.overlaps(t.placement)]
        held = [others[(i.gpu_uuid, i.gpu_instance_id)] for i in blocking
                if (i.gpu_uuid, i.gpu_instance_id) in others]
        if held or any(i in taken for i in blocking):
            raise cdi.ClaimError(
                f"{t.gpu_uuid}: placement {t.placement.start}+{t.placement.size} for "
                f"{t.profile} overlaps the MIG instance of claim {(held or [claim_uid])[0]}")
        with self._applying():
            for i in blocking:  # orphans: no claim records them
                log.info("claim %s: destroying unrecorded GPU instance %d (%d+%d) on %s",
                         claim_uid, i.gpu_instance_id, i.placement.start, i.placement.size,
                         i.gpu_uuid)
                self.driver.destroy(i.gpu_uuid, i.gpu_instance_id)
            inst = self.driver.create(t.gpu_uuid, t.slices, t.placement)
        created.append(inst)
        log.info("claim %s: created %s GPU instance %d at %d+%d on %s -> %s", claim_uid,
                 t.profile, inst.gpu_instance_id, t.placement.start, t.placement.size,
                 t.gpu_uuid, inst.mig_uuid)
        return inst

    def _destroy(self, instances: Sequence[MigInstance]) -> None:
        if not instances:
            return
        with self._applying():
            for inst in instances:
                try:
                    self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
                except MigDriverError as exc:
                    log.error("cannot destroy GPU instance %d on %s: %s",
                              inst.gpu_instance_id, inst.gpu_uuid, exc)

    def release(self, claim_uid: str) -> int:
        """Destroy the claim's recorded instances that still exist (same GPU instance id
        and placement) and drop the record; returns how many were destroyed (0 when none
        was recorded: unprepare is idempotent). Raises :class:`cdi.ClaimError` when the
        driver refuses (the record stays, the kubelet retries)."""
        path = self._record_path(claim_uid)
        rows = self._read(path)
        if not rows:
            path.unlink(missing_ok=True)
            return 0
        doomed = []
        try:
            for gpu in dict.fromkeys(str(r.get("gpu_uuid")) for r in rows):
                doomed += [i for i in self.driver.instances(gpu)
                           if any(_same(i, row) for row in rows)]
            with self._applying():
                for inst in doomed:
                    self.driver.destroy(inst.gpu_uuid, inst.gpu_instance_id)
        except MigDriverError as exc:
            raise cdi.ClaimError(f"cannot destroy the MIG instances of claim {claim_uid}: "
                                 f"{exc}") from None
        path.unlink(missing_ok=True)
        self._gone_since.pop(claim_uid, None)
        return len(doomed)
