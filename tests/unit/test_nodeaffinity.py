"""hami.core.nodeaffinity: Kubernetes' required node affinity, honest and hostile shapes."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.nodeaffinity import required_affinity_admits, selector_matches, term_matches

LABELS = {"zone": "a", "gpu": "a100", "gen": "8", "big": "99999999999999999999", "word": "x"}


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    req: dict[str, Any] = {"key": key, "operator": op}
    if values:
        req["values"] = list(values)
    return req


def _spec(*terms: Any) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(("req", "holds"), [
    (_expr("zone", "In", "a", "b"), True),
    (_expr("zone", "In", "b"), False),
    (_expr("absent", "In", "a"), False),
    (_expr("zone", "NotIn", "b"), True),
    (_expr("zone", "NotIn", "a"), False),
    (_expr("absent", "NotIn", "a"), True),  # NotIn holds when the label is absent
    (_expr("zone", "Exists"), True),
    (_expr("absent", "Exists"), False),
    (_expr("zone", "DoesNotExist"), False),
    (_expr("absent", "DoesNotExist"), True),
    (_expr("gen", "Gt", "7"), True),
    (_expr("gen", "Gt", "8"), False),
    (_expr("gen", "Lt", "9"), True),
    (_expr("gen", "Lt", "8"), False),
    (_expr("gen", "Gt", "-3"), True),
    (_expr("gen", "Gt", "+7"), True),
    (_expr("absent", "Gt", "1"), False),
    (_expr("absent", "Lt", "1"), False),
    (_expr("word", "Lt", "1"), False),  # a label that is no integer: no match
    (_expr("big", "Gt", "1"), False),  # beyond int64: no integer
])
def test_each_operator(req: dict[str, Any], holds: bool) -> None:
    assert term_matches({"matchExpressions": [req]}, "n0", LABELS) is holds


def test_expressions_and_fields_are_anded_terms_ored() -> None:
    in_a = _expr("zone", "In", "a")
    in_b = _expr("zone", "In", "b")
    name_n0 = {"key": "metadata.name", "operator": "In", "values": ["n0"]}
    not_n0 = {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}
    assert required_affinity_admits(_spec({"matchExpressions": [in_a, _expr("gpu", "Exists")]}),
                                    "n0", LABELS)
    assert not required_affinity_admits(_spec({"matchExpressions": [in_a, in_b]}), "n0", LABELS)
    assert required_affinity_admits(_spec({"matchExpressions": [in_a], "matchFields": [name_n0]}),
                                    "n0", LABELS)
    assert not required_affinity_admits(_spec({"matchExpressions": [in_a],
                                               "matchFields": [name_n0]}), "n1", LABELS)
    assert required_affinity_admits(_spec({"matchFields": [not_n0]}), "n1", LABELS)
    assert not required_affinity_admits(_spec({"matchFields": [not_n0]}), "n0", LABELS)
    # ORed: the second term lets n0 in
    assert required_affinity_admits(_spec({"matchExpressions": [in_b]},
                                          {"matchExpressions": [in_a]}), "n0", LABELS)
    assert not required_affinity_admits(_spec({"matchExpressions": [in_b]},
                                              {"matchFields": [not_n0]}), "n0", LABELS)


def test_no_affinity_admits_and_empty_selectors_admit_nothing() -> None:
    specs: list[dict[str, Any]] = [{}, {"affinity": None}, {"affinity": {}}, {"affinity": {"nodeAffinity": None}},
                 {"affinity": {"nodeAffinity": {}}},
                 {"affinity": {"nodeAffinity": {
                     "requiredDuringSchedulingIgnoredDuringExecution": None}}},
                 {"affinity": {"podAntiAffinity": {"x": 1}}}]
    for spec in specs:
        assert required_affinity_admits(spec, "n0", LABELS), spec
    # an empty term list, an empty term, a required selector without terms: no node
    assert not required_affinity_admits(_spec(), "n0", LABELS)
    assert not required_affinity_admits(_spec({}), "n0", LABELS)
    assert not required_affinity_admits(_spec({"matchExpressions": [], "matchFields": []}),
                                        "n0", LABELS)
    assert not required_affinity_admits({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {}}}}, "n0", LABELS)


@pytest.mark.parametrize("req", [
    _expr("zone", "in", "a"),  # operators are case-sensitive
    _expr("zone", "Equals", "a"),
    {"key": "zone", "operator": None, "values": ["a"]},
    _expr("zone", "In"),  # In/NotIn need values
    _expr("zone", "NotIn"),
    _expr("zone", "Exists", "a"),  # Exists/DoesNotExist take none
    _expr("absent", "DoesNotExist", "a"),
    _expr("gen", "Gt"),
    _expr("gen", "Gt", "1", "2"),
    _expr("gen", "Gt", "seven"),
    _expr("gen", "Lt", " 9"),
    _expr("gen", "Lt", "9_0"),
    _expr("gen", "Gt", "99999999999999999999"),
    {"key": "", "operator": "DoesNotExist"},
    {"key": 5, "operator": "DoesNotExist"},
    {"operator": "DoesNotExist"},
    {"key": "absent", "operator": "NotIn", "values": "a"},
    {"key": "absent", "operator": "NotIn", "values": [1]},
    {"key": "absent", "operator": "NotIn", "values": {"a": 1}},
    "absent",
    None,
    7,
])
def test_a_malformed_expression_fails_its_term_closed(req: Any) -> None:
    # each would hold, or be ignored, if the malformed requirement were skipped
    term = {"matchExpressions": [_expr("zone", "In", "a"), req]}
    assert not term_matches(term, "n0", LABELS)
    assert not required_affinity_admits(_spec(term), "n0", LABELS)
    # another, well-formed term still admits, as kube-scheduler ORs the terms
    assert required_affinity_admits(_spec(term, {"matchExpressions": [_expr("gpu", "Exists")]}),
                                    "n0", LABELS)


@pytest.mark.parametrize("req", [
    {"key": "metadata.name", "operator": "In", "values": ["n0", "n1"]},  # exactly one
    {"key": "metadata.name", "operator": "In", "values": []},
    {"key": "metadata.name", "operator": "In"},
    {"key": "metadata.name", "operator": "Exists"},
    {"key": "metadata.name", "operator": "DoesNotExist"},
    {"key": "metadata.namespace", "operator": "NotIn", "values": ["x"]},
    {"key": "spec.unschedulable", "operator": "NotIn", "values": ["true"]},
    {"key": "metadata.name", "operator": "NotIn", "values": [None]},
    ["metadata.name"],
])
def test_a_malformed_field_requirement_fails_its_term_closed(req: Any) -> None:
    assert not term_matches({"matchFields": [req]}, "n0", LABELS)


@pytest.mark.parametrize("spec", [
    {"affinity": "x"},
    {"affinity": {"nodeAffinity": ["x"]}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": "x"}}}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": {"matchExpressions": []}}}}},
    _spec("term"),
    _spec(None),
    _spec({"matchExpressions": "zone"}),
    _spec({"matchExpressions": {"key": "zone", "operator": "Exists"}}),
    _spec({"matchFields": "metadata.name"}),
    _spec({"matchExpressions": [_expr("zone", "Exists")], "matchFields": 3}),
])
def test_hostile_shapes_fail_closed(spec: dict[str, Any]) -> None:
    assert not required_affinity_admits(spec, "n0", LABELS)


def test_odd_node_labels_do_not_crash() -> None:
    labels: dict[str, Any] = {"zone": None, "gen": 8, "x": ["a"]}
    assert not term_matches({"matchExpressions": [_expr("zone", "In", "a")]}, "n0", labels)
    assert not term_matches({"matchExpressions": [_expr("gen", "Gt", "1")]}, "n0", labels)
    assert term_matches({"matchExpressions": [_expr("x", "DoesNotExist")]}, "n0", labels)
    assert not selector_matches("x", "n0", labels)
    assert not selector_matches({"nodeSelectorTerms": None}, "n0", labels)
