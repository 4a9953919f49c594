"""Which pods and containers the monitor reports on. Pure.

HAMi exports per-container series for every loaded cache file of a pod labelled for the
node, finished pods included, so a Succeeded or Failed pod (or a crashed container whose
process slots were never released) keeps reporting its last memory use until the pod is
deleted. Here series exist only while a container can run: none once its pod is
Succeeded or Failed, none while the kubelet reports the container terminated or waiting.
The cache directory itself is kept until the pod is deleted, as in HAMi.
"""

from __future__ import annotations

from hami.deviceplugin.allocate import PodView

#: Pod phases after which no container of the pod runs again.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def pod_finished(pod: PodView) -> bool:
    """True when the pod's phase is Succeeded or Failed (Kubernetes pod lifecycle: every
    container has terminated and none will be restarted)."""
    return pod.phase in FINISHED_PHASES


def container_running(pod: PodView, name: str) -> bool:
    """True when container ``name`` of ``pod`` should have per-container series: the pod
    is not finished and the kubelet reports the container ``running``, or has not
    reported it yet (a status lags the process start by up to a kubelet sync)."""
    if pod_finished(pod):
        return False
    return pod.container_states.get(name, "running") == "running"
