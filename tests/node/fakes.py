"""Test doubles: an in-memory Kubernetes API (same interface as KubeApi) and a fake kubelet
(a real gRPC Registration server on a unix socket that dials the plugin back)."""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from hami.deviceplugin.allocate import VGPU_NODE, PodView
from hami.deviceplugin.kube import KubeApi, KubeError
from hami.deviceplugin.v1beta1 import api_pb2 as pb
from hami.deviceplugin.v1beta1 import api_pb2_grpc as pbg


class FakeKube(KubeApi):
    """Pods and node annotations in memory; resourceVersion CAS on node patches."""

    def __init__(self) -> None:
        super().__init__(client=None)
        self.pods: dict[tuple[str, str], PodView] = {}
        self.nodes: dict[str, tuple[dict[str, str], int]] = {}
        #: ``status.nodeInfo`` (runtime version, kubelet version) of nodes that have one.
        self.node_info: dict[str, tuple[str, str]] = {}
        self.calls: list[str] = []
        self.fail_pod_patch = False
        self.conflicts = 0
        self.lock = threading.Lock()

    def add_node(self, name: str, annotations: dict[str, str] | None = None) -> None:
        self.nodes[name] = (dict(annotations or {}), 1)

    def add_pod(self, p: PodView) -> None:
        if not p.resource_version:
            p = replace(p, resource_version="1")
        self.pods[(p.namespace, p.name)] = p

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            self.pods.pop((namespace, name), None)

    def get_node_annotations(self, node: str) -> tuple[dict[str, str], str]:
        with self.lock:
            self.calls.append("get_node")
            if node not in self.nodes:
                raise KubeError(f"node {node} not found", 404)
            ann, rv = self.nodes[node]
            return dict(ann), str(rv)

    def node_versions(self, node: str) -> tuple[str, str]:
        with self.lock:
            self.calls.append("get_node")
            if node not in self.nodes:
                raise KubeError(f"node {node} not found", 404)
            return self.node_info.get(node, ("", ""))

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        with self.lock:
            self.calls.append("get_pod")
            return self.pods.get((namespace, name))

    def pods_on_node(self, node: str) -> list[PodView]:
        with self.lock:
            self.calls.append("list_pods")
            return [p for p in self.pods.values() if p.node_name == node]

    def pending_pods_on_node(self, node: str) -> list[PodView]:
        with self.lock:
            self.calls.append("list_pods")
            return [p for p in self.pods.values() if p.node_name == node and p.phase == "Pending"]

    def pods_labelled_for(self, node: str) -> list[PodView]:
        with self.lock:
            return [p for p in self.pods.values() if p.annotations.get(VGPU_NODE) == node]

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Any,
                              resource_version: str | None = None) -> PodView:
        with self.lock:
            self.calls.append("patch_pod")
            if self.fail_pod_patch:
                raise KubeError("injected failure", 500)
            p = self.pods.get((namespace, name))
            if p is None:
                raise KubeError("pod not found", 404)
            if resource_version and resource_version != p.resource_version:
                self.conflicts += 1
                raise KubeError("conflict: the object has been modified", 409)
            ann = dict(p.annotations)
            for k, v in annotations.items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v
            labels = dict(p.labels)
            if VGPU_NODE in annotations and annotations[VGPU_NODE] is not None:
                labels[VGPU_NODE] = annotations[VGPU_NODE]
            p = replace(p, annotations=ann, labels=labels,
                        resource_version=str(int(p.resource_version or "0") + 1))
            self.pods[(namespace, name)] = p
            return copy.deepcopy(p)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self.nodes.pop(name, None)

    def patch_node_annotations(self, node: str, annotations: Any,
                               resource_version: str | None = None
                               ) -> tuple[dict[str, str], str]:
        with self.lock:
            self.calls.append("patch_node")
            if node not in self.nodes:  # the API server: a merge patch of a missing object
                raise KubeError(f'nodes "{node}" not found', 404)
            ann, rv = self.nodes[node]
            if resource_version and resource_version != str(rv):
                raise KubeError("conflict", 409)
            ann = dict(ann)
            for k, v in annotations.items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v
            self.nodes[node] = (ann, rv + 1)
            return dict(ann), str(rv + 1)


class FakeKubelet(pbg.RegistrationServicer):
    """Kubelet side of the device plugin API: serves Registration on ``kubelet.sock``,
    then, like the kubelet's device manager, dials ``<dir>/<endpoint>``, reads
    ListAndWatch in a thread, and offers GetPreferredAllocation/Allocate calls."""

    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.registrations: list[pb.RegisterRequest] = []
        self.lists: queue.Queue[list[tuple[str, str]]] = queue.Queue()
        self.latest: list[tuple[str, str]] = []
        self.server: grpc.Server | None = None
        self.channel: grpc.Channel | None = None
        self.stub: pbg.DevicePluginStub | None = None
        self._registered = threading.Event()

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.server is not None:
            self.server.stop(grace=0).wait()

    def restart(self, wipe: bool = True) -> None:
        """What a kubelet restart looks like to plugins: socket recreated (and the
        kubelet deletes the other sockets of the directory)."""
        self.stop()
        self._registered.clear()
        if wipe:
            for p in self.dir.glob("*.sock"):
                p.unlink()
        self.start()

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.registrations.append(request)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        self.stub = pbg.DevicePluginStub(self.channel)
        threading.Thread(target=self._watch, args=(self.stub,), daemon=True).start()
        self._registered.set()
        return pb.Empty()

    def _watch(self, stub: pbg.DevicePluginStub) -> None:
        try:
            for resp in stub.ListAndWatch(pb.Empty()):
                devs = [(d.ID, d.health) for d in resp.devices]
                self.latest = devs
                self.lists.put(devs)
        except grpc.RpcError:
            return

    def wait_registered(self, timeout_s: float = 10.0) -> pb.RegisterRequest:
        assert self._registered.wait(timeout_s), "plugin never registered"
        return self.registrations[-1]

    def wait_list(self, pred: Callable[[list[tuple[str, str]]], bool],
                  timeout_s: float = 10.0) -> list[tuple[str, str]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                devs = self.lists.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if pred(devs):
                return devs
        raise AssertionError(f"no matching ListAndWatch response; latest {self.latest[:4]}...")

    def options(self) -> pb.DevicePluginOptions:
        assert self.stub is not None
        return self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)

    def preferred(self, available: list[str], size: int, must: list[str] | None = None
                  ) -> list[str]:
        assert self.stub is not None
        resp = self.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                                   must_include_deviceIDs=must or [],
                                                   allocation_size=size)]), timeout=10)
        return list(resp.container_responses[0].deviceIDs)

    def allocate(self, *containers: list[str]) -> pb.AllocateResponse:
        assert self.stub is not None
        return self.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]), timeout=10)

    def prestart(self) -> pb.PreStartContainerResponse:
        assert self.stub is not None
        return self.stub.PreStartContainer(pb.PreStartContainerRequest(), timeout=5)
