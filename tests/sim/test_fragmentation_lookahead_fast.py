"""The look-ahead's plain-Python growth per node state and its per-class least values
(``hami.core.fragmentation.nextrow``, ``lookahead._Least``) against the vectorised
reference, and the task mixes the look-ahead applies to (``lookahead.suits``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.fragmentation import FragmentationScorer, Placement, WorkloadDistribution
from hami.core.fragmentation.lookahead import _growths, _Least, next_growth, suits
from hami.core.fragmentation.nextrow import NextRows
from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, DeviceInfo

SHARES = [100, 150, 250, 300, 450, 500, 600, 750, 900]
FREE = [0, 0, 50, 100, 150, 250, 300, 400, 500, 550, 600, 750, 850, 1000, 1000, 1000]


@st.composite
def mixes(draw: st.DrawFn) -> WorkloadDistribution:
    """A task mix of shares, whole GPUs (1, 2, 4, 8) and CPU-only tasks, CPU and memory
    from a few values (often equal, so that thresholds tie)."""
    n = draw(st.integers(1, 14))
    gpus = draw(st.lists(st.sampled_from([0, 1, 1, 1, 2, 4, 8]), min_size=n, max_size=n))
    shares = draw(st.lists(st.sampled_from([*SHARES, 1000]), min_size=n, max_size=n))
    cpu = draw(st.lists(st.sampled_from([0, 500, 1000, 4000, 8000]), min_size=n, max_size=n))
    mem = draw(st.lists(st.sampled_from([0, 100, 1000, 4000]), min_size=n, max_size=n))
    milli = [s if g == 1 else (1000 if g else 0) for g, s in zip(gpus, shares, strict=True)]
    return WorkloadDistribution.from_tasks(gpus, milli, cpu, mem,
                                           by_resources=draw(st.booleans()))


@st.composite
def states(draw: st.DrawFn, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` node states: free shares of up to 8 GPUs, free CPU and memory (some
    short, some unlimited), a negative free share now and then."""
    gpus = draw(st.integers(1, 8))
    free = np.array(draw(st.lists(st.lists(st.sampled_from(FREE), min_size=gpus,
                                           max_size=gpus), min_size=rows, max_size=rows)))
    if draw(st.booleans()):
        free[0, 0] = -draw(st.sampled_from([100, 300]))
    cpu = np.array(draw(st.lists(st.sampled_from([0, 500, 3000, 9000, 20000, 2**40]),
                                 min_size=rows, max_size=rows)))
    mem = np.array(draw(st.lists(st.sampled_from([0, 500, 3000, 9000, 2**40]),
                                 min_size=rows, max_size=rows)))
    return free, cpu, mem


@settings(max_examples=200, deadline=None)
@given(mixes(), st.data())
def test_next_rows_equal_the_vectorised_growth(dist: WorkloadDistribution,
                                               data: st.DataObject) -> None:
    # Plain Python per state (prefix sums over the classes by need, cached by state)
    # gives exactly numpy's next_growth, whichever order the states come in and
    # whether a state is computed or found in the cache.
    free, cpu, mem = data.draw(states(12))
    want = next_growth(dist, free, cpu, mem)
    rows = NextRows(dist)
    for r in [*range(12), *range(11, -1, -1)]:
        got = rows.growth(free[r].tolist(), int(cpu[r]), int(mem[r]))
        assert np.array_equal(np.array(got), want[r]), (r, got, want[r])
    # The batch path (missing states vectorised at once) stores the same values.
    batch = _growths(NextRows(dist), dist, [(free[r].tolist(), int(cpu[r]), int(mem[r]))
                                            for r in range(12)])
    assert np.array_equal(np.array(batch), want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**31), st.integers(1, 30))
def test_least_follows_the_table(n: int, k: int, seed: int, steps: int) -> None:
    # Per column: the least value, a row holding it, and the least of the other rows,
    # kept as rows change (one, a few or many at once; values tie and reach inf): the
    # same least and second values as searching the whole table each time.
    rng = np.random.default_rng(seed)
    values = np.array([0.0, 1.5, 2.0, 2.0, 3.25, 7.0, np.inf])
    table = rng.choice(values, size=(n, k))
    least = _Least(table)
    for _ in range(steps):
        rows = np.unique(rng.integers(0, n, size=int(rng.choice([1, 2, 9]))))
        least.update(table, rows, rng.choice(values, size=(rows.size, k)))
        order = np.sort(table, axis=0)
        assert np.array_equal(least.least, order[0])
        assert np.array_equal(table[least.first, np.arange(k)], order[0])
        second = order[1] if n > 1 else np.full(k, np.inf)
        assert np.array_equal(least.second, second)


def test_suits_mixes_with_whole_gpus_and_few_type_constraints() -> None:
    def mix(gpus: list[int], milli: list[int],
            models: list[tuple[str, ...]] | None = None) -> WorkloadDistribution:
        return WorkloadDistribution.from_tasks(gpus, milli, [0] * len(gpus), [0] * len(gpus),
                                               models)

    assert not suits(mix([1] * 4, [300, 600, 900, 500]))  # no whole GPUs asked
    assert suits(mix([1] * 20, [300] * 19 + [1000]))  # 1000 of 6700 milli: 15 %
    assert suits(mix([1] * 19 + [2], [300] * 19 + [1000]))  # 2000 of 7700: 26 %
    assert not suits(mix([1] * 40, [300] * 39 + [1000]))  # 1000 of 12700: 8 %
    assert suits(mix([1] * 40, [300] * 39 + [1000]), min_whole_demand=0.05)
    # A mix of which many tasks accept only some GPU models.
    constrained = mix([1] * 4, [300, 300, 1000, 1000], [("A100",), (), (), ()])
    assert not suits(constrained)  # a quarter of the tasks
    assert suits(constrained, max_constrained=0.25)
    assert not suits(mix([0, 0], [0, 0]))  # no GPU demand at all


def one_gpu_nodes() -> UsageLedger:
    led = UsageLedger()
    for n in range(2):
        led.add_node(f"n{n}", [DeviceInfo(f"n{n}-g0", 0, 20, 16384, 100, "NVIDIA-T4")],
                     cpu_milli=16000, memory_mib=65536)
    led.add_pod("a", "n0", ((ContainerDevice("n0-g0", "NVIDIA", 4915, 30),),),
                cpu_milli=1000)
    return led


def test_look_ahead_leaves_a_mix_of_shares_to_the_growth() -> None:
    # The hand-made case of test_fragmentation_lookahead (n0 holds a 300m share, n1 is
    # empty; another 300m share): on a mix of shares alone the look-ahead re-ranked n0
    # first; it no longer applies to such a mix (openb gpushare100 lost with it), so the
    # order is the growth's, n1 first, with or without it.
    mix = WorkloadDistribution.from_tasks([1] * 7, [300] * 3 + [600] * 3 + [900],
                                          [1000] * 7, [0] * 7)
    p = Placement(request_milli=300, num_gpu=1, cpu_milli=1000, memory_mib=0)
    idx = np.array([0, 1])
    plain = FragmentationScorer(mix).order(one_gpu_nodes(), p, idx)
    look = FragmentationScorer(mix, look_ahead=True)
    assert plain.tolist() == [1, 0]
    assert look.order(one_gpu_nodes(), p, idx).tolist() == [1, 0]
    assert list(look.best_first(one_gpu_nodes(), p, idx)) == [1, 0]
    # With a 2-GPU class in the mix (whole-GPU demand; it fits neither node, so it grows
    # alike on both) the look-ahead applies and puts n0 first.
    whole = WorkloadDistribution.from_tasks([1] * 7 + [2], [300] * 3 + [600] * 3 + [900, 1000],
                                            [1000] * 8, [0] * 8)
    look = FragmentationScorer(whole, look_ahead=True)
    assert FragmentationScorer(whole).order(one_gpu_nodes(), p, idx).tolist() == [1, 0]
    assert look.order(one_gpu_nodes(), p, idx).tolist() == [0, 1]
    assert list(look.best_first(one_gpu_nodes(), p, idx)) == [0, 1]


def test_live_order_with_the_look_ahead_picks_its_node() -> None:
    # The live scheduler's order class (hami.core.filter's "fragmentation-aware") on the
    # case above, with the mix that has whole-GPU demand: with look_ahead, n0 first, as
    # the simulator's fragmentation-aware+lookahead; by default (off), n1.
    from hami.core.codec import ScoringWeights
    from hami.core.filter import FilterContext
    from hami.core.fit import PodOptions
    from hami.core.fragmentation import LiveFragmentationOrder
    from hami.core.model import ContainerDeviceRequest, PodRequest

    whole = WorkloadDistribution.from_tasks([1] * 7 + [2], [300] * 3 + [600] * 3 + [900, 1000],
                                            [1000] * 8, [0] * 8)
    req = PodRequest("default", "p", "u", (ContainerDeviceRequest(
        1, memory_percent=30, cores_percent=30),), cpu_milli=1000)
    ctx = FilterContext(one_gpu_nodes(), req, PodOptions(gpu_policy="fragmentation-aware"),
                        ScoringWeights())
    idx = np.array([0, 1])
    assert list(LiveFragmentationOrder(fixed=whole, look_ahead=True)(ctx, idx)) == [0, 1]
    assert list(LiveFragmentationOrder(fixed=whole)(ctx, idx)) == [1, 0]
