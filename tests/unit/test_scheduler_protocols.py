"""Pure decisions of the scheduler process: node lock (spec §4.11, B01, B02), node health
and handshake (§4.13, B20, B25), Lease election, extender wire parsing (§4.1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hami.extender.wire import WireError, filter_result, parse_bind_args, parse_filter_args
from hami.scheduler.lease import lease_step, micro_time, release_spec
from hami.scheduler.nodelock import (
    LockAction,
    contention_message,
    lock_step,
    max_lock_age,
    owner_awaits_allocate,
    owner_is_dangling,
    parse_go_duration,
    release_step,
    waiting_message,
)
from hami.scheduler.registration import check_node

NOW = datetime(2026, 8, 21, 6, 20, 39, tzinfo=UTC)
FIVE_MIN = timedelta(minutes=5)


def stamp(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------- node lock
@pytest.mark.parametrize(("value", "action"), [
    (None, LockAction.SET),
    ("", LockAction.SET),
    (f"{stamp(NOW)},team-x,worker", LockAction.HELD),
    (f"{stamp(NOW)},team-x,worker-123", LockAction.CHECK_OWNER),
    (f"{stamp(NOW)},team-x,work", LockAction.CHECK_OWNER),
    # expired: the owner may still wait for Allocate, so it is asked first ...
    (f"{stamp(NOW - timedelta(minutes=6))},team-x,worker-123", LockAction.CHECK_WAITING),
    # ... unless the lock is ours, or older than max_lock_age (6 x 5m)
    (f"{stamp(NOW - timedelta(minutes=6))},team-x,worker", LockAction.TAKE_OVER),
    (f"{stamp(NOW - timedelta(minutes=29))},team-x,worker-123", LockAction.CHECK_WAITING),
    (f"{stamp(NOW - timedelta(minutes=31))},team-x,worker-123", LockAction.TAKE_OVER),
    (stamp(NOW), LockAction.CONTENDED),  # legacy: no owner to check
    (stamp(NOW - timedelta(minutes=6)), LockAction.TAKE_OVER),  # legacy: expiry as in HAMi
    (f"{stamp(NOW)},team-x,", LockAction.CONTENDED),  # incomplete owner: like legacy
    (f"{stamp(NOW - timedelta(minutes=6))},,worker-123", LockAction.TAKE_OVER),
    ("garbage", LockAction.MALFORMED),
    ("a,b", LockAction.MALFORMED),
    (f"{stamp(NOW)},a,b,c", LockAction.MALFORMED),
])
def test_lock_step(value: str | None, action: LockAction) -> None:
    assert lock_step(value, NOW, FIVE_MIN, "team-x", "worker").action is action


def test_b01_release_by_name_prefix_is_a_no_op() -> None:
    """B01: team-x/worker must not release team-x/worker-123's lock (exact owner only)."""
    held = f"{stamp(NOW)},team-x,worker-123"
    assert not release_step(held, "team-x", "worker")
    assert not release_step(held, "team-x", "worker-12")
    assert not release_step(held, "team", "worker-123")
    assert release_step(held, "team-x", "worker-123")
    assert release_step(held, "team-x", "worker", force=True)
    # ... and the next pod sees contention (after checking that the owner exists).
    assert lock_step(held, NOW, FIVE_MIN, "team-y", "other").action is LockAction.CHECK_OWNER


def test_b02_dangling_owner_is_taken_over() -> None:
    """B02: an owner that no longer exists (or is terminal) does not block the node."""
    assert owner_is_dangling(None)
    assert owner_is_dangling({"status": {"phase": "Failed"}})
    assert owner_is_dangling({"status": {"phase": "Succeeded"}})
    assert not owner_is_dangling({"status": {"phase": "Pending"}})
    assert not owner_is_dangling({"status": {}})


def _owner(phase: str | None = "Pending", node_name: str | None = "n1",
           vgpu_node: str | None = "n1", bind_phase: str | None = "allocating") -> dict:
    ann = {k: v for k, v in (("hami.io/vgpu-node", vgpu_node),
                              ("hami.io/bind-phase", bind_phase)) if v is not None}
    return {"metadata": {"name": "pod-a", "namespace": "ns1", "annotations": ann},
            "spec": {"nodeName": node_name} if node_name is not None else {},
            "status": {"phase": phase} if phase is not None else {}}


@pytest.mark.parametrize(("owner", "waits"), [
    (_owner(), True),                                   # bound, Allocate not seen yet
    (_owner(node_name=None), True),                     # lock taken, Binding not written yet
    (_owner(phase=None), True),
    (None, False),                                      # gone
    (_owner(phase="Failed"), False),                    # terminal
    (_owner(phase="Succeeded"), False),
    (_owner(phase="Running"), False),                   # admitted: its Allocate is done
    (_owner(bind_phase="success"), False),              # the device plugin served it
    (_owner(bind_phase="failed"), False),               # ... or refused it
    (_owner(bind_phase=None), False),
    (_owner(node_name="n2", vgpu_node="n2"), False),    # on another node
    (_owner(node_name="n2", vgpu_node="n1"), False),    # bound elsewhere: spec.nodeName wins
    (_owner(node_name=None, vgpu_node="n2"), False),
    (_owner(node_name=None, vgpu_node=None), False),
    ({"metadata": "x", "spec": [], "status": 3}, False),  # junk never raises
])
def test_expired_lock_is_kept_while_its_owner_waits_for_allocate(owner: dict | None,
                                                                 waits: bool) -> None:
    """Issue 11 item 7: an expired lock is only taken from an owner that is gone,
    finished allocating (success/failed, or running) or not on this node."""
    assert owner_awaits_allocate(owner, "n1") is waits


def test_waiting_lock_message_is_contention() -> None:
    lock = lock_step(f"{stamp(NOW - timedelta(minutes=6))},ns1,pod-a", NOW, FIVE_MIN,
                     "ns2", "pod-b").lock
    assert lock is not None
    msg = waiting_message("n1", lock, FIVE_MIN)
    assert msg == ("node n1 is locked by ns1/pod-a, which still waits for the device plugin's "
                   "Allocate (kept up to 30m0s): node lock contention")
    assert max_lock_age(FIVE_MIN) == timedelta(minutes=30)


def test_release_of_unparsable_or_absent_lock() -> None:
    assert not release_step(None, "a", "b")
    assert not release_step("garbage", "a", "b")
    assert release_step("garbage", "a", "b", force=True)
    assert not release_step(stamp(NOW), "a", "b")  # legacy: nobody's


def test_messages_and_durations() -> None:
    assert contention_message("n1", FIVE_MIN) == (
        "node n1 has been locked within 5m0s: node lock contention")
    assert parse_go_duration("5m") == FIVE_MIN
    assert parse_go_duration("1h30m") == timedelta(minutes=90)
    assert parse_go_duration("500ms") == timedelta(milliseconds=500)
    assert parse_go_duration("0") == timedelta(0)
    for bad in ("5", "m", "5x", "-5s", "5m junk"):
        with pytest.raises(ValueError):
            parse_go_duration(bad)


# ---------------------------------------------------------------- registration
LOCAL = datetime(2026, 8, 21, 8, 0, 0)


def node(handshake: str | None = None, gpus: int = 40) -> dict:
    ann = {} if handshake is None else {"hami.io/node-handshake": handshake}
    return {"metadata": {"name": "n", "annotations": ann},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def wall(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S")


def test_handshake_absent_or_reported_is_requested() -> None:
    for value in (None, "Reported_2026-08-21 07:59:00"):
        health = check_node(node(value), None, LOCAL)
        assert health.healthy and health.handshake == f"Requesting_{wall(LOCAL)}"


def test_requesting_handshake() -> None:
    young = node(f"Requesting_{wall(LOCAL - timedelta(seconds=10))}", gpus=0)
    old = node(f"Requesting_{wall(LOCAL - timedelta(seconds=90))}", gpus=0)
    assert check_node(young, 0, LOCAL).healthy
    assert not check_node(old, 0, LOCAL).healthy  # device plugin gone, no GPUs left
    assert check_node(node(f"Requesting_{wall(LOCAL - timedelta(minutes=9))}"), 40, LOCAL).healthy
    assert check_node(node("Requesting_garbage", gpus=0), 0, LOCAL).healthy


def test_b20_deleted_handshake_recovers_after_cooldown() -> None:
    old = check_node(node(f"Deleted_{wall(LOCAL - timedelta(minutes=10))}"), None, LOCAL)
    assert old.healthy and old.handshake == f"Requesting_{wall(LOCAL)}"
    recent = check_node(node(f"Deleted_{wall(LOCAL - timedelta(seconds=20))}"), None, LOCAL)
    assert not recent.healthy and recent.handshake is None
    unreadable = check_node(node("Deleted_yesterday"), None, LOCAL)
    assert not unreadable.healthy and unreadable.handshake is None


def test_gpus_gone_makes_node_unhealthy() -> None:
    """B25: a node whose device plugin stopped advertising GPUs is dropped."""
    ok = f"Requesting_{wall(LOCAL)}"
    assert not check_node(node(ok, gpus=0), 40, LOCAL).healthy
    assert check_node(node(ok, gpus=40), 40, LOCAL).healthy
    assert check_node(node(ok, gpus=0), None, LOCAL).healthy  # never had any: handshake decides


# ---------------------------------------------------------------------- lease
def test_lease_acquire_renew_wait_take_over() -> None:
    dur = timedelta(seconds=15)
    first = lease_step(None, "a", NOW, dur)
    assert first.leader and first.spec and first.spec["holderIdentity"] == "a"
    renew = lease_step(first.spec, "a", NOW + timedelta(seconds=5), dur)
    assert renew.leader and renew.spec["renewTime"] == micro_time(NOW + timedelta(seconds=5))
    assert renew.spec["leaseTransitions"] == 0
    wait = lease_step(renew.spec, "b", NOW + timedelta(seconds=10), dur)
    assert not wait.leader and wait.spec is None and wait.holder == "a"
    take = lease_step(renew.spec, "b", NOW + timedelta(seconds=21), dur)
    assert take.leader and take.spec["holderIdentity"] == "b"
    assert take.spec["leaseTransitions"] == 1
    freed = release_spec(take.spec, "b", NOW + timedelta(seconds=22))
    assert freed is not None and freed["holderIdentity"] is None
    assert lease_step(freed, "a", NOW + timedelta(seconds=22), dur).leader
    assert release_spec(take.spec, "a", NOW) is None


# ----------------------------------------------------------------------- wire
def test_filter_args_go_field_names_case_insensitive() -> None:
    args = parse_filter_args(b'{"pod": {"metadata": {"name": "p"}}, "nodenames": ["a", "b"]}')
    assert args.pod["metadata"]["name"] == "p" and args.node_names == ["a", "b"]
    assert args.nodes is None
    full = parse_filter_args(b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}}')
    assert full.nodes == [{"metadata": {"name": "a"}}]


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b"null", b'{"Pod": null}', b'{"Pod": 1}', b'{"Pod": {"spec": 1}}',
    b'{"Pod": {}, "NodeNames": "a"}', b'{"Pod": {}, "NodeNames": [1]}',
    b'{"Pod": {}, "Nodes": []}', b'{"Pod": {}, "Nodes": {"items": [1]}}', b"\xff\xfe",
])
def test_bad_filter_args(body: bytes) -> None:
    with pytest.raises(WireError):
        parse_filter_args(body)


def test_bind_args_and_results() -> None:
    args = parse_bind_args(b'{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"}')
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ns", "u", "n")
    for bad in (b'{"PodName": 1, "Node": "n"}', b'{"Node": "n"}', b'{"PodName": "p"}'):
        with pytest.raises(WireError):
            parse_bind_args(bad)
    assert filter_result(node_names=["n"]) == {
        "Nodes": None, "NodeNames": ["n"], "FailedNodes": None,
        "FailedAndUnresolvableNodes": None, "Error": ""}


# --------------------------------------------------------------- never raise
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=500, deadline=None)
@given(value=st.one_of(st.none(), st.text(max_size=60),
                       st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}(Z|[+-][0-9]{2}:[0-9]{2}),[a-z,]*")),
       ns=st.text(max_size=10), name=st.text(max_size=10))
def test_lock_decisions_never_raise(value: str | None, ns: str, name: str) -> None:
    step = lock_step(value, NOW, FIVE_MIN, ns, name)
    assert isinstance(step.action, LockAction)
    assert isinstance(release_step(value, ns, name), bool)


@settings(max_examples=500, deadline=None)
@given(handshake=st.one_of(st.none(), st.text(max_size=40),
                           st.text(max_size=25).map(lambda t: "Requesting_" + t),
                           st.text(max_size=25).map(lambda t: "Deleted_" + t)),
       gpus=st.one_of(st.text(max_size=8), st.integers(-5, 100).map(str)),
       reported=st.one_of(st.none(), st.integers(0, 100)))
def test_health_decisions_never_raise(handshake: str | None, gpus: str, reported: int | None) -> None:
    n = node(handshake)
    n["status"]["allocatable"]["nvidia.com/gpu"] = gpus
    health = check_node(n, reported, LOCAL)
    assert isinstance(health.healthy, bool) and health.reported >= 0


def test_follow_mode_leads_only_while_the_lease_holder_is_this_host():
    from datetime import UTC, datetime, timedelta

    from hami.scheduler.lease import follows_as_leader, micro_time

    now = datetime(2026, 1, 1, tzinfo=UTC)
    fresh = {"holderIdentity": "sched-pod-7_3f2a", "leaseDurationSeconds": 15,
             "renewTime": micro_time(now - timedelta(seconds=5))}
    assert follows_as_leader(fresh, "sched-pod-7", now)
    assert not follows_as_leader(fresh, "sched-pod-8", now)
    assert not follows_as_leader({**fresh, "renewTime": micro_time(now - timedelta(seconds=20))},
                                 "sched-pod-7", now)
    assert not follows_as_leader(None, "sched-pod-7", now)
    assert not follows_as_leader({**fresh, "renewTime": "garbage"}, "sched-pod-7", now)
