"""Pods of a real test node reach the API server through the ``kubernetes`` Service.

The test control plane's kube-apiserver listens on 127.0.0.1 only and no kube-proxy runs,
so ``KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT`` (the ``kubernetes`` Service's
ClusterIP and port 443, which the kubelet puts in every container's environment and every
in-cluster client dials) leads nowhere. :func:`route_kubernetes_service` adds the one rule
kube-proxy would add for it, limited to the node's CNI bridge: packets from the node's pods
to ``<ClusterIP>:443`` are DNAT-ed to ``127.0.0.1:<apiserver port>``; the bridge gets
``route_localnet=1`` so that the kernel routes 127.0.0.1 for packets that came in on it
(kube-proxy sets the same sysctl for NodePorts on localhost). The apiserver's serving
certificate names the ClusterIP, so clients verify it as in a cluster.

Nodes of parallel test sessions have their own bridges and apiserver ports, so their
rules never overlap. Root and ``iptables`` are needed (a real node needs root anyway).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from hami.testing.controlplane import HOST, KUBERNETES_SERVICE_IP, ControlPlaneError

__all__ = ["kube_chains", "route_kubernetes_service"]


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def route_kubernetes_service(bridge: str, apiserver_port: int,
                             service_ip: str = KUBERNETES_SERVICE_IP) -> Callable[[], None]:
    """Make ``service_ip:443`` reach ``127.0.0.1:apiserver_port`` for pods on ``bridge``.

    The bridge is created (up, no address) when it does not exist yet; the CNI bridge
    plugin adopts an existing bridge of its configured name and adds its gateway address.

    Returns:
        A function that removes the rule again (the bridge itself goes with the node).

    Raises:
        ControlPlaneError: ``ip``, the sysctl or ``iptables`` failed (message has why).
    """
    if _run(["ip", "link", "show", bridge], check=False).returncode != 0:
        _run(["ip", "link", "add", "name", bridge, "type", "bridge"])
    _run(["ip", "link", "set", bridge, "up"])
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1\n")
    rule = ["PREROUTING", "-i", bridge, "-d", f"{service_ip}/32", "-p", "tcp", "--dport", "443",
            "-m", "comment", "--comment", f"hami test node {bridge}: kubernetes Service",
            "-j", "DNAT", "--to-destination", f"{HOST}:{apiserver_port}"]
    _run(["iptables", "-w", "-t", "nat", "-A", *rule])

    def undo() -> None:
        _run(["iptables", "-w", "-t", "nat", "-D", *rule], check=False)

    return undo


def kube_chains() -> set[str]:
    """The ``KUBE-*`` chains of the host's IPv4 filter, nat and mangle tables, as
    ``"<table>/<chain>"`` (those a kubelet creates for kube-proxy: ``KUBE-FIREWALL``,
    ``KUBE-KUBELET-CANARY``, ``KUBE-IPTABLES-HINT``; the test node's kubelet must leave
    none behind). Empty where ``iptables`` is missing."""
    import shutil

    if not shutil.which("iptables"):
        return set()
    found = set()
    for table in ("filter", "nat", "mangle"):
        out = _run(["iptables", "-w", "-t", table, "-S"], check=False).stdout
        found |= {f"{table}/{ln.split()[1]}" for ln in out.splitlines()
                  if ln.startswith("-N KUBE-")}
    return found
