"""The DRA node agent: publishes the node's ResourceSlice and serves the kubelet plugin.

``hami dra-plugin`` runs it on every GPU node that DRA mode manages (instead of
``hami device-plugin``: the two must not manage the same cards). The slice is rebuilt
from discovery and the node's ``hami.io/device-cordon`` annotation every
``publish_interval_s`` and written only when it changed (a new pool generation each
time). The Node is watched (:class:`NodeCordonWatch`), not read every interval: a
cordon change wakes the loop at once, as a health event does. The publisher remembers
the slice it wrote, so an idle node makes no request at all between full checks (a GET
of the slice every ``resync_s``, which catches a slice someone else changed or deleted).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami.core.fit import NodeOptions
from hami.core.model import DeviceInfo, MigProfile
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import DiscoveryError, GpuBackend
from hami.deviceplugin.register import node_devices
from hami.dra import slices
from hami.dra.kubeletplugin import DraNode, PluginPaths, serve
from hami.dra.migclaims import ClaimMig, mig_targets

log = logging.getLogger(__name__)


class SlicePublisher:
    """Keeps the node's slices (``<node>-gpu.hami.io``, and more for MIG cards) equal to
    :func:`hami.dra.slices.resource_slices` (lightkube ``client``; the slices are owned
    by the Node object)."""

    def __init__(self, client: Any, node: str) -> None:
        self.client = client
        self.node = node
        self.generation = 0
        self._node_uid = ""
        #: The slices as last read or written, by name (None: list them on the next sync).
        self._known: dict[str, dict[str, Any]] | None = None

    def invalidate(self) -> None:
        """Forget the remembered slice: the next :meth:`sync` reads it from the apiserver."""
        self._known = None

    def _current(self) -> dict[str, dict[str, Any]]:
        """This node's slices of the driver now, by name (a LIST with field selectors)."""
        from lightkube.resources.resource_v1 import ResourceSlice

        base = slices.slice_name(self.node)
        out = {}
        for obj in self.client.list(ResourceSlice, fields={"spec.nodeName": self.node,
                                                           "spec.driver": slices.DRIVER}):
            doc = obj.to_dict()
            name = str(doc["metadata"].get("name") or "")
            if name == base or name.startswith(base + "-"):
                out[name] = doc
        return out

    def cordoned(self) -> frozenset[str]:
        """UUIDs the node's ``hami.io/device-cordon`` annotation lists (HAMi's device
        cordon: comma list, trimmed; the same parse as the scheduler's Fit), read from the
        Node now (which also gives the slice owner's UID). Raises lightkube's ``ApiError``."""
        from lightkube.resources.core_v1 import Node

        node = self.client.get(Node, self.node)
        self._node_uid = str(node.metadata.uid or "")
        return NodeOptions.from_annotations(node.metadata.annotations or {}).cordoned

    def sync(self, devices: Sequence[DeviceInfo], cordoned: frozenset[str] = frozenset(),
             node_uid: str | None = None) -> bool:
        """Create or replace the node's slices (:func:`hami.dra.slices.resource_slices`;
        one unless cards are in MIG mode) when they differ (a slice no longer wanted is
        kept empty); True when it wrote. ``cordoned``:
        UUIDs to taint like unhealthy cards (:meth:`cordoned`). ``node_uid``: the Node's
        UID (the slice's owner) when the caller knows it (:class:`NodeCordonWatch`); None
        reads the Node once. The slices this publisher last read or wrote are remembered:
        when the wanted ones equal them nothing is requested, and a change is one replace
        per slice at its resourceVersion (a conflict or a deleted slice: list them, then
        write). :meth:`invalidate` forces a list. Raises lightkube's ``ApiError`` or
        :class:`hami.dra.slices.SliceError`."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        if node_uid and node_uid != self._node_uid:
            self._node_uid, self._known = node_uid, None  # a new Node: a new owner
        if not self._node_uid:
            self._node_uid = str(self.client.get(Node, self.node).metadata.uid or "")
        if self._known is not None:
            try:
                return self._write(self._known, devices, cordoned)
            except ApiError as exc:
                if exc.status.code not in (404, 409):
                    raise
                log.info("ResourceSlices of %s changed or deleted meanwhile; listing them",
                         self.node)
        self._known = None
        return self._write(self._current(), devices, cordoned)

    def _write(self, current: Mapping[str, Mapping[str, Any]], devices: Sequence[DeviceInfo],
               cordoned: frozenset[str]) -> bool:
        from lightkube import codecs

        for doc in current.values():
            self.generation = max(self.generation,
                                  int((doc["spec"].get("pool") or {}).get("generation") or 0))
        wanted = slices.resource_slices(self.node, devices, generation=self.generation + 1,
                                        cordoned=cordoned,
                                        owner={"name": self.node, "uid": self._node_uid})
        # Slices no longer wanted (fewer MIG cards) stay as empty slices of the pool: the
        # agent has no delete right; they go with the Node.
        stale = sorted(set(current) - {w["metadata"]["name"] for w in wanted})
        if stale:
            count = len(wanted) + len(stale)
            for w in wanted:
                w["spec"]["pool"]["resourceSliceCount"] = count
            wanted += [slices.empty_slice(self.node, name, generation=self.generation + 1,
                                          count=count, owner={"name": self.node,
                                                              "uid": self._node_uid})
                       for name in stale]
        names = [w["metadata"]["name"] for w in wanted]
        if set(current) == set(names) and not any(
                slices.slice_changed(current[n], w) for n, w in zip(names, wanted, strict=True)):
            self._known = {n: dict(d) for n, d in current.items()}
            return False
        # A change rewrites every slice of the pool at the next generation: the scheduler
        # uses only the slices of a pool's highest generation.
        written: dict[str, dict[str, Any]] = {}
        for name, doc in zip(names, wanted, strict=True):
            if name in current:
                doc["metadata"]["resourceVersion"] = current[name]["metadata"]["resourceVersion"]
                written[name] = self.client.replace(codecs.from_dict(doc)).to_dict()
            else:
                written[name] = self.client.create(codecs.from_dict(doc)).to_dict()
        self._known = written
        self.generation += 1
        log.info("published the ResourceSlices of %s, generation %d (%d devices in %d slices)",
                 self.node, self.generation,
                 sum(len(w["spec"].get("devices") or ()) for w in wanted), len(wanted))
        return True


class NodeCordonWatch:
    """A watched copy of one Node's UID and device cordon (the UUIDs of its
    ``hami.io/device-cordon`` annotation, :meth:`SlicePublisher.cordoned`'s parse).

    ``changed`` is called (from the watch thread) whenever either differs from the last
    copy, so a cordon change republishes at once. :meth:`get` is None until the first
    event and while the watch reconnects after an error (callers then read the Node). A
    watch silent past the client's idle deadline, or ended by the apiserver after
    ``server_timeout_s``, resumes from the last resourceVersion seen; BOOKMARK events only
    move that version. ``requests`` counts the watch requests made.
    """

    def __init__(self, client: Any, node: str, changed: Callable[[], None],
                 server_timeout_s: int = 60) -> None:
        self.client = client
        self.node = node
        self.changed = changed
        self.server_timeout_s = server_timeout_s
        self._value: tuple[str, frozenset[str]] | None = None
        self._lock = threading.Lock()
        self.requests = 0

    def get(self) -> tuple[str, frozenset[str]] | None:
        """``(node UID, cordoned UUIDs)`` as last seen; None while not known."""
        with self._lock:
            return self._value

    def _set(self, value: tuple[str, frozenset[str]] | None) -> None:
        with self._lock:
            old, self._value = self._value, value
        if value is not None and value != old:
            self.changed()

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop`` (a ``metadata.name`` field selector: this Node only)."""
        import httpx2
        from lightkube.resources.core_v1 import Node

        resume: str | None = None
        while not stop.is_set():
            try:
                self.requests += 1
                for kind, obj in self.client.watch(Node, fields={"metadata.name": self.node},
                                                   server_timeout=self.server_timeout_s,
                                                   resource_version=resume):
                    resume = (obj.metadata.resourceVersion if obj.metadata else None) or resume
                    if stop.is_set():
                        return
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        self._set(None)
                        continue
                    self._set((str(obj.metadata.uid or ""), NodeOptions.from_annotations(
                        obj.metadata.annotations or {}).cordoned))
            except httpx2.ReadTimeout:
                log.info("node watch %s silent past its idle deadline; resuming", self.node)
            except Exception as exc:  # noqa: BLE001 - reconnect; readers fall back to GET
                log.info("node watch %s restarting: %s", self.node, exc)
                resume = None  # 410 and the like: start over from the current Node
                self._set(None)
                stop.wait(1.0)


@dataclass
class DraAgent:
    """The node agent's parts (see :func:`run_agent`). ``unhealthy``: UUIDs the health
    loop marked down (NVML or fake XID events, the device plugin's rules); ``kick`` wakes
    the publish loop when it changes."""

    node: str
    backend: GpuBackend
    cfg: PluginConfig
    client: Any
    unhealthy: frozenset[str] = frozenset()
    kick: threading.Event = field(default_factory=threading.Event)
    #: The publish loop's Node watch (set by :meth:`publish_loop`).
    node_watch: NodeCordonWatch | None = None
    _mig: dict[str, tuple[int, tuple[MigProfile, ...]]] | None = None

    def devices(self) -> tuple[DeviceInfo, ...]:
        """The registered cards now (:func:`hami.deviceplugin.register.node_devices`). In
        ``mig`` mode each card's allowed MIG profiles (``migProfileAllowlist``) are read
        once from the MIG driver (:func:`hami.deviceplugin.mig.discover`) and kept."""
        gpus = self.backend.devices()
        if self.cfg.operating_mode != "mig":
            return node_devices(gpus, self.cfg, self.unhealthy)
        if self._mig is None:
            from hami.deviceplugin.mig import discover

            self._mig = discover(self.backend.mig_driver(), [(g.uuid, g.name) for g in gpus],
                                 self.cfg.mig_allowlist)
        return node_devices(gpus, self.cfg, self.unhealthy, self._mig)

    def health_loop(self, stop: threading.Event) -> None:
        """Mark cards unhealthy on health events until ``stop`` (the device plugin's
        :func:`hami.deviceplugin.service.health_loop`, rules from the environment)."""
        from hami.deviceplugin.health import policy_from_env
        from hami.deviceplugin.service import DeviceState, health_loop

        state = DeviceState(self.backend.devices(), self.cfg)

        def changed() -> None:
            self.unhealthy = frozenset(state.unhealthy)
            self.kick.set()

        health_loop(self.backend, state, policy_from_env(os.environ), changed, stop)

    def uuids(self) -> Mapping[str, str]:
        """Device name (``gpu-<index>``) -> GPU UUID of every registered card."""
        return {slices.device_name(d.index): d.uuid for d in self.devices()}

    def claim_mig(self, hook_path: str) -> ClaimMig | None:
        """The MIG instances of claims (:class:`hami.dra.migclaims.ClaimMig`) over the
        backend's MIG driver; None unless the node is in ``mig`` mode."""
        if self.cfg.operating_mode != "mig":
            return None
        return ClaimMig(self.backend.mig_driver(), lambda: mig_targets(self.devices()),
                        hook_path)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim as a dict, None when it does not exist."""
        from lightkube import ApiError
        from lightkube.resources.resource_v1 import ResourceClaim

        try:
            return dict(self.client.get(ResourceClaim, name, namespace=namespace).to_dict())
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as a dict, None when it does not exist."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return dict(self.client.get(Pod, name, namespace=namespace).to_dict())
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def publish_loop(self, stop: threading.Event, interval_s: float,
                     resync_s: float = 300.0) -> None:
        """Publish now and whenever the cards, their health or the node's cordon change
        (checked every ``interval_s``, at once on a health event or a Node watch event)
        until ``stop``. The slice is re-read from the apiserver every ``resync_s`` and
        after any error; errors are logged and retried."""
        publisher = SlicePublisher(self.client, self.node)
        watch = NodeCordonWatch(self.client, self.node, self.kick.set)
        self.node_watch = watch
        threading.Thread(target=watch.run, args=(stop,), name="node-watch",
                         daemon=True).start()
        resync_at = time.monotonic() + resync_s
        while not stop.is_set():
            if time.monotonic() >= resync_at:
                publisher.invalidate()
                resync_at = time.monotonic() + resync_s
            try:
                node = watch.get()
                if node is None:  # the watch has not (re)started yet: read the Node
                    cordoned = publisher.cordoned()
                    publisher.sync(self.devices(), cordoned)
                else:
                    publisher.sync(self.devices(), node[1], node_uid=node[0])
            except (DiscoveryError, slices.SliceError) as exc:
                log.error("cannot publish the ResourceSlice: %s", exc)
            except Exception as exc:  # noqa: BLE001 - API errors: retry next interval
                publisher.invalidate()
                log.warning("ResourceSlice update failed (retrying): %s", exc)
            self.kick.wait(interval_s)
            self.kick.clear()


def sweep_loop(node: DraNode, stop: threading.Event, interval_s: float = 30.0,
               grace_s: float = 60.0) -> None:
    """Every ``interval_s`` until ``stop``: :meth:`DraNode.sweep` (MIG instances of claims
    gone from the API for ``grace_s``; the device plugin's MIG manager has no DRA
    counterpart otherwise). Errors are logged and retried."""
    while not stop.wait(interval_s):
        try:
            node.sweep(grace_s)
        except Exception as exc:  # noqa: BLE001 - keep sweeping
            log.warning("MIG sweep failed (retrying): %s", exc)


def run_agent(agent: DraAgent, paths: PluginPaths, settings: NodeSettings, *,
              stop: threading.Event, publish_interval_s: float = 10.0,
              kubelet_plugin: bool = True, install_signals: bool = False,
              mig_sweep_interval_s: float = 30.0) -> None:
    """Publish the slice and (with ``kubelet_plugin``) serve the kubelet plugin sockets
    until ``stop`` is set (SIGTERM/SIGINT set it with ``install_signals``). On a MIG-mode
    node the plugin's MIG claims are swept every ``mig_sweep_interval_s`` (:func:`sweep_loop`)."""
    if install_signals:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = None
    health = threading.Thread(target=agent.health_loop, args=(stop,), name="health", daemon=True)
    health.start()

    def wake_on_stop() -> None:
        stop.wait()
        agent.kick.set()

    threading.Thread(target=wake_on_stop, name="wake", daemon=True).start()
    if kubelet_plugin:
        node = DraNode(agent.node, agent.get_claim, agent.uuids, agent.cfg, settings,
                       paths.cdi_dir, agent.get_pod, agent.claim_mig(settings.hook_path))
        server, _ = serve(node, paths)
        log.info("DRA plugin listening on %s (registration %s)", paths.dra_socket,
                 paths.registration_socket)
        if node.mig is not None:
            threading.Thread(target=sweep_loop, args=(node, stop, mig_sweep_interval_s),
                             name="mig-sweep", daemon=True).start()
    try:
        agent.publish_loop(stop, publish_interval_s)
    finally:
        if server is not None:
            server.stop(2).wait()
        stop.set()
        health.join(timeout=6)
        agent.backend.close()


def settings_for(hook_path: str, version: str) -> NodeSettings:
    """Allocate's host facts for ``hook_path`` (versioned lib and license files checked)."""
    vgpu = Path(hook_path) / "vgpu"
    return NodeSettings(hook_path=hook_path, version=version,
                        versioned_lib=(vgpu / f"libvgpu.so.{version}").exists(),
                        license=(vgpu / "license").exists())
