"""The hami chart installed by ``helm install`` on a real test node.

Unlike :class:`~hami.testing.gpubed.GpuBed`, no hami process runs on the host: the
chart's pods are hami. :class:`ChartBed` starts, in order:

1. a :class:`~hami.testing.controlplane.ControlPlane` whose apiserver calls webhooks on a
   Service's endpoint addresses (``--enable-aggregator-routing=true``; pod IPs are
   reachable from the host through the node's bridge, ClusterIPs are not);
2. a :class:`~hami.testing.node.RealNode` labelled ``gpu=on`` with four locally built
   images: pause, the GPU test image, the hami image and kube-scheduler
   (:mod:`hami.testing.hamiimage`), and the ``kubernetes`` Service routed to the
   apiserver for its pods (:mod:`hami.testing.podnet`);
3. ``helm install`` of ``deploy/helm/hami`` with :data:`TEST_VALUES` (local images, a
   node-private hook path, the device plugin on the fake GPU backend) plus the caller's
   values;
4. the controllers' part (:mod:`hami.testing.standins`): token Secret, the scheduler
   Deployment's pod, the device-plugin DaemonSet's pod, then the webhook Service's
   EndpointSlice once the scheduler pod is Ready.

GPU pods then go through the chart's webhook, its kube-scheduler with hami's extender, the
chart's device plugin (Allocate by the real kubelet) and libvgpu installed by the chart.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hami.testing import hamiimage, images, podnet, standins
from hami.testing.controlplane import (
    KUBERNETES_VERSION,
    ControlPlane,
    ControlPlaneError,
    ensure_namespace,
    wait_until,
)
from hami.testing.gpubed import REPO, remove_own_workdir
from hami.testing.gpupods import wait_webhook_serving
from hami.testing.node import RealNode, ensure_root_ca

CHART = REPO / "deploy" / "helm" / "hami"
RELEASE = "hami"
NAMESPACE = "hami-system"
#: Host directory of libvgpu and the containers' cache dirs: inside the node's private
#: /var/lib, so parallel nodes and the machine's /usr/local stay untouched.
HOOK_PATH = "/var/lib/hami-hook"


def stub_inventory(gpus: int = 2, memory_mib: int = 16384) -> dict[str, Any]:
    """A fake-backend inventory naming the stub driver's own cards (UUIDs
    ``GPU-5a1e0000-0000-4000-8000-<index as 12 hex digits>``, as ``stub_nvml.c`` reports
    them), so what the device plugin advertises and grants is what libvgpu and the
    monitor see in the containers: the monitor reports only granted UUIDs."""
    return {"gpus": [{"model": "NVIDIA A100-PCIE-16GB", "memory_mib": memory_mib, "numa": 0,
                      "uuids": [f"GPU-5a1e0000-0000-4000-8000-{i:012x}"]}
                     for i in range(gpus)]}


def chart_test_values(inventory_path: Path) -> dict[str, Any]:
    """Chart values for the test node: the locally built images (never pulled), the hook
    path above, and ``--backend=fake --fake-inventory=<inventory_path>`` for the device
    plugin. The inventory must lie under ``/tmp``: the chart mounts the node's ``/tmp``
    into the device-plugin container at the same path."""
    registry, _, rest = hamiimage.HAMI_IMAGE.partition("/")
    repository, _, tag = rest.partition(":")
    image = {"registry": registry, "repository": repository, "tag": tag,
             "pullPolicy": "Never"}
    return {
        "global": {"gpuHookPath": HOOK_PATH},
        "scheduler": {"extender": {"image": image},
                      # a broken webhook must show in the test, not admit pods unchanged
                      "admissionWebhook": {"failurePolicy": "Fail"}},
        "devicePlugin": {"image": image,
                         "extraArgs": ["--backend=fake", f"--fake-inventory={inventory_path}"]},
    }


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) \
            else v
    return out


def helm_binary() -> str:
    """The helm that ``hack/helm/build.sh`` built (or ``helm`` on PATH).

    Raises:
        ControlPlaneError: no helm found.
    """
    import shutil

    bindir = subprocess.run([str(REPO / "hack/helm/build.sh"), "--print-dir"], check=True,
                            capture_output=True, text=True).stdout.strip()
    built = Path(bindir) / "helm"
    found = str(built) if built.is_file() else shutil.which("helm")
    if not found:
        raise ControlPlaneError("no helm: run hack/helm/build.sh")
    return found


class ChartBed:
    """Control plane + real node + the hami chart (see the module docstring).

    Args:
        workdir: everything (must lie under /tmp, see :func:`chart_test_values`); a new temp
            dir by default.
        node_name: the Node's name.
        inventory: the fake GPUs (default :func:`stub_inventory`).
        values: chart values merged over :func:`chart_test_values`.
        libvgpu_build: ``native/libvgpu/build`` (``make native``).
        release, namespace: the Helm release and its namespace (``hami`` in
            ``hami-system``; a migration test installs a HAMi-like release elsewhere).
        keep_workdir: keep the temp work dir at :meth:`stop` (also ``HAMI_KEEP_WORKDIR=1``;
            it is always kept when :meth:`start` failed).

    Raises:
        NodeUnavailable: from :meth:`start` when this machine cannot run a node.
        ControlPlaneError: a process or pod did not become ready (message says which).
    """

    def __init__(self, workdir: Path | None = None, *, node_name: str = "gpu-node-0",
                 inventory: Mapping[str, Any] | None = None,
                 values: Mapping[str, Any] | None = None,
                 libvgpu_build: Path | None = None, release: str = RELEASE,
                 namespace: str = NAMESPACE, keep_workdir: bool = False) -> None:
        self._own_workdir = workdir is None
        self.keep_workdir = keep_workdir or os.environ.get("HAMI_KEEP_WORKDIR") == "1"
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hc", dir="/tmp"))
        if not str(self.workdir.resolve()).startswith("/tmp/"):
            raise ValueError(f"workdir {self.workdir} must lie under /tmp")
        self.node_name = node_name
        self.inventory = dict(inventory or stub_inventory())
        self.extra_values = dict(values or {})
        self.libvgpu_build = libvgpu_build or REPO / "native" / "libvgpu" / "build"
        self.release = release
        self.namespace = namespace
        self.cp: ControlPlane | None = None
        self.node: RealNode | None = None
        self.pods: dict[str, str] = {}  # component -> pod name
        self.timings: dict[str, float] = {}
        self._undo_route: Any = None

    def client(self, namespace: str = "default") -> Any:
        """A cluster-admin ``lightkube.Client``."""
        assert self.cp is not None, "start() first"
        return self.cp.client(namespace)

    def _timed(self, what: str, t0: float) -> None:
        self.timings[what] = round(time.monotonic() - t0, 1)

    def build_images(self) -> list[images.ImageArchive]:
        """pause, GPU test, hami and kube-scheduler archives (timed separately)."""
        work = self.workdir / "images"
        t0 = time.monotonic()
        out = [images.build_pause(work, KUBERNETES_VERSION),
               images.build_gpu_test_image(work, self.libvgpu_build)]
        self._timed("images: pause + gpu-test", t0)
        t0 = time.monotonic()
        out.append(hamiimage.build_hami_image(work, self.libvgpu_build))
        self._timed("images: hami", t0)
        t0 = time.monotonic()
        assert self.cp is not None
        out.append(hamiimage.build_kube_scheduler_image(
            work, self.cp.binaries["kube-scheduler"], KUBERNETES_VERSION))
        self._timed("images: kube-scheduler", t0)
        return out

    def start(self) -> ChartBed:
        """Everything above; stops it all again on failure (logs stay in the workdir)."""
        t_all = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cp = ControlPlane(workdir=self.workdir / "k8s",
                               apiserver_args=["--enable-aggregator-routing=true"])
        try:
            t0 = time.monotonic()
            self.cp.start()
            self._timed("control plane", t0)
            imgs = self.build_images()
            self.node = RealNode(self.cp, self.node_name, self.workdir / "node", images=imgs)
            self._undo_route = podnet.route_kubernetes_service(self.node.bridge,
                                                               self.cp.apiserver_port)
            t0 = time.monotonic()
            self.node.start()
            self._timed("node (images imported)", t0)
            self._install()
            self._run_workloads()
        except BaseException:
            self.keep_workdir = True  # its logs say why
            self.stop()
            raise
        self._timed("total", t_all)
        return self

    def _install(self) -> None:
        assert self.cp is not None
        client = self.cp.client()
        try:
            from lightkube.resources.core_v1 import Node

            client.patch(Node, self.node_name, {"metadata": {"labels": {"gpu": "on"}}})
            ensure_namespace(client, self.namespace)
            ensure_root_ca(client, self.namespace, self.cp.ca_file)
        finally:
            client.close()
        inv = self.workdir / "inventory.yaml"
        inv.write_text(yaml.safe_dump(self.inventory))
        values = self.workdir / "values.yaml"
        values.write_text(yaml.safe_dump(_merge(chart_test_values(inv), self.extra_values)))
        t0 = time.monotonic()
        p = subprocess.run(
            [helm_binary(), "install", self.release, str(CHART), "--namespace", self.namespace,
             "--kubeconfig", str(self.cp.kubeconfig), "-f", str(values)],
            capture_output=True, text=True, timeout=180,
            env={"HOME": str(self.workdir), "PATH": "/usr/bin:/bin",
                 "HELM_CACHE_HOME": str(self.workdir / "helm/cache"),
                 "HELM_CONFIG_HOME": str(self.workdir / "helm/config"),
                 "HELM_DATA_HOME": str(self.workdir / "helm/data")})
        if p.returncode != 0:
            raise ControlPlaneError(f"helm install failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        self._timed("helm install", t0)

    def _run_workloads(self) -> None:
        assert self.cp is not None
        client = self.cp.client()
        try:
            from lightkube.resources.apps_v1 import DaemonSet, Deployment

            t0 = time.monotonic()
            ns = self.namespace
            standins.fill_token_secrets(client, ns, self.cp.ca_file.read_bytes())
            for dep in client.list(Deployment, namespace=ns):
                self.pods[dep.metadata.name] = standins.run_deployment(
                    client, ns, dep.metadata.name)
            for ds in client.list(DaemonSet, namespace=ns):
                for pod in standins.run_daemonset(client, ns, ds.metadata.name):
                    self.pods[ds.metadata.name] = pod
            for pod in self.pods.values():
                self.wait_pod_ready(pod, namespace=ns, timeout_s=180)
            self._timed("chart pods Ready", t0)
            service = f"{self.release}-scheduler"
            if standins.publish_endpoints(client, ns, service) < 1:
                raise ControlPlaneError(f"Service {service} has no Ready pod")
            # the apiserver resolves the webhook's Service from its informer's copy of the
            # endpoints just published: until it has them, pod creations are refused
            t0 = time.monotonic()
            wait_webhook_serving(client, "default")
            self._timed("webhook serving", t0)
            t0 = time.monotonic()
            wait_until(lambda: _gpu_allocatable(client, self.node_name) > 0,
                       timeout_s=60, what="nvidia.com/gpu on the Node")
            self._timed("GPUs on the Node", t0)
        finally:
            client.close()

    def wait_pod_ready(self, name: str, namespace: str = NAMESPACE,
                       timeout_s: float = 120.0) -> Any:
        """Wait until pod ``name`` is Ready; return it.

        Raises:
            ControlPlaneError: timeout or a container ended; the message has the pod's
                container states and the tail of each container's log.
        """
        from lightkube.resources.core_v1 import Pod

        assert self.cp is not None
        client = self.cp.client()
        last: list[Any] = [None]

        def ready() -> bool:
            pod = last[0] = client.get(Pod, name, namespace=namespace)
            st = pod.status
            if st is not None and st.phase in ("Failed", "Succeeded"):
                raise ControlPlaneError(f"pod {name} ended: {st.phase}\n{self.describe(pod)}")
            return bool(st and any(c.type == "Ready" and c.status == "True"
                                   for c in st.conditions or []))

        try:
            wait_until(ready, timeout_s=timeout_s, what=f"pod {namespace}/{name} Ready")
        except ControlPlaneError as err:
            raise ControlPlaneError(f"{err}\n{self.describe(last[0])}") from None
        finally:
            client.close()
        return last[0]

    def describe(self, pod: Any) -> str:
        """Container states and log tails of ``pod`` (for failure messages)."""
        if pod is None or pod.status is None:
            return "(no status)"
        lines = []
        for cs in [*(pod.status.initContainerStatuses or []),
                   *(pod.status.containerStatuses or [])]:
            lines.append(f"{cs.name}: ready={cs.ready} restarts={cs.restartCount} "
                         f"state={cs.state.to_dict() if cs.state else None}")
            if self.node is not None:
                log = self.node.container_log(pod.metadata.namespace, pod.metadata.name,
                                              cs.name)
                lines += [f"  | {ln}" for ln in log.splitlines()[-15:]]
        return "\n".join(lines)

    def stop(self) -> None:
        """Node (containers first), the Service route, then the control plane; each step
        runs even when an earlier one failed. The image archives (about 1 GB) are
        removed, and the whole work dir when the bed created it and ``keep_workdir`` is
        false."""
        import shutil

        try:
            if self.node is not None:
                self.node.stop()
        finally:
            try:
                if self._undo_route is not None:
                    self._undo_route()
                    self._undo_route = None
            finally:
                if self.cp is not None:
                    self.cp.stop()
                shutil.rmtree(self.workdir / "images", ignore_errors=True)
                remove_own_workdir(self.workdir, self._own_workdir and not self.keep_workdir)

    def __enter__(self) -> ChartBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _gpu_allocatable(client: Any, node: str) -> int:
    from lightkube.resources.core_v1 import Node

    n = client.get(Node, node)
    return int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) if n.status else 0
