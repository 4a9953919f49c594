"""DRA mode keeps the priority-0 grant (issue 25 item 2): a GPU pod translated into a
claim, and a tenant's pod naming hami's template itself, may ask for task priority 0
only in a namespace the operator granted it; the monitor reads the priority of a claim
from the ``CUDA_TASK_PRIORITY`` env of the container using it."""

from __future__ import annotations

from dataclasses import replace

from hami.dra.webhook import DraWebhook
from hami.webhook.review import review
from tests.dra.test_template_isolation import CONFIG, _call, _copied, _translated
from tests.dra.test_webhook import _Client, _pod, _review


def _hook(*granted: str) -> DraWebhook:
    config = replace(CONFIG, high_priority_namespaces=granted)
    return DraWebhook(_Client(), config, lambda body: review(body, config, None))


def test_a_translated_pod_asking_priority_0_needs_the_grant() -> None:
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/priority": "0"})
    resp = _call(_hook(), _review(pod))
    assert not resp["allowed"] and "nvidia.com/priority 0" in resp["status"]["message"], resp
    assert _call(_hook("ns"), _review(pod))["allowed"]


def test_a_pod_naming_hamis_template_cannot_set_priority_0_itself() -> None:
    hook = _hook()
    translated = _translated(hook)
    evil = _copied(translated, container={"env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]})
    resp = _call(hook, _review(evil))
    assert not resp["allowed"] and "CUDA_TASK_PRIORITY 0" in resp["status"]["message"], resp
    fine = _copied(translated, container={"env": [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]})
    assert _call(hook, _review(fine))["allowed"]
    granted = _hook("ns")
    assert _call(granted, _review(_copied(_translated(granted), container={
        "env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]})))["allowed"]
