"""The device plugin's pod watch takes the real API server's BOOKMARK events in stride.

A Pod bookmark carries ``"spec": {"containers": null}``, which lightkube's typed Pod
refuses; the watch used to fail on every bookmark (about once per watch period: a
minute by default), drop its copy of the node's Pending pods and LIST again. Seen on the
real node (tests/realnode/): ``pod watch ... restarting: Expected `array`, got `null` -
at `$.spec.containers```.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from hami.testing.controlplane import ControlPlane, create_gpu_node, wait_until

pytestmark = pytest.mark.e2e


def test_device_plugin_pod_watch_keeps_its_pods_across_bookmarks(
        control_plane: ControlPlane, kube_client: Any) -> None:
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    from hami.deviceplugin.kube import PodWatch, make_client

    node = f"pw-{uuid.uuid4().hex[:6]}"
    create_gpu_node(kube_client, node, gpus=1)
    kube_client.create(Pod(metadata=ObjectMeta(name=node, namespace="default"),
                           spec=PodSpec(nodeName=node, automountServiceAccountToken=False,
                                        containers=[Container(name="c", image="none")])))
    client = make_client(control_plane.kubeconfig, watch_idle_timeout_s=120.0)
    # The API server sends a bookmark about 2 s before the watch's timeoutSeconds when
    # some pod changed since the watch began (any pod: the version moved on).
    watch = PodWatch(client, node, server_timeout_s=8)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    other = f"{node}-other"
    try:
        wait_until(lambda: watch.pods() is not None, timeout_s=20, what="the pod watch's copy")
        kube_client.create(Pod(metadata=ObjectMeta(name=other, namespace="default"),
                               spec=PodSpec(nodeName=f"{node}-elsewhere",
                                            automountServiceAccountToken=False,
                                            containers=[Container(name="c", image="none")])))
        wait_until(lambda: watch.bookmarks >= 1, timeout_s=30, what="a bookmark on the pod watch")
        pods = watch.pods()
        assert pods is not None and [p.name for p in pods] == [node], pods
        kube_client.delete(Pod, node, namespace="default", grace_period=0)
        wait_until(lambda: watch.pods() == [], timeout_s=10, what="the deletion on the pod watch")
    finally:
        kube_client.delete(Pod, other, namespace="default", grace_period=0)
        stop.set()
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.5)
        client.close()
