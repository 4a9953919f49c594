"""ExtenderPreemptionArgs parsing (k8s.io/kube-scheduler/extender/v1): both shapes, and
hostile bodies that must end in WireError, never another exception."""

from __future__ import annotations

import json

import pytest

from hami.extender.wire import WireError, parse_preempt_args, preempt_result

POD = {"metadata": {"name": "p", "uid": "u"}}


def test_meta_and_full_victims() -> None:
    args = parse_preempt_args(json.dumps({"Pod": POD, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "a"}, {"uid": "b"}], "NumPDBViolations": 1}}}).encode())
    assert args.victims == {"n1": ("a", "b")} and args.violations == {"n1": 1}
    args = parse_preempt_args(json.dumps({"pod": POD, "NodeNameToVictims": {
        "n2": {"Pods": [{"metadata": {"uid": "c"}}], "NumPDBViolations": 0}}}).encode())
    assert args.victims == {"n2": ("c",)}
    assert preempt_result({"n1": (["a"], 2)}) == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "a"}], "NumPDBViolations": 2}}}


@pytest.mark.parametrize("body", [
    b"", b"[]", b'{"Pod": 3}', b'{"Pod": {}, "NodeNameToMetaVictims": []}',
    b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": 5}}}',
    b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 5}]}}}',
    b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": true}}}',
    b'{"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {}}]}}}',
    b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": ["x"]}}}',
    b'{"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [{"metadata": [1]}]}}}',
    b'{"Pod": {}, "NodeNameToVictims": {"n": 1}}',
])
def test_hostile_bodies_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError):
        parse_preempt_args(body)
