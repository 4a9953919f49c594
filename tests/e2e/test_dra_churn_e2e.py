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

from hami.dra.slices import DRIVER
from hami.testing.controllers import start_controller_manager
from hami.testing.controlplane import BinariesMissing, ControlPlane, ensure_namespace
from hami.testing.drachurn import churn, counts, wait_counts
from hami.testing.gpupods import wait_webhook_serving, webhook_configuration

from .conftest import REQUIRED
from .hami_harness import HamiProcess, Tls

pytestmark = pytest.mark.e2e

NS = "churn"
PODS = 200


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from lightkube import codecs

    work = tmp_path_factory.mktemp("k8s-drachurn")
    try:
        cp = ControlPlane(workdir=work / "cp")
    except BinariesMissing as err:
        pytest.fail(str(err)) if REQUIRED else pytest.skip(str(err))
    cp.start()
    hami = None
    try:
        try:
            start_controller_manager(cp)
        except BinariesMissing as err:
            pytest.fail(str(err)) if REQUIRED else pytest.skip(str(err))
        client = cp.client()
        ensure_namespace(client, NS)
        client.create(codecs.from_dict({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}))
        tls = Tls(work / "tls")
        hami = HamiProcess(cp, tls, work, args=["--dra-mode", "--scheduler-name=",
                                                "--dra-template-idle=5s"],
                           name="hami-dra").start()
        client.create(codecs.from_dict(webhook_configuration("hami-churn", hami.url,
                                                             tls.ca_pem)))
        wait_webhook_serving(client, NS)
        yield {"cp": cp, "client": client, "hami": hami}
    finally:
        if hami is not None:
            hami.stop()
        cp.stop()


def test_churn_ends_with_the_object_counts_it_started_with(bed: dict[str, Any]) -> None:
    client = bed["client"]
    before = counts(client, NS)
    stats = churn(client, NS, PODS, seed=30, batch=25, timeout_s=90)
    assert stats["templates_seen"] > 0, stats  # the pods did get hami templates
    after = wait_counts(client, NS, before, timeout_s=60)
    print(f"churn: {stats}; before {before}; after {after}")
    assert after == before, (before, after, stats, bed["hami"].log_tail())
