"""What a real test node (:mod:`hami.testing.node`) needs from this machine, checked
before anything starts, so a test can skip with one clear line (or fail in CI); and the
node's cgroup v1 root: created before the kubelet starts, emptied and removed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hami.testing.containerd import BINARIES, default_containerd_dir
from hami.testing.controlplane import ControlPlaneError

#: Programs the node runs or uses, from Debian's containerd, runc, util-linux and
#: containernetworking-plugins packages; the first three may come from
#: ``hack/containerd/build.sh`` instead (:mod:`hami.testing.containerd`).
NODE_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "unshare", "nsenter")
#: cgroup v1 controllers the kubelet's cgroupfs driver needs.
REQUIRED_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")


class NodeUnavailable(ControlPlaneError):
    """This machine cannot run a real node (no root, no cgroups, a tool missing)."""


def cgroup_subsystems(mounts: str = "/proc/self/mounts") -> dict[str, str]:
    """Mounted cgroup v1 hierarchies: controller (or ``name=...``) -> mount point.

    Co-mounted controllers (``cpu,cpuacct``) map to the same mount point.
    """
    found: dict[str, str] = {}
    try:
        text = Path(mounts).read_text()
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] != "cgroup":
            continue
        for opt in parts[3].split(","):
            if opt in REQUIRED_CONTROLLERS or opt.startswith("name=") or opt in (
                    "blkio", "net_cls", "net_prio", "hugetlb", "perf_event", "rdma"):
                found.setdefault(opt, parts[1])
    return found


def missing_prerequisites(kubelet: Path | str | None,
                          containerd_dir: Path | None = None) -> list[str]:
    """Reasons this machine cannot run a real node; empty when it can.

    Args:
        kubelet: the kubelet binary (``hack/k8s/build.sh`` builds it).
        containerd_dir: the containerd build (default
            :func:`hami.testing.containerd.default_containerd_dir`); when it has all of
            :data:`hami.testing.containerd.BINARIES`, those need not be on ``PATH``.
    """
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root (containerd, runc and mount namespaces need it)")
    if kubelet is None or not os.access(kubelet, os.X_OK):
        reasons.append(f"no kubelet at {kubelet} (run hack/k8s/build.sh)")
    built = containerd_dir or default_containerd_dir()
    tools = [t for t in NODE_TOOLS if shutil.which(t) is None and not (
        t in BINARIES and os.access(built / t, os.X_OK)
        and os.environ.get("HAMI_CONTAINERD") != "system")]
    if tools:
        reasons.append("missing " + ", ".join(tools) +
                       " (Debian: apt-get install containerd runc util-linux)")
    if not any((Path(d) / "bridge").exists() for d in ("/usr/lib/cni", "/opt/cni/bin")):
        reasons.append("no CNI bridge plugin (Debian: apt-get install containernetworking-plugins)")
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        reasons.append("cgroup v2 host: this fixture drives the cgroup v1 cgroupfs layout")
    else:
        subs = cgroup_subsystems()
        absent = [c for c in REQUIRED_CONTROLLERS if c not in subs]
        if absent:
            reasons.append("cgroup v1 controllers not mounted: " + ", ".join(absent))
    return reasons


def prepare_cgroup_root(root: str) -> None:
    """Create the kubelet's cgroup root ``root`` (``/name``) in every v1 hierarchy (the
    kubelet refuses a root that does not exist); cpuset needs its cpus/mems copied from
    the parent. Raises ``OSError`` when a hierarchy is not writable."""
    for sub, mount in cgroup_subsystems().items():
        d = Path(mount) / root.lstrip("/")
        d.mkdir(exist_ok=True)
        if sub == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((Path(mount) / f).read_text())


def cgroup_dirs(root: str) -> Iterator[Path]:
    """Every directory under the cgroup root ``root`` in every hierarchy, bottom-up."""
    for mount in cgroup_subsystems().values():
        top = Path(mount) / root.lstrip("/")
        if top.is_dir():
            # os.walk skips directories that vanish while it walks (the kubelet and runc
            # remove pod cgroups as containers die), rglob raised
            for d, _, _ in os.walk(top, topdown=False):
                yield Path(d)


def kill_cgroup_tasks(root: str) -> None:
    """SIGKILL every process in the cgroups under ``root`` until none is left (2 s at
    most)."""
    for _ in range(20):
        pids: set[int] = set()
        for d in cgroup_dirs(root):
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroups(root: str) -> None:
    """Remove the (emptied) cgroups under ``root``; ones still busy stay."""
    for d in cgroup_dirs(root):
        with contextlib.suppress(OSError):
            d.rmdir()
