"""Allocate mode ``auto`` through the real gRPC plugin behind the fake kubelet: the mode
it registers with and writes on its Node follows the Node's reported runtime and kubelet
versions (``status.nodeInfo``)."""

from __future__ import annotations

import logging
import threading

import pytest

from hami.api import names
from hami.deviceplugin import cdimode as cm
from tests.node.conftest import NODE, PluginHarness
from tests.node.test_plugin_grpc import A, up, wait

RESOURCE = "nvidia.com/gpu"


def start_auto(h: PluginHarness, **extra: object) -> None:
    up(h, allocate_mode="auto", pod_resources_socket=h.root / "pr.sock",
       cdi_spec_dir=h.root / "cdi", **extra)


def test_auto_on_containerd_2_serves_cdi(harness: PluginHarness,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hami.deviceplugin")
    harness.kube.node_info[NODE] = ("containerd://2.4.2", "v1.31.0")
    start_auto(harness)
    assert harness.kubelet.registrations[-1].options.pre_start_required
    wait(lambda: harness.kube.nodes[NODE][0].get(names.NODE_ALLOCATE_MODE) == "cdi",
         what="allocate mode cdi on the node")
    resp = harness.kubelet.allocate([f"{A}-0"])
    assert [d.name for d in resp.container_responses[0].cdi_devices] == [
        cm.cdi_device_name(RESOURCE, [f"{A}-0"])]
    assert "allocate mode auto: cdi ('containerd://2.4.2' applies" in caplog.text


@pytest.mark.parametrize(("runtime", "kubelet", "why"), [
    ("containerd://1.7.20", "v1.31.0", "from 2.0.0 on"),
    ("containerd://2.4.2", "v1.28.3", "from 1.29 on"),
    ("docker://26.1.0", "v1.31.0", "not known to apply CDI"),
])
def test_auto_elsewhere_serves_with_the_node_lock(harness: PluginHarness,
                                                  caplog: pytest.LogCaptureFixture,
                                                  runtime: str, kubelet: str, why: str) -> None:
    caplog.set_level(logging.INFO, logger="hami.deviceplugin")
    # a node that served cdi before (e.g. downgraded): the annotation must go
    harness.kube.add_node(NODE, {names.NODE_ALLOCATE_MODE: "cdi"})
    harness.kube.node_info[NODE] = (runtime, kubelet)
    start_auto(harness)
    assert not harness.kubelet.registrations[-1].options.pre_start_required
    wait(lambda: names.NODE_ALLOCATE_MODE not in harness.kube.nodes[NODE][0]
         and "hami.io/node-nvidia-register" in harness.kube.nodes[NODE][0],
         what="the node registered without the cdi annotation")
    assert "allocate mode auto: node-lock" in caplog.text and why in caplog.text
    assert not (harness.root / "cdi").exists()


def test_auto_without_runtime_version_waits_then_takes_the_lock(
        harness: PluginHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hami.deviceplugin")
    start_auto(harness, auto_probe_s=1.5)  # the Node reports no nodeInfo
    assert not harness.kubelet.registrations[-1].options.pre_start_required
    assert harness.kube.calls.count("get_node") >= 2  # read again while it said nothing
    assert "node-lock (the Node reports no container runtime version)" in caplog.text


def test_auto_picks_up_a_version_reported_during_the_probe(harness: PluginHarness) -> None:
    threading.Timer(0.5, lambda: harness.kube.node_info.__setitem__(
        NODE, ("containerd://2.0.0", "v1.30.1"))).start()
    start_auto(harness, auto_probe_s=10.0)
    assert harness.kubelet.registrations[-1].options.pre_start_required
