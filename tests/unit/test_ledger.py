"""The incremental usage ledger (spec §4.3, §5.1)."""

from __future__ import annotations

from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, DeviceInfo


def gpus(node, n=2, mem=16000):
    return [DeviceInfo(f"{node}-GPU-{i}", i, 10, mem, 100, "NVIDIA-T4") for i in range(n)]


def grant(*entries):
    return tuple(tuple(ContainerDevice(u, "NVIDIA", m, c) for u, m, c in ctr) for ctr in entries)


def usage(ledger, node):
    return [(s, m, c) for _, s, m, c in ledger.device_usage(node)]


def test_add_and_remove_pod_is_exact():
    ledger = UsageLedger()
    ledger.add_node("a", gpus("a"))
    ledger.add_pod("p1", "a", grant([("a-GPU-0", 1000, 10)], [("a-GPU-0", 500, 5), ("a-GPU-1", 7, 1)]))
    assert usage(ledger, "a") == [(2, 1500, 15), (1, 7, 1)]
    ledger.remove_pod("p1")
    assert usage(ledger, "a") == [(0, 0, 0), (0, 0, 0)]
    assert ledger.remove_pod("p1") is None


def test_init_containers_take_the_peak_and_shrink_later():
    ledger = UsageLedger()
    ledger.add_node("a", gpus("a"))
    devices = grant([("a-GPU-0", 10240, 0)], [("a-GPU-0", 10240, 0)], [("a-GPU-0", 4000, 0)])
    ledger.add_pod("p", "a", devices, n_init=2)
    assert usage(ledger, "a")[0] == (1, 10240, 0)
    ledger.shrink_pod("p")
    assert usage(ledger, "a")[0] == (1, 4000, 0)
    assert ledger.shrink_pod("p") is None


def test_many_nodes_grow_arrays_and_keep_usage():
    ledger = UsageLedger(capacity=2)
    for n in range(50):
        ledger.add_node(f"n{n}", gpus(f"n{n}", 8))
    ledger.add_pod("p", "n49", grant([("n49-GPU-7", 3, 4)]))
    assert usage(ledger, "n49")[7] == (1, 3, 4)
    assert ledger.size == 400 and ledger.node_count == 50


def test_reregistration_keeps_or_rebuilds_usage():
    ledger = UsageLedger()
    ledger.add_node("a", gpus("a"))
    ledger.add_pod("p", "a", grant([("a-GPU-1", 100, 10)]))
    ledger.add_node("a", gpus("a"))  # same devices: nothing changes
    assert usage(ledger, "a")[1] == (1, 100, 10)
    ledger.add_node("a", gpus("a", n=3, mem=24000))  # new devices: usage rebuilt from pods
    assert usage(ledger, "a") == [(0, 0, 0), (1, 100, 10), (0, 0, 0)]
    ledger.remove_node("a")
    assert ledger.node("a") is None and not ledger.healthy[: ledger.size].any()
    assert (ledger.node_of[: ledger.size] == -1).all()
    ledger.add_node("a", gpus("a"))  # back again: its pods count again
    assert usage(ledger, "a")[1] == (1, 100, 10)


def test_unknown_uuid_is_ignored_and_node_score():
    ledger = UsageLedger()
    ledger.add_node("a", gpus("a", n=1, mem=1000))
    ledger.add_pod("p", "a", grant([("elsewhere", 100, 10), ("a-GPU-0", 500, 50)]))
    assert usage(ledger, "a") == [(1, 500, 50)]
    assert ledger.node_scores()[0] == 10 * (1 / 10 + 50 / 100 + 500 / 1000)


def test_negative_usage_in_an_annotation_frees_nothing():
    ledger = UsageLedger()
    ledger.add_node("a", gpus("a", n=1))
    ledger.add_pod("evil", "a", grant([("a-GPU-0", -10000, -50)]))
    assert usage(ledger, "a") == [(1, 0, 0)]


def test_flapping_node_reuses_its_index_and_rows():
    """Health flips re-register the same GPUs with other ``health``; a deleted node comes
    back. Neither may grow the arrays (a long-running scheduler would leak), and usage,
    health and other nodes stay exact."""
    from dataclasses import replace

    ledger = UsageLedger(capacity=4)
    ledger.add_node("a", gpus("a", n=4))
    ledger.add_node("b", gpus("b", n=2))
    ledger.add_pod("p", "a", grant([("a-GPU-2", 100, 10)]))
    ledger.add_pod("q", "b", grant([("b-GPU-1", 50, 5)]))
    size, nodes = ledger.size, ledger.node_count
    for flip in range(200):
        sick = [replace(d, health=d.index != flip % 4) for d in gpus("a", n=4)]
        ledger.add_node("a", sick if flip % 2 else gpus("a", n=4))
        if flip % 7 == 0:
            ledger.remove_node("a")
            ledger.add_node("a", gpus("a", n=4))
    assert (ledger.size, ledger.node_count) == (size, nodes)
    assert usage(ledger, "a")[2] == (1, 100, 10) and usage(ledger, "b")[1] == (1, 50, 5)
    ledger.add_node("a", [replace(d, health=d.index != 3) for d in gpus("a", n=4)])
    entry = ledger.node("a")
    rows = range(entry.offset, entry.offset + 4)
    assert [bool(ledger.healthy[d]) for d in rows] == [True, True, True, False]
    assert int(ledger.sum_used_memory[entry.index]) == 100
    # fewer GPUs fit in the old rows (the spare one is a hole); more GPUs need new rows
    ledger.add_node("a", gpus("a", n=3))
    assert ledger.size == size and int((ledger.node_of[: ledger.size] == entry.index).sum()) == 3
    ledger.add_node("a", gpus("a", n=6))
    assert ledger.size == size + 6 and usage(ledger, "a")[2] == (1, 100, 10)
