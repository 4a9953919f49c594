"""DRA claims' shared regions: finding, attributing and reading them (DRA mode).

In DRA mode ``hami dra-plugin`` prepares one cache directory per ResourceClaim instead
of one per container (:mod:`hami.dra.cdi`):

* ``$HOOK_PATH/claims/<claimUID>/<uuid4>.cache``: the region libvgpu shares between the
  processes of every container that uses the claim (the directory is mounted read-write
  into them, so its content is hostile input, read exactly as a container's cache file:
  :mod:`hami.monitor.lister`);
* ``$HOOK_PATH/claims/<claimUID>.plugin/owner.json``: the owner record the plugin writes
  at every prepare (no container sees this directory): the claim's namespace, name and
  UID, the UUIDs of the GPUs it was allocated, and the pods of its
  ``status.reservedFor`` with the containers that use it.

Attribution comes from the record and the node's pod list, never from the region: a
claim is reported under the first pod of its record that is on this node (same UID,
namespace and name) and not finished, labelled with those of its containers that are
running (names joined with ``,`` when several share the claim); a region's device is
reported only when its UUID is one of the claim's GPUs. A claim shared by several pods
is one region, reported once. A missing, oversized or malformed record, or one naming
another claim, gives the claim no series (logged once per distinct error). The monitor
never removes claim directories: ``NodeUnprepareResources`` does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami.api import names
from hami.deviceplugin.allocate import PodView
from hami.monitor.lister import CacheError, CacheFile, open_cache_in, open_regular
from hami.monitor.pods import container_running, granted_priority, pod_finished, task_priority
from hami.monitor.region import Region, RegionError

log = logging.getLogger(__name__)

#: Largest owner record read (bytes); a larger file is refused.
MAX_OWNER_BYTES = 64 * 1024
#: Owner record layout this monitor reads (``hami.dra.cdi.OWNER_VERSION``).
OWNER_VERSION = 1
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


class OwnerError(ValueError):
    """The owner record is missing, too large or malformed (the claim has no series)."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """One pod of the record: ``containers`` use the claim (init containers first)."""

    namespace: str
    name: str
    uid: str
    containers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimOwner:
    """A parsed owner record: ``uuids`` the claim's GPUs in allocation order."""

    claim_uid: str
    namespace: str
    name: str
    uuids: tuple[str, ...]
    pods: tuple[PodRef, ...]


def _str(doc: Mapping[str, Any], key: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v or len(v) > 253:
        raise OwnerError(f"{key}: not a non-empty string")
    return v


def parse_owner(raw: bytes, claim_uid: str) -> ClaimOwner:
    """Parse ``owner.json`` of the claim ``claim_uid``.

    Raises:
        OwnerError: too large, not JSON, another layout version, a missing or mistyped
            field, or a record of another claim.
    """
    if len(raw) > MAX_OWNER_BYTES:
        raise OwnerError(f"record larger than {MAX_OWNER_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise OwnerError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != OWNER_VERSION:
        raise OwnerError(f"not an owner record of version {OWNER_VERSION}")
    claim, uuids, pods = doc.get("claim"), doc.get("uuids"), doc.get("pods")
    if not isinstance(claim, dict) or not isinstance(uuids, list) or not isinstance(pods, list):
        raise OwnerError("claim, uuids or pods missing")
    if _str(claim, "uid") != claim_uid:
        raise OwnerError(f"record of claim {claim.get('uid')!r}, not {claim_uid!r}")
    if not all(isinstance(u, str) and u for u in uuids):
        raise OwnerError("uuids: not a list of strings")
    refs = []
    for p in pods:
        if not isinstance(p, dict):
            raise OwnerError("pods: not a list of objects")
        ctrs = p.get("containers")
        if not isinstance(ctrs, list) or not all(isinstance(c, str) and c for c in ctrs):
            raise OwnerError("pods[].containers: not a list of names")
        refs.append(PodRef(_str(p, "namespace"), _str(p, "name"), _str(p, "uid"), tuple(ctrs)))
    return ClaimOwner(claim_uid, _str(claim, "namespace"), _str(claim, "name"), tuple(uuids),
                      tuple(refs))


def read_owner(root_fd: int, claim_uid: str) -> ClaimOwner:
    """Read ``<claim_uid>.plugin/owner.json`` below the directory ``root_fd`` without
    following symlinks (a regular file only, at most :data:`MAX_OWNER_BYTES`).
    Raises :class:`OwnerError`."""
    try:
        dfd = os.open(f"{claim_uid}.plugin", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                      | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError as exc:
        raise OwnerError(f"{claim_uid}.plugin: {exc}") from None
    try:
        fd = open_regular(dfd, names.DRA_OWNER_FILE)
    except RegionError as exc:
        raise OwnerError(str(exc)) from None
    finally:
        os.close(dfd)
    try:
        raw = os.pread(fd, MAX_OWNER_BYTES + 1, 0)
    except OSError as exc:
        raise OwnerError(f"{names.DRA_OWNER_FILE}: {exc}") from None
    finally:
        os.close(fd)
    return parse_owner(raw, claim_uid)


def open_claim_cache(root_fd: int, root: Path, claim_uid: str) -> CacheFile | None:
    """Open the cache file in ``<root>/<claim_uid>/`` (HAMi's choice among its entries,
    :func:`~hami.monitor.lister.pick_cache_file`); None when there is none yet.
    Raises :class:`CacheError` / :class:`RegionError`."""
    try:
        dfd = os.open(claim_uid, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=root_fd)
    except OSError as exc:
        raise CacheError(f"{claim_uid}: {exc}") from None
    return open_cache_in(dfd, claim_uid, "", "", root / claim_uid, label=claim_uid)


@dataclass
class ClaimLister:
    """The loaded regions of the node's prepared claims. ``root`` is ``$HOOK_PATH/claims``;
    ``claims``: claim UID -> (open cache file, owner record); ``owners``: claim UID ->
    owner record of every claim of the last :meth:`update` whose record is good, with or
    without a usable region (the feedback loop writes their feedback files)."""

    root: Path
    claims: dict[str, tuple[CacheFile, ClaimOwner]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    errors: dict[str, str] = field(default_factory=dict)
    read_errors_total: int = 0
    owners: dict[str, ClaimOwner] = field(default_factory=dict)

    def _note(self, uid: str, exc: Exception) -> None:
        if self.errors.get(uid) != str(exc):
            log.warning("skipping claim %s: %s", uid, exc)
        self.errors[uid] = str(exc)

    def update(self) -> None:
        """One scan: (re)open each claim's cache file and reread its owner record."""
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.close()  # no claims directory: no DRA claims on this node
            return
        seen = set()
        owners: dict[str, ClaimOwner] = {}
        try:
            with self.lock:
                for e in os.scandir(root_fd):
                    if not _UID.match(e.name) or not e.is_dir(follow_symlinks=False):
                        continue
                    seen.add(e.name)
                    loaded = self.claims.get(e.name)
                    try:
                        owner = read_owner(root_fd, e.name)
                        owners[e.name] = owner
                        if loaded is not None and loaded[0].same_file():
                            self.claims[e.name] = (loaded[0], owner)
                        else:
                            self._forget(e.name)
                            cf = open_claim_cache(root_fd, self.root, e.name)
                            if cf is not None:
                                self.claims[e.name] = (cf, owner)
                    except (OwnerError, CacheError, RegionError) as exc:
                        self._forget(e.name)
                        self._note(e.name, exc)
                        continue
                    self.errors.pop(e.name, None)
                for uid in [u for u in self.claims if u not in seen]:
                    self._forget(uid)
                self.owners = owners
        except OSError as exc:
            log.warning("cannot list %s: %s", self.root, exc)
        finally:
            os.close(root_fd)

    def _forget(self, uid: str) -> None:
        entry = self.claims.pop(uid, None)
        if entry is not None:
            entry[0].close()

    def read_all(self) -> dict[str, tuple[CacheFile, Region, ClaimOwner]]:
        """Parse every loaded region; a corrupt or truncated one is left out this time
        (counted in ``read_errors_total``, logged once per distinct error)."""
        out = {}
        with self.lock:
            for uid, (cf, owner) in list(self.claims.items()):
                try:
                    out[uid] = (cf, cf.read(), owner)
                except RegionError as exc:
                    self.read_errors_total += 1
                    self._note(uid, exc)
        return out

    def close(self) -> None:
        with self.lock:
            for uid in list(self.claims):
                self._forget(uid)


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """Whom a claim's region is reported under: ``pod``, its running ``containers`` that
    use the claim, the claim's GPU ``uuids`` and the ``priority`` of the first container
    (``CUDA_TASK_PRIORITY`` of its spec)."""

    pod: PodView
    containers: tuple[str, ...]
    uuids: tuple[str, ...]
    priority: int

    @property
    def container_label(self) -> str:
        """The ``container`` label: the containers' names joined with ``,``."""
        return ",".join(self.containers)


def attribute(owner: ClaimOwner, pods: Sequence[PodView],
              high_priority_namespaces: AbstractSet[str] | None = None) -> ClaimUse | None:
    """The first pod of ``owner.pods`` among ``pods`` (this node's pods: same UID,
    namespace and name), not finished, with a running container that uses the claim;
    None when there is none (the claim then has no series). Priority 0 only where
    granted (:func:`hami.monitor.pods.granted_priority`)."""
    by_uid = {p.uid: p for p in pods}
    for ref in owner.pods:
        pod = by_uid.get(ref.uid)
        if pod is None or (pod.namespace, pod.name) != (ref.namespace, ref.name):
            continue
        if pod_finished(pod):
            continue
        envs = {c.name: c.env for c in pod.containers}
        running = tuple(c for c in ref.containers if c in envs and container_running(pod, c))
        if not running:
            continue
        prio = granted_priority(task_priority(envs[running[0]].get(names.ENV_TASK_PRIORITY)),
                                pod.namespace, high_priority_namespaces)
        return ClaimUse(pod, running, owner.uuids, prio)
    return None


def claim_key(claim_uid: str) -> str:
    """The feedback loop's key of a claim's region (never a ``<podUID>_<ctr>`` key)."""
    return f"claim:{claim_uid}"

