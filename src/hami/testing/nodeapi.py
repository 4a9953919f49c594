"""API-side chores of the real test node (:mod:`hami.testing.node`) that
kube-controller-manager would do in a cluster, and reading the kubelet's CRI log lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hami.testing.controlplane import wait_until

__all__ = ["cri_log_message", "ensure_root_ca", "node_ready", "remove_not_ready_taint"]


def cri_log_message(line: str) -> str:
    """The message of one CRI log line ``<time> <stream> <P|F> <message>``."""
    parts = line.split(" ", 3)
    if len(parts) < 4:
        return ""
    return parts[3] + ("\n" if parts[2] == "F" else "")


def node_ready(client: Any, name: str) -> bool:
    """True when Node ``name`` exists and its Ready condition is True."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node

    try:
        node = client.get(Node, name)
    except ApiError:
        return False
    return any(c.type == "Ready" and c.status == "True"
               for c in (node.status.conditions or []) if node.status)


def remove_not_ready_taint(client: Any, name: str) -> None:
    """Remove the ``node.kubernetes.io/not-ready`` taint from Node ``name``: what the
    node-lifecycle controller does once the node is Ready.

    Raises:
        ControlPlaneError: the taint is still there after 30 s.
    """
    from lightkube.resources.core_v1 import Node

    def done() -> bool:
        node = client.get(Node, name)
        taints = [t for t in (node.spec.taints or [])
                  if t.key != "node.kubernetes.io/not-ready"]
        if len(taints) == len(node.spec.taints or []):
            return True
        client.patch(Node, name, {"spec": {"taints": [t.to_dict() for t in taints] or None}},
                     patch_type=_merge())
        return False

    wait_until(done, timeout_s=30, what="not-ready taint removed")


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE


def ensure_root_ca(client: Any, namespace: str, ca_file: Path) -> None:
    """Create ``kube-root-ca.crt`` in ``namespace`` (kube-controller-manager's root-CA
    publisher does it in a cluster); pods' projected service-account volumes need it.
    An existing one is left alone."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap

    try:
        client.create(ConfigMap(metadata=ObjectMeta(name="kube-root-ca.crt", namespace=namespace),
                                data={"ca.crt": ca_file.read_text()}))
    except ApiError as err:
        if err.status.code != 409:
            raise
