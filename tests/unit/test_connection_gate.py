"""Who gets a connection when the pod network floods a listener
(:class:`hami.netlimits.ConnectionGate`)."""

from __future__ import annotations

from hami.netlimits import ConnectionGate


def test_one_peer_cannot_take_the_pool() -> None:
    gate = ConnectionGate(256)
    taken = sum(gate.admit("10.0.0.66") for _ in range(256))
    assert taken == 32  # max_remote // 8
    assert gate.admit("10.0.0.1")  # the API server still gets in


def test_the_api_server_keeps_a_reserve_when_many_peers_fill_the_pool() -> None:
    gate = ConnectionGate(256)
    for i in range(8):
        for _ in range(40):
            gate.admit(f"10.0.1.{i}")
    assert gate.remote == 256
    assert not gate.admit("10.0.1.0")  # a flooding peer gets nothing more
    assert [gate.admit("10.0.0.1") for _ in range(5)] == [True] * 4 + [False]
    gate.release("10.0.0.1")
    assert gate.admit("10.0.0.1")
    assert gate.admit("127.0.0.1") and gate.admit("::1")  # kube-scheduler: never refused


def test_small_caps_have_no_reserve() -> None:
    gate = ConnectionGate(3)
    assert [gate.admit("10.0.0.5") for _ in range(4)] == [True, True, True, False]
    gate.release("10.0.0.5")
    assert gate.admit("10.0.0.5")
