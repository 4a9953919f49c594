"""Property tests: no sequence of admissions, placements and deletions ever puts more
memory, cores or tasks on a GPU than it has, and the incremental ledger always equals a
recount from scratch."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core.admission import admit
from hami.core.collapse import pod_charges
from hami.core.config import SchedulingPolicy
from hami.core.model import DeviceInfo
from hami.core.request import RequestError
from hami.core.state import ClusterState
from hami.devices.registry import make_config
from tests.builders import container, pod

gpu = st.builds(lambda mem, split, cores: (mem, split, cores),
                st.sampled_from([1000, 8000, 16384, 40960]), st.integers(1, 6),
                st.sampled_from([100, 100, 200]))
node = st.lists(gpu, min_size=1, max_size=4)
limits = st.fixed_dictionaries({"gpu": st.integers(1, 3)}, optional={
    "gpumem": st.integers(0, 20000), "gpumem_percentage": st.integers(0, 100),
    "gpucores": st.integers(0, 100)})
ctr = st.one_of(limits, st.just({}))
pod_spec = st.tuples(st.lists(ctr, min_size=0, max_size=2), st.lists(ctr, min_size=1, max_size=3),
                     st.sampled_from(["spread", "binpack", "mutex", "topology-aware"]))
step = st.one_of(pod_spec.map(lambda p: ("add", p)), st.integers(0, 30).map(lambda i: ("del", i)))


def check_capacity_and_consistency(state: ClusterState) -> None:
    ledger = state.ledger
    n = ledger.size
    assert (ledger.used_memory_mib[:n] <= ledger.total_memory_mib[:n]).all()
    assert (ledger.used_cores[:n] <= ledger.total_cores[:n]).all()
    assert (ledger.used_slots[:n] <= ledger.split_count[:n]).all()
    assert (ledger.used_memory_mib[:n] >= 0).all() and (ledger.used_slots[:n] >= 0).all()
    recount: dict[str, list[int]] = {}
    for entry in ledger.pods():
        for c in pod_charges(entry.devices, entry.n_init):
            agg = recount.setdefault(c.uuid, [0, 0, 0])
            agg[0] += c.memory_mib
            agg[1] += c.cores_percent
            agg[2] += c.slots
    for name in ledger.node_names():
        for info, slots, mem, cores in ledger.device_usage(name):
            assert [mem, cores, slots] == recount.get(info.uuid, [0, 0, 0])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node, min_size=1, max_size=4), steps=st.lists(step, max_size=25),
       node_policy=st.sampled_from(["binpack", "spread"]))
def test_no_gpu_is_ever_overcommitted(nodes, steps, node_policy):
    config = make_config(policy=SchedulingPolicy(node_policy=node_policy))
    state = ClusterState(config)
    for n, gpus in enumerate(nodes):
        state.ledger.add_node(f"n{n}", [
            DeviceInfo(f"n{n}-G{i}", i, split, mem, cores, "NVIDIA-X")
            for i, (mem, split, cores) in enumerate(gpus)])
    placed: list[str] = []
    for k, (kind, arg) in enumerate(steps):
        if kind == "del":
            if placed:
                state.remove_pod(placed.pop(arg % len(placed)))
        else:
            init, app, gpu_policy = arg
            p = pod(f"p{k}", [container(f"c{i}", **c) for i, c in enumerate(app)],
                    [container(f"i{i}", **c) for i, c in enumerate(init)] or None,
                    annotations={"hami.io/gpu-scheduler-policy": gpu_policy})
            verdict = admit(p, config, state.quota)
            if not verdict.allowed:
                continue
            try:
                decision = state.filter(verdict.pod)
            except RequestError:
                continue
            if decision.result.node:
                state.commit(verdict.pod, decision)
                placed.append(verdict.pod["metadata"]["uid"])
                for ctr_devices in decision.result.devices:
                    assert len({d.uuid for d in ctr_devices}) == len(ctr_devices)
        check_capacity_and_consistency(state)
