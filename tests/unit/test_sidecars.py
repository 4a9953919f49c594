"""Sidecars (restartable init containers, ``restartPolicy: Always``, Kubernetes KEP-753)
are charged for the pod's life: the collapse, the effective request, the ledger's shrink,
the fit (issue 25 item 1). Each test fails where a sidecar is taken for an ordinary init
container (max(init, Σ app), fitted on a fresh copy of the node)."""

from __future__ import annotations

import json

from hami.api import names
from hami.core.collapse import APP, INIT, SIDECAR, collapse, effective_request, pod_charges
from hami.core.model import ContainerDevice, DeviceCharge
from hami.core.podobjects import init_containers_done, sidecar_positions
from hami.core.request import pod_request
from hami.core.state import ClusterState
from hami.devices.registry import make_config

REGISTER = json.dumps([{"id": "G0", "count": 10, "devmem": 16384, "devcore": 100,
                        "type": "NVIDIA-A10", "health": True}])


def dev(mem: int, cores: int = 0, uuid: str = "G0") -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid, "NVIDIA", mem, cores),)


def gpu(mem: int, cores: int | None = None) -> dict:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    return {"limits": limits}


def ctr(name: str, mem: int | None, sidecar: bool = False, **extra) -> dict:
    c = {"name": name, "image": "x", **extra}
    if mem is not None:
        c["resources"] = gpu(mem)
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(init: list[dict], app: list[dict], namespace: str = "a", name: str = "p") -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}"},
            "spec": {"schedulerName": "hami-scheduler", "initContainers": init,
                     "containers": app},
            "status": {"phase": "Pending"}}


def node() -> dict:
    return {"kind": "Node", "metadata": {"name": "n", "annotations": {
        names.NODE_REGISTER: REGISTER}}}


def used(state: ClusterState) -> list[tuple[int, int, int]]:
    return [(s, m, c) for _, s, m, c in state.ledger.device_usage("n")]


# --- the collapse ------------------------------------------------------------------------

def test_a_sidecar_adds_to_the_app_containers() -> None:
    charge = collapse([(SIDECAR, dev(10000, 20)), (APP, dev(10000, 30))])
    assert charge == (DeviceCharge("G0", 20000, 50, 2),)


def test_a_sidecar_adds_to_the_init_containers_after_it_not_before() -> None:
    # init0 (12000) runs alone; init2 (9000) runs beside the sidecar (5000): 14000
    parts = [(INIT, dev(12000)), (SIDECAR, dev(5000)), (INIT, dev(9000)), (APP, dev(1000))]
    assert collapse(parts) == (DeviceCharge("G0", 14000, 0, 2),)
    # the same containers with the sidecar first: both init containers run beside it
    first = [(SIDECAR, dev(5000)), (INIT, dev(12000)), (INIT, dev(9000)), (APP, dev(1000))]
    assert collapse(first) == (DeviceCharge("G0", 17000, 0, 2),)


def test_without_sidecars_the_collapse_is_hami_s() -> None:
    parts = [(INIT, dev(8000, 10)), (INIT, dev(3000, 40)), (APP, dev(2000, 10)),
             (APP, dev(2000, 10))]
    assert collapse(parts) == (DeviceCharge("G0", 8000, 40, 2),)


def test_the_grant_collapses_with_the_sidecar_positions() -> None:
    grant = (dev(6000), dev(6000))
    assert pod_charges(grant, 1) == (DeviceCharge("G0", 6000, 0, 1),)  # ordinary init
    assert pod_charges(grant, 1, frozenset({0})) == (DeviceCharge("G0", 12000, 0, 2),)


def test_effective_request_follows_kubernetes() -> None:
    assert effective_request([(SIDECAR, 10000, 0), (APP, 10000, 0)]) == (20000, 0)
    assert effective_request([(INIT, 4000, 90), (SIDECAR, 1000, 10), (INIT, 3500, 50),
                              (APP, 2000, 20)]) == (4500, 90)


# --- what the pod asks for -----------------------------------------------------------------

def test_only_restart_policy_always_makes_a_sidecar() -> None:
    p = pod([ctr("s", 1000, sidecar=True), ctr("i", 1000, restartPolicy="always"),
             ctr("j", 1000, restartPolicy="OnFailure")], [ctr("c", 1000)])
    assert sidecar_positions(p) == frozenset({0})
    assert sidecar_positions({"spec": {"initContainers": "x"}}) == frozenset()
    assert sidecar_positions({"spec": None}) == frozenset()


def test_cpu_and_memory_requests_add_the_sidecar() -> None:
    res = {"requests": {"cpu": "2", "memory": "3Gi"}}
    p = pod([{"name": "s", "restartPolicy": "Always", "resources": res}],
            [{"name": "c", "resources": res}])
    request = pod_request(p, make_config().registry)
    assert (request.cpu_milli, request.memory_mib, request.sidecars) == (4000, 6144,
                                                                         frozenset({0}))
    del p["spec"]["initContainers"][0]["restartPolicy"]
    request = pod_request(p, make_config().registry)
    assert (request.cpu_milli, request.memory_mib) == (2000, 3072)


# --- the ledger -------------------------------------------------------------------------

def test_a_bound_pod_books_its_sidecar_for_its_life() -> None:
    state = ClusterState(make_config())
    state.upsert_node(node())
    p = pod([ctr("warm", 8000), ctr("side", 6000, sidecar=True)], [ctr("c", 6000)])
    p["metadata"]["annotations"] = {
        names.VGPU_NODE: "n",
        names.DEVICES_ALLOCATED: "G0,NVIDIA,8000,0:;G0,NVIDIA,6000,0:;G0,NVIDIA,6000,0:;"}
    p["status"] = {"phase": "Pending"}
    state.upsert_pod(p)
    assert used(state) == [(2, 12000, 0)]  # max(8000, 6000 + 6000)
    # the ordinary init container finished, the sidecar runs: sidecar + app stay booked
    p["status"] = {"phase": "Running", "initContainerStatuses": [
        {"name": "warm", "state": {"terminated": {"exitCode": 0}}},
        {"name": "side", "state": {"running": {}}}]}
    assert init_containers_done(p)
    state.upsert_pod(p)
    assert used(state) == [(2, 12000, 0)]
    assert state.quota.namespaces()["a"].memory_used_mib == 12000


def test_a_restarting_sidecar_does_not_hold_back_the_shrink() -> None:
    p = pod([ctr("warm", 1), ctr("side", 1, sidecar=True)], [ctr("c", 1)])
    p["status"] = {"initContainerStatuses": [
        {"name": "warm", "state": {"terminated": {"exitCode": 0}}},
        {"name": "side", "state": {"terminated": {"exitCode": 137}}}]}
    assert init_containers_done(p)
    p["status"]["initContainerStatuses"][0]["state"] = {"running": {}}
    assert not init_containers_done(p)


# --- the fit -----------------------------------------------------------------------------

def test_sidecar_and_app_are_fitted_on_one_state() -> None:
    """The attack: 10000 + 10000 MiB on a 16384 MiB card (issue 25: placed, charged 10000)."""
    state = ClusterState(make_config())
    state.upsert_node(node())
    attack = pod([ctr("side", 10000, sidecar=True)], [ctr("c", 10000)])
    decision = state.filter(attack)
    assert decision.result.node is None
    assert decision.result.failed_nodes == {"n": "1/1 CardInsufficientMemory"}


def test_an_init_container_after_a_sidecar_fits_beside_it() -> None:
    state = ClusterState(make_config())
    state.upsert_node(node())
    # the init container alone would fit (12000 <= 16384), beside the sidecar it does not
    late = pod([ctr("side", 6000, sidecar=True), ctr("warm", 12000)], [ctr("c", 1000)])
    assert state.filter(late).result.node is None
    early = pod([ctr("warm", 12000), ctr("side", 6000, sidecar=True)], [ctr("c", 1000)])
    decision = state.filter(early)
    assert decision.result.node == "n"
    state.commit(early, decision)
    assert used(state) == [(2, 12000, 0)]  # max(12000, 6000 + 1000)


def test_honest_sidecar_is_booked_so_a_neighbour_stays_off_the_card() -> None:
    state = ClusterState(make_config())
    state.upsert_node(node())
    honest = pod([ctr("side", 6000, sidecar=True)], [ctr("c", 6000)])
    decision = state.filter(honest)
    assert decision.result.node == "n"
    assert [d[0].used_memory_mib for d in decision.result.devices] == [6000, 6000]
    state.commit(honest, decision)
    assert used(state) == [(2, 12000, 0)]
    neighbour = pod([], [ctr("c", 6000)], namespace="b", name="q")
    assert state.filter(neighbour).result.node is None  # 12000 + 6000 > 16384


def test_a_gpu_sidecar_takes_the_node_lock_as_an_app_container_does() -> None:
    """HAMi takes a vendor's node lock only for devices of a regular container; a sidecar
    runs beside them, so a pod whose GPU is in its sidecar alone locks too."""
    state = ClusterState(make_config())
    state.upsert_node(node())
    p = pod([ctr("side", 2000, sidecar=True)], [ctr("c", None)])
    decision = state.filter(p)
    state.commit(p, decision)
    assert state.lock_vendors("u-p") == ("NVIDIA",)
    ordinary = pod([ctr("warm", 2000)], [ctr("c", None)], name="o")
    state.commit(ordinary, state.filter(ordinary))
    assert state.lock_vendors("u-o") == ()
