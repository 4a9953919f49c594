"""Nothing DRA mode makes is left behind, on the real control plane: a real
``hami scheduler --dra-mode`` process is the webhook the kube-apiserver calls for pods,
kube-controller-manager's resourceclaim and garbage-collector controllers make and
delete the pods' claims, and GPU pods of random shapes (distinct requests, so distinct
hami templates) are created and deleted in batches. Afterwards the counts of pods,
ResourceClaims and ResourceClaimTemplates are where they started: the templates hami
made are collected once no pod needs them (``--dra-template-idle``, 5 s here; without
the collector every distinct request left one template). bench/bench_dra_churn.py runs
the same with thousands of pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hami.testing.drachurn import churn, counts, wait_counts

from .drabed import DRA_ARGS, dra_bed

pytestmark = pytest.mark.e2e

NS = "churn"
PODS = 200


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with dra_bed(tmp_path_factory.mktemp("k8s-drachurn"), namespace=NS,
                 hami_args=[*DRA_ARGS, "--dra-template-idle=5s"], webhook="hami-churn",
                 serving_namespace=NS) as dra:
        yield {"cp": dra.cp, "client": dra.client, "hami": dra.hami}


def test_churn_ends_with_the_object_counts_it_started_with(bed: dict[str, Any]) -> None:
    client = bed["client"]
    before = counts(client, NS)
    stats = churn(client, NS, PODS, seed=30, batch=25, timeout_s=90)
    assert stats["templates_seen"] > 0, stats  # the pods did get hami templates
    after = wait_counts(client, NS, before, timeout_s=60)
    print(f"churn: {stats}; before {before}; after {after}")
    assert after == before, (before, after, stats, bed["hami"].log_tail())
