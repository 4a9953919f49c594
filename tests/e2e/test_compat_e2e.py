"""What hami reads from the API server at start-up, on the release this run uses
(``make e2e K8S_VERSION=1.31.14``; the pinned v1.37.2 by default): the facts are the
server's, the Binding-label fact hami relies on holds there, and DRA mode is refused in
one line where the server cannot serve it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from hami.clusterprobe import read_facts, read_facts_async
from hami.core.clusterfacts import (
    PRIORITIZED_LIST_LOCKED_MINOR,
    binding_copies_labels,
    dra_refusal,
)
from hami.dra.startup import refusal, template_refusal
from hami.kube import Kube
from hami.testing.controlplane import KUBERNETES_VERSION, ControlPlane, create_gpu_node

pytestmark = pytest.mark.e2e
MINOR = int(KUBERNETES_VERSION.split(".")[1])
NODE = "compat-node"


@pytest.fixture(scope="module")
def gpu_node(kube_client: Any) -> Iterator[str]:
    """A Ready node to bind to (an API object: nothing runs on it)."""
    from lightkube.resources.core_v1 import Node

    create_gpu_node(kube_client, NODE, gpus=4)
    yield NODE
    kube_client.delete(Node, NODE)


def test_the_facts_are_the_servers(control_plane: ControlPlane, kube_client: Any) -> None:
    facts = read_facts(kube_client)
    assert facts.git_version == KUBERNETES_VERSION
    assert facts.release == (1, MINOR)
    assert facts.serves("v1") and facts.serves("apps/v1")
    assert facts.serves("resource.k8s.io/v1") is (MINOR >= 34)
    assert (dra_refusal(facts) is None) is (MINOR >= 34)

    async def via_async() -> Any:
        kube = Kube.connect(str(control_plane.kubeconfig))
        try:
            return await read_facts_async(kube.client)
        finally:
            await kube.close()

    assert asyncio.run(via_async()) == facts


def test_a_bindings_labels_reach_the_pod_where_hami_expects_it(control_plane: ControlPlane,
                                                   kube_client: Any, gpu_node: str) -> None:
    """The fact the scheduler's label patch rests on (hami.core.clusterfacts)."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    name = "compat-binding-labels"
    kube_client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}}))
    try:
        async def bind() -> None:
            kube = Kube.connect(str(control_plane.kubeconfig))
            try:
                pod = kube_client.get(Pod, name, namespace="default")
                await kube.bind("default", name, pod.metadata.uid, gpu_node,
                                annotations={"hami.io/compat": "a"},
                                labels={"hami.io/compat": "l"})
            finally:
                await kube.close()

        asyncio.run(bind())
        pod = kube_client.get(Pod, name, namespace="default")
        assert pod.spec.nodeName == gpu_node
        assert pod.metadata.annotations["hami.io/compat"] == "a"
        copied = (pod.metadata.labels or {}).get("hami.io/compat") == "l"
        assert copied is binding_copies_labels(read_facts(kube_client))
    finally:
        kube_client.delete(Pod, name, namespace="default", grace_period=0)


def test_dra_plugin_refuses_or_accepts_the_server(kube_client: Any, gpu_node: str) -> None:
    reason = refusal(kube_client, gpu_node)
    if MINOR >= 36:
        assert reason is None
    elif MINOR < 34:
        assert reason and "resource.k8s.io/v1" in reason and "\n" not in reason
    else:  # 1.34 / 1.35 without the gate: the dry-run slice loses the field
        assert reason and "DRAConsumableCapacity" in reason


@pytest.mark.skipif(MINOR >= 34, reason="DRA mode is served from Kubernetes 1.34 on")
def test_scheduler_and_dra_plugin_commands_refuse_dra_mode_in_one_line(
        control_plane: ControlPlane, gpu_node: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}
    for args in (["scheduler", "--dra-mode", "--http-bind", "127.0.0.1:0",
                  "--metrics-bind-address", ""],
                 ["dra-plugin", f"--node-name={gpu_node}", "--backend=fake"]):
        proc = subprocess.run([sys.executable, "-m", "hami.cli", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and "resource.k8s.io/v1" in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr


def _template_refusal(cp: ControlPlane, force: bool = False) -> str | None:
    """The scheduler's DRA-mode check against ``cp`` (``force``: as on a server of an
    unknown version, so the dry-run template is sent even where the gate is locked on)."""
    async def check() -> str | None:
        client = cp.async_client()
        try:
            facts = await read_facts_async(client)
            if force:
                facts = dataclasses.replace(facts, release=None)
            return await template_refusal(client, facts, "default")
        finally:
            await client.close()

    return asyncio.run(check())


@pytest.mark.skipif(MINOR < 34, reason="DRA mode is served from Kubernetes 1.34 on")
def test_the_mig_features_as_this_release_serves_them(control_plane: ControlPlane,
                                                      kube_client: Any, gpu_node: str) -> None:
    """Default gates: a MIG node's dry-run slice keeps consumesCounters from 1.36 on
    (DRAPartitionableDevices beta there), and the probe template's prioritized list is
    accepted and kept (DRAPrioritizedList on by default from 1.34)."""
    reason = refusal(kube_client, gpu_node, mig=True)
    if MINOR >= 36:
        assert reason is None
    else:  # 1.34 / 1.35: partitionable devices alpha and off, with consumable capacity
        assert reason and "DRAPartitionableDevices" in reason and "\n" not in reason
        assert "DRAConsumableCapacity" in reason
    assert _template_refusal(control_plane) is None
    assert _template_refusal(control_plane, force=True) is None


@pytest.fixture(scope="module")
def mig_gates_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A second API server of this release with DRAPartitionableDevices off, and
    DRAPrioritizedList too where it can be turned off (before 1.37)."""
    gates = ["DRAPartitionableDevices=false"]
    if MINOR < PRIORITIZED_LIST_LOCKED_MINOR:
        gates.append("DRAPrioritizedList=false")
    cp = ControlPlane(workdir=tmp_path_factory.mktemp("k8s-mig-gates-off"),
                      apiserver_args=[f"--feature-gates={','.join(gates)}"])
    cp.start(default_scheduler=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.mark.skipif(MINOR < 34, reason="DRA mode is served from Kubernetes 1.34 on")
def test_dra_mode_refuses_mig_without_its_feature_gates_in_one_line(
        mig_gates_off: ControlPlane) -> None:
    client = mig_gates_off.client()
    try:
        reason = refusal(client, NODE, mig=True)
        assert reason and "DRAPartitionableDevices" in reason and "\n" not in reason
        if MINOR >= 36:  # the shared cards alone still need nothing that is off
            assert refusal(client, NODE) is None
    finally:
        client.close()
    prioritized = _template_refusal(mig_gates_off)
    if MINOR < PRIORITIZED_LIST_LOCKED_MINOR:
        assert prioritized and "DRAPrioritizedList" in prioritized and "\n" not in prioritized
        env = {**os.environ, "KUBECONFIG": str(mig_gates_off.kubeconfig)}
        proc = subprocess.run([sys.executable, "-m", "hami.cli", "scheduler", "--dra-mode",
                               "--http-bind", "127.0.0.1:0", "--metrics-bind-address", ""],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and "DRAPrioritizedList" in errors[0], proc.stderr
    else:
        assert prioritized is None  # locked on: not asked
