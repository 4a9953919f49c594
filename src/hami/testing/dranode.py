"""DRA mode on the real node of a :class:`~hami.testing.gpubed.GpuBed`.

:func:`start_dra` adds what a DRA pod needs to a started bed: kube-controller-manager
with the resourceclaim and garbage-collector controllers (pods' ResourceClaims from
their templates), the ``gpu.hami.io`` DeviceClass (as the chart would ship it), and
``hami dra-plugin`` in the node's mount namespace on the bed's fake inventory, which
publishes the node's ResourceSlice and registers with the kubelet through
``/var/lib/kubelet/plugins_registry``. kube-scheduler allocates claims itself
(DynamicResources is on by default). At NodePrepareResources the plugin writes the claim's
CDI spec to ``/var/run/cdi`` of the node (:attr:`~hami.testing.node.RealNode.cdi_dir`),
and containerd 2.x injects it into the containers that use the claim.

The device plugin keeps running on the same fake cards; a test uses one mode per pod.
"""

from __future__ import annotations

from typing import Any

from hami.dra.slices import DRIVER, slice_name
from hami.testing.controllers import start_controller_manager
from hami.testing.controlplane import Component
from hami.testing.gpubed import GpuBed


def device_class(driver: str = DRIVER) -> dict[str, Any]:
    """The DeviceClass named ``driver`` that selects all devices of ``driver`` (one CEL
    selector). The default is the one every translated claim names: all devices of
    hami's driver, as the chart ships it."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}


def create_device_class(client: Any, driver: str = DRIVER) -> None:
    """Create :func:`device_class` of ``driver`` through ``client`` (a lightkube
    ``Client``): what the test beds and the DRA benches start from.

    Raises:
        lightkube.ApiError: the API server refused it (409: it exists already).
    """
    from lightkube import codecs

    client.create(codecs.from_dict(device_class(driver)))


def start_dra(bed: GpuBed, *, timeout_s: float = 60.0) -> Component:
    """Start the DRA parts on ``bed`` (module docstring) and wait until the node's
    ResourceSlice is published; returns the ``hami dra-plugin`` process (log:
    ``<bed>/node/logs/dra-plugin.log``).

    Raises:
        BinariesMissing: kube-controller-manager is not built.
        ControlPlaneError: a process exited or the slice did not appear in time.
    """
    from lightkube import ApiError
    from lightkube.resources.resource_v1 import ResourceSlice

    assert bed.cp is not None and bed.node is not None, "start the bed first"
    start_controller_manager(bed.cp)
    client = bed.client()
    try:
        create_device_class(client)
        plugin = bed.node.spawn("dra-plugin", [
            *bed._hami(), "dra-plugin", f"--node-name={bed.node_name}",  # noqa: SLF001
            f"--hook-path={bed.hook_path}", "--backend=fake",
            f"--fake-inventory={bed.workdir / 'inventory.yaml'}",
            f"--node-config-file={bed.workdir / 'node-config.json'}",
            f"--kubeconfig={bed.cp.kubeconfig}", "--publish-interval=2s",
        ], env=bed._env())  # noqa: SLF001

        def published() -> bool:
            try:
                client.get(ResourceSlice, slice_name(bed.node_name))
            except ApiError:
                return False
            return True

        bed.timings["dra-plugin"] = plugin.wait_healthy(published, "ResourceSlice", timeout_s)
    finally:
        client.close()
    return plugin
