"""A real Kubernetes node for the test bed: kubelet, containerd and runc on this machine.

The kubelet's device-plugin directory (``/var/lib/kubelet/device-plugins``) and pod-log
directory (``/var/log/pods``) are hard-coded in the kubelet, and containerd's shims and
network namespaces live under ``/run``. So every node process runs inside one private
mount namespace (``unshare --mount``) whose ``/var/lib``, ``/var/log``,
``/run/containerd``, ``/run/netns`` and ``/run/cdi`` are fresh tmpfs mounts: nothing touches the
machine's own ``/var``, and containerd shares the namespace with the kubelet (the
kubelet's projected-token and emptyDir mounts must be visible to the runtime). Further
node processes (``hami device-plugin``, ``hami monitor``) join it with ``nsenter``; the
test process reads the namespace's files through ``/proc/<holder>/root``.

containerd is 2.x from ``hack/containerd/build.sh`` when built (CDI on, specs in the
node's ``/run/cdi``: :attr:`RealNode.cdi_dir`), else the machine's
(:mod:`hami.testing.containerd`). Pods get an IP from the CNI ``bridge`` plugin (host-local IPAM, no masquerade). The
kubelet authenticates as ``system:node:<name>`` (group ``system:nodes``), so the API
server's Node authorizer and NodeRestriction admission apply to it as in a cluster.

There is no kube-controller-manager: :meth:`RealNode.start` removes the
``node.kubernetes.io/not-ready`` taint once the node is Ready, and
:func:`ensure_root_ca` publishes ``kube-root-ca.crt`` for pods' projected tokens.

Settings taken from the kubelet's documented configuration (``KubeletConfiguration``
v1beta1): ``cgroupDriver: cgroupfs`` and ``failCgroupV1: false`` (the kubelet refuses
cgroup v1 by default since 1.35), ``failSwapOn: false``, ``AlwaysAllow`` authorization
with anonymous authentication off, eviction and image-GC thresholds lowered so a busy
CI disk never evicts the test pods.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hami.testing.containerd import (
    Containerd,
    NodeRuntimeConfig,
    bridge_conflist,
    cni_bin_dir,
    config_toml,
    find_containerd,
)
from hami.testing.controlplane import (
    HOST,
    Component,
    ControlPlane,
    ControlPlaneError,
    die_with_parent,
    free_port,
)
from hami.testing.nodeapi import (
    cri_log_message,
    ensure_root_ca,
    node_ready,
    remove_not_ready_taint,
)
from hami.testing.nodeprereq import (
    NodeUnavailable,
    kill_cgroup_tasks,
    missing_prerequisites,
    prepare_cgroup_root,
    remove_cgroups,
)

__all__ = ["NodeUnavailable", "RealNode", "ensure_root_ca", "missing_prerequisites"]

#: Directories that get a fresh tmpfs inside the node's mount namespace.
PRIVATE_DIRS = ("/var/lib", "/var/log", "/run/containerd", "/run/netns", "/run/cdi")
#: The node's CDI spec directory (containerd 2.x reads only this one): private, so
#: parallel nodes and the machine do not see each other's specs.
CDI_DIR = "/run/cdi"
class RealNode:
    """containerd + kubelet registered as Node ``name`` with the control plane ``cp``.

    Args:
        cp: a started :class:`~hami.testing.controlplane.ControlPlane`.
        name: the Node name (``--hostname-override``).
        workdir: configs, logs, containerd socket and CNI state; a short temp dir by
            default (Unix socket paths must stay under 108 bytes).
        images: ``docker-archive`` tarballs imported into containerd's ``k8s.io``
            namespace before the kubelet starts (see :mod:`hami.testing.images`); one of
            them must be ``sandbox_image``.
        sandbox_image: the pod sandbox ("pause") image name; never pulled.
        subnet_index: third octet of the pod subnet ``10.244.<i>.0/24`` (default: derived
            from the name and workdir, so nodes of parallel sessions differ).
        containerd: which containerd to run (default
            :func:`~hami.testing.containerd.find_containerd`: 2.x from
            ``hack/containerd/build.sh`` when built, else the machine's).

    Raises:
        NodeUnavailable: from :meth:`start` when this machine lacks root, cgroups or a
            tool (the message lists what).
    """

    def __init__(self, cp: ControlPlane, name: str, workdir: Path | None = None, *,
                 images: Sequence[Any] = (), sandbox_image: str = "hami.local/pause:test",
                 subnet_index: int | None = None, verbosity: int = 1,
                 containerd: Containerd | None = None) -> None:
        self.cp = cp
        self.name = name
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hk", dir="/tmp"))
        self.log_dir = self.workdir / "logs"
        self.images = list(images)
        self.sandbox_image = sandbox_image
        self.verbosity = verbosity
        digest = hashlib.sha256(f"{name}{self.workdir}".encode()).hexdigest()[:8]
        if subnet_index is None:  # nodes of parallel test sessions must not share a subnet
            subnet_index = 16 + int(digest, 16) % 224
        self.subnet = f"10.244.{subnet_index}.0/24"
        self.bridge = f"hk{digest}"
        self.cgroup_root = f"/hami-node-{digest}"
        self.containerd_socket = self.workdir / "containerd.sock"
        #: built by hack/k8s/build.sh next to kube-apiserver
        self.kubelet_binary = cp.binaries["kube-apiserver"].parent / "kubelet"
        self.kubelet_port = 0
        self.healthz_port = 0
        self.holder: subprocess.Popen[bytes] | None = None
        self.containerd: Component | None = None
        self.runtime = containerd
        self.kubelet: Component | None = None
        self.startup_seconds: dict[str, float] = {}
        self._components: list[Component] = []

    # -- namespace -------------------------------------------------------------------

    def host_path(self, path: str | Path) -> Path:
        """``path`` as the node's processes see it, readable from outside the namespace."""
        assert self.holder is not None, "start() first"
        return Path(f"/proc/{self.holder.pid}/root") / str(path).lstrip("/")

    @property
    def cdi_dir(self) -> Path:
        """The node's CDI spec directory (``/run/cdi`` inside its namespace, where
        containerd 2.x looks for specs at each container creation), as seen from outside;
        a spec written here names devices that pods' containers on this node can get."""
        return self.host_path(CDI_DIR)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Component:
        """Start ``argv`` inside the node's mount namespace (``nsenter``); its output goes
        to ``<workdir>/logs/<name>.log`` (appended across restarts)."""
        assert self.holder is not None, "start() first"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                ["nsenter", f"--target={self.holder.pid}", "--mount", "--", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=cwd or self.workdir, env=dict(env) if env is not None else None,
                start_new_session=True, preexec_fn=die_with_parent)
        comp = Component(name, proc, log_path)
        self._components.append(comp)
        return comp

    def run(self, argv: Sequence[str], *, timeout_s: float = 60.0) -> str:
        """Run ``argv`` inside the namespace to completion; return its stdout.

        Raises:
            ControlPlaneError: non-zero exit (message has its output).
        """
        assert self.holder is not None, "start() first"
        p = subprocess.run(["nsenter", f"--target={self.holder.pid}", "--mount", "--", *argv],
                           capture_output=True, text=True, timeout=timeout_s)
        if p.returncode != 0:
            raise ControlPlaneError(f"{' '.join(argv)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        return p.stdout

    def _start_holder(self) -> None:
        script = "set -e\n" + "".join(
            f"mkdir -p {d} && mount -t tmpfs -o mode=0755 hami-node {d}\n" for d in PRIVATE_DIRS
        ) + "mkdir -p /var/lib/kubelet/device-plugins /var/log/pods\necho ready\nexec sleep infinity\n"
        for d in PRIVATE_DIRS:  # mount points must exist; empty directories on the host
            Path(d).mkdir(parents=True, exist_ok=True)
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=die_with_parent)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        if line.strip() != b"ready":
            err = self.holder.stderr.read().decode(errors="replace") if self.holder.stderr else ""
            raise NodeUnavailable(f"cannot make a private mount namespace: {err.strip()}")

    # -- containerd ------------------------------------------------------------------

    def _write_cni(self) -> Path:
        conf_dir = self.workdir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-hami.conflist").write_text(json.dumps(bridge_conflist(
            f"hami-{self.name}", self.bridge, self.subnet, self.workdir / "cni" / "ipam"),
            indent=1))
        return conf_dir

    def _write_containerd_config(self) -> Path:
        assert self.runtime is not None
        cfg = self.workdir / "containerd.toml"
        cfg.write_text(config_toml(self.runtime.major, NodeRuntimeConfig(
            self.containerd_socket, self.sandbox_image, cni_bin_dir(), self._write_cni(),
            (CDI_DIR,)), minor=self.runtime.minor))
        return cfg

    def ctr(self, *args: str, timeout_s: float = 120.0) -> str:
        """``ctr -n k8s.io <args>`` against this node's containerd; returns stdout."""
        assert self.runtime is not None
        return self.run([self.runtime.binary("ctr"), f"--address={self.containerd_socket}", "-n", "k8s.io", *args],
                        timeout_s=timeout_s)

    def running_task_ids(self) -> set[str]:
        """The IDs of the containers whose task is RUNNING in this node's containerd
        (``ctr -n k8s.io tasks ls``). Raises ``NodeError`` when ctr fails."""
        out = self.ctr("tasks", "ls")
        return {ln.split()[0] for ln in out.splitlines()[1:]
                if ln.split() and ln.split()[-1] == "RUNNING"}

    def _start_containerd(self, timeout_s: float) -> None:
        cfg = self._write_containerd_config()
        assert self.runtime is not None
        self.containerd = self.spawn(
            "containerd", [self.runtime.binary("containerd"), f"--config={cfg}"],
            env={**os.environ, "PATH": self.runtime.path_env()})
        self.startup_seconds["containerd"] = self.containerd.wait_healthy(
            lambda: self.containerd_socket.exists() and self._ctr_ok(), "socket", timeout_s)
        t0 = time.monotonic()
        for archive in self.images:
            self.ctr("images", "import", "--no-unpack=false", str(archive.path))
        self.startup_seconds["images"] = time.monotonic() - t0

    def _ctr_ok(self) -> bool:
        try:
            self.ctr("version", timeout_s=10)
        except (ControlPlaneError, subprocess.TimeoutExpired):
            return False
        return True

    # -- kubelet ---------------------------------------------------------------------

    def _write_kubelet_config(self) -> Path:
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": HOST, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": HOST, "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.cp.ca_file)}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "nodeStatusUpdateFrequency": "2s", "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s", "fileCheckFrequency": "10s",
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "maxPods": 50, "serializeImagePulls": False, "resolvConf": "",
            "registerNode": True, "enableDebuggingHandlers": True,
            "containerLogMaxSize": "1Mi", "shutdownGracePeriod": "0s",
            # no KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT chains in the host's
            # tables (the kubelet shares the host's network namespace): KUBE-FIREWALL drops
            # every connection from a non-loopback address to 127.0.0.0/8 and outlived the
            # node (issue 28); they serve kube-proxy, which the test node does not run
            "makeIPTablesUtilChains": False,
        }
        path = self.workdir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start_kubelet(self, timeout_s: float = 120.0) -> Component:
        """Start (or restart after :meth:`stop_kubelet`) the kubelet and wait until the
        Node is Ready; then remove the not-ready taint nobody else would remove."""
        cfg = self.workdir / "kubelet-config.yaml"
        if not cfg.exists():
            cfg = self._write_kubelet_config()
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        if not kubeconfig.exists():
            self.cp.client_kubeconfig(kubeconfig, f"system:node:{self.name}", ["system:nodes"])
        self.kubelet = self.spawn("kubelet", [
            str(self.kubelet_binary),
            f"--config={cfg}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}",
            f"--cert-dir={self.workdir / 'kubelet-pki'}", f"--v={self.verbosity}",
        ])
        t0 = time.monotonic()
        client = self.cp.client()
        try:
            self.kubelet.wait_healthy(lambda: node_ready(client, self.name), "Node Ready",
                                      timeout_s)
            remove_not_ready_taint(client, self.name)
        finally:
            client.close()
        self.startup_seconds["kubelet"] = time.monotonic() - t0
        return self.kubelet

    def stop_kubelet(self) -> None:
        """Stop the kubelet only (pods keep running under containerd, as on a node)."""
        if self.kubelet is not None:
            self.kubelet.stop()

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout_s: float = 180.0) -> RealNode:
        """Namespace, containerd (images imported), kubelet; wait for Node Ready.

        Raises:
            NodeUnavailable: prerequisites missing (nothing was started).
            ControlPlaneError: a process died or did not become healthy in time; what
                was started is stopped and the workdir with the logs is kept.
        """
        missing = missing_prerequisites(kubelet=self.kubelet_binary)
        if missing:
            raise NodeUnavailable("cannot run a real node here: " + "; ".join(missing))
        if self.runtime is None:
            self.runtime = find_containerd()
        t0 = time.monotonic()
        try:
            self._start_holder()
            prepare_cgroup_root(self.cgroup_root)
            self._start_containerd(timeout_s)
            self.start_kubelet(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        return self

    def check_alive(self) -> None:
        """Raise :class:`ControlPlaneError` if a node process exited unasked."""
        for comp in self._components:
            comp.check_alive()

    def stop(self) -> None:
        """Kill every container, stop the node's processes, remove its cgroups, bridge
        and namespace. Safe to call twice."""
        if self.kubelet is not None:
            self.kubelet.stop()
        kill_cgroup_tasks(self.cgroup_root)
        for comp in reversed(self._components):
            comp.stop(timeout_s=5)
        self._kill_namespace_processes()
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        remove_cgroups(self.cgroup_root)
        if shutil.which("ip"):
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)

    def _kill_namespace_processes(self) -> None:
        if self.holder is None or self.holder.poll() is not None:
            return
        try:
            ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
        except OSError:
            return
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in (os.getpid(), self.holder.pid):
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == ns:
                    os.kill(int(entry.name), signal.SIGKILL)

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading what ran ------------------------------------------------------------

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The kubelet's log file of a container's latest run (``/var/log/pods``), or ""."""
        base = self.host_path("/var/log/pods")
        for d in base.glob(f"{namespace}_{pod}_*/{container}"):
            runs = sorted(d.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
            if runs:
                return "".join(cri_log_message(ln) for ln in runs[-1].read_text().splitlines())
        return ""
