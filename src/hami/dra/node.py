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
from hami.core.model import DeviceInfo
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import DiscoveryError, GpuBackend
from hami.deviceplugin.register import node_devices
from hami.dra import slices
from hami.dra.kubeletplugin import DraNode, PluginPaths, serve

log = logging.getLogger(__name__)


class SlicePublisher:
    """Keeps ``<node>-gpu.hami.io`` equal to :func:`hami.dra.slices.resource_slice`
    (lightkube ``client``; the slice is owned by the Node object)."""

    def __init__(self, client: Any, node: str) -> None:
        self.client = client
        self.node = node
        self.generation = 0
        self._node_uid = ""
        #: The slice as last read or written (None: read it on the next sync).
        self._known: dict[str, Any] | None = None

    def invalidate(self) -> None:
        """Forget the remembered slice: the next :meth:`sync` reads it from the apiserver."""
        self._known = None

    def _current(self) -> tuple[dict[str, Any] | None, str]:
        from lightkube import ApiError
        from lightkube.resources.resource_v1 import ResourceSlice

        try:
            obj = self.client.get(ResourceSlice, slices.slice_name(self.node))
        except ApiError as exc:
            if exc.status.code == 404:
                return None, ""
            raise
        doc = obj.to_dict()
        return doc, str(doc["metadata"].get("resourceVersion") or "")

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
        """Create or replace the slice when it differs; True when it wrote. ``cordoned``:
        UUIDs to taint like unhealthy cards (:meth:`cordoned`). ``node_uid``: the Node's
        UID (the slice's owner) when the caller knows it (:class:`NodeCordonWatch`); None
        reads the Node once. The slice this publisher last read or wrote is remembered:
        when the wanted one equals it nothing is requested, and a change is one replace
        at its resourceVersion (a conflict or a deleted slice: read it, then write).
        :meth:`invalidate` forces a read. Raises lightkube's ``ApiError`` or
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
                log.info("ResourceSlice %s changed or deleted meanwhile; reading it",
                         slices.slice_name(self.node))
        self._known = None
        return self._write(self._current()[0], devices, cordoned)

    def _write(self, current: Mapping[str, Any] | None, devices: Sequence[DeviceInfo],
               cordoned: frozenset[str]) -> bool:
        from lightkube import codecs

        if current is not None:
            self.generation = max(self.generation,
                                  int((current["spec"].get("pool") or {}).get("generation") or 0))
        wanted = slices.resource_slice(self.node, devices, generation=self.generation + 1,
                                       cordoned=cordoned,
                                       owner={"name": self.node, "uid": self._node_uid})
        if not slices.slice_changed(current, wanted):
            self._known = dict(current) if current is not None else None
            return False
        if current is None:
            written = self.client.create(codecs.from_dict(wanted))
        else:
            wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            written = self.client.replace(codecs.from_dict(wanted))
        self._known = written.to_dict()
        self.generation += 1
        log.info("published ResourceSlice %s generation %d (%d GPUs)",
                 slices.slice_name(self.node), self.generation, len(wanted["spec"]["devices"]))
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

    def devices(self) -> tuple[DeviceInfo, ...]:
        """The registered cards now (:func:`hami.deviceplugin.register.node_devices`)."""
        return node_devices(self.backend.devices(), self.cfg, self.unhealthy)

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


def run_agent(agent: DraAgent, paths: PluginPaths, settings: NodeSettings, *,
              stop: threading.Event, publish_interval_s: float = 10.0,
              kubelet_plugin: bool = True, install_signals: bool = False) -> None:
    """Publish the slice and (with ``kubelet_plugin``) serve the kubelet plugin sockets
    until ``stop`` is set (SIGTERM/SIGINT set it with ``install_signals``)."""
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
                       paths.cdi_dir, agent.get_pod)
        server, _ = serve(node, paths)
        log.info("DRA plugin listening on %s (registration %s)", paths.dra_socket,
                 paths.registration_socket)
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
