"""A pod's required node affinity against a node's name and labels. Pure.

The rules are Kubernetes' ``NodeSelector`` (API reference: ``NodeSelector``,
``NodeSelectorTerm``, ``NodeSelectorRequirement`` in core/v1), as kube-scheduler's
NodeAffinity filter applies ``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``:

* the ``nodeSelectorTerms`` are ORed; an empty list matches no node;
* a term's ``matchExpressions`` (on labels) and ``matchFields`` (on fields) are ANDed;
  a term with neither matches no node;
* label operators: ``In`` and ``NotIn`` take one or more values (``NotIn`` also holds
  when the label is absent); ``Exists`` and ``DoesNotExist`` take none; ``Gt`` and
  ``Lt`` take exactly one, a base-10 64-bit integer, and hold only when the label is
  present and is such an integer greater (less) than it;
* field requirements: only the key ``metadata.name``, with ``In`` or ``NotIn`` and
  exactly one value.

The pod spec is a tenant's: a term that breaks any of these rules (unknown operator,
wrong number of values, a value that is not a string, a field other than
``metadata.name``, a term or requirement that is not an object) matches no node, as
kube-scheduler counts a term it cannot parse as no match. So a malformed term never
admits a node, and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_INT = re.compile(r"[+-]?[0-9]+")
_INT64 = (-(2**63), 2**63 - 1)
_NAME_FIELD = "metadata.name"


class _Malformed(Exception):
    """A term that breaks the API's rules (module docstring): it matches nothing."""


def _int64(text: Any) -> int | None:
    if not isinstance(text, str) or _INT.fullmatch(text) is None:
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def _values(req: Mapping[str, Any]) -> list[str]:
    values = req.get("values")
    if values is None:
        return []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _Malformed
    return values


def _label_holds(req: Any, labels: Mapping[str, Any]) -> bool:
    if not isinstance(req, Mapping):
        raise _Malformed
    key, op, values = req.get("key"), req.get("operator"), _values(req)
    if not isinstance(key, str) or not key:
        raise _Malformed
    present = key in labels and isinstance(labels[key], str)
    value = labels[key] if present else None
    if op in ("In", "NotIn"):
        if not values:
            raise _Malformed
        return (value in values) if op == "In" else (value not in values)
    if op in ("Exists", "DoesNotExist"):
        if values:
            raise _Malformed
        return present if op == "Exists" else not present
    if op in ("Gt", "Lt"):
        bound = _int64(values[0]) if len(values) == 1 else None
        if bound is None:
            raise _Malformed
        have = _int64(value)
        if have is None:
            return False
        return have > bound if op == "Gt" else have < bound
    raise _Malformed


def _field_holds(req: Any, name: str) -> bool:
    if not isinstance(req, Mapping) or req.get("key") != _NAME_FIELD:
        raise _Malformed
    op, values = req.get("operator"), _values(req)
    if op not in ("In", "NotIn") or len(values) != 1:
        raise _Malformed
    return (name == values[0]) if op == "In" else (name != values[0])


def _requirements(term: Mapping[str, Any], field: str) -> list[Any]:
    reqs = term.get(field)
    if reqs is None:
        return []
    if not isinstance(reqs, list):
        raise _Malformed
    return reqs


def term_matches(term: Any, name: str, labels: Mapping[str, Any]) -> bool:
    """Whether one ``NodeSelectorTerm`` (JSON) matches the node ``name`` with ``labels``
    (rules in the module docstring; a malformed or empty term: False)."""
    try:
        if not isinstance(term, Mapping):
            raise _Malformed
        exprs = _requirements(term, "matchExpressions")
        fields = _requirements(term, "matchFields")
        if not exprs and not fields:
            return False
        # every requirement is checked, so a malformed one fails the term even when an
        # earlier one already does not hold
        held = [_label_holds(r, labels) for r in exprs] + [_field_holds(r, name) for r in fields]
        return all(held)
    except _Malformed:
        return False


def selector_matches(selector: Any, name: str, labels: Mapping[str, Any]) -> bool:
    """Whether a ``NodeSelector`` (JSON: ``{"nodeSelectorTerms": [...]}``) matches the
    node: any of its terms does (:func:`term_matches`). No terms, or a selector that is
    not an object: False."""
    if not isinstance(selector, Mapping):
        return False
    terms = selector.get("nodeSelectorTerms")
    if not isinstance(terms, list):
        return False
    return any(term_matches(t, name, labels) for t in terms)


def required_affinity_admits(pod_spec: Mapping[str, Any], name: str,
                             labels: Mapping[str, Any]) -> bool:
    """Whether ``pod_spec``'s ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``
    lets the pod onto the node ``name`` with ``labels``. True when the pod states none
    (each level absent or null); False when a level is present but not an object (a
    shape the API server would refuse; hami fails closed on it)."""
    level: Any = pod_spec
    for field in ("affinity", "nodeAffinity"):
        level = level.get(field)
        if level is None:
            return True
        if not isinstance(level, Mapping):
            return False
    required = level.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return selector_matches(required, name, labels)


__all__ = ["required_affinity_admits", "selector_matches", "term_matches"]
