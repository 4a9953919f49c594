"""The plain-DRA baseline objects of bench/bench_dra.py pass the real apiserver's
validation (server-side dry run: nothing is stored in the shared control plane)."""

from __future__ import annotations

from typing import Any

import pytest
from bench.bench_dra import plain_device_class, plain_pod, plain_slice, plain_template, pod_limits
from lightkube import codecs

pytestmark = pytest.mark.e2e


def test_plain_objects_are_valid(kube_client: Any) -> None:
    template = plain_template(pod_limits(1))
    for obj in (plain_device_class(), plain_slice("bench-plain-node")):
        created = kube_client.create(codecs.from_dict(obj), dry_run=True)
        assert created.metadata.name == obj["metadata"]["name"]
    for obj in (template, plain_pod(1, template["metadata"]["name"])):
        created = kube_client.create(codecs.from_dict(obj), namespace="default", dry_run=True)
        assert created.metadata.name == obj["metadata"]["name"]


def test_a_broken_plain_object_is_refused(kube_client: Any) -> None:
    """The dry run does validate: a template whose capacity request is not a quantity is
    refused (400)."""
    from lightkube.core.exceptions import ApiError

    template = plain_template(pod_limits(1))
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][
        "memory"] = "lots"
    with pytest.raises(ApiError) as err:
        kube_client.create(codecs.from_dict(template), namespace="default", dry_run=True)
    assert err.value.status.code == 400 and "quantities" in str(err.value)
