"""What a real test node (:mod:`hami.testing.node`) needs from this machine, checked
before anything starts, so a test can skip with one clear line (or fail in CI)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hami.testing.controlplane import ControlPlaneError

#: Programs the node runs or uses, from Debian's containerd, runc, util-linux and
#: containernetworking-plugins packages.
NODE_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter")
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


def missing_prerequisites(kubelet: Path | str | None) -> list[str]:
    """Reasons this machine cannot run a real node; empty when it can.

    Args:
        kubelet: the kubelet binary (``hack/k8s/build.sh`` builds it).
    """
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root (containerd, runc and mount namespaces need it)")
    if kubelet is None or not os.access(kubelet, os.X_OK):
        reasons.append(f"no kubelet at {kubelet} (run hack/k8s/build.sh)")
    tools = [t for t in NODE_TOOLS if shutil.which(t) is None]
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
