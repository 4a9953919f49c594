"""The readers of possibly malformed object fields (:mod:`hami.core.podobjects`) that DRA
mode's modules share: a field of the right JSON type is returned as it is, anything else
a tenant may write there (null, a string, a number, the other container type) reads as
empty, and nothing raises."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hami.core.podobjects import list_or_empty, mapping_or_empty, meta_of

#: What a JSON decoder can hand back for one field.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10)


def test_the_field_itself_when_it_has_the_right_type() -> None:
    spec: dict[str, Any] = {"devices": {"requests": []}}
    frozen = MappingProxyType({"a": 1})
    requests: list[Any] = [{"name": "gpu"}]
    assert mapping_or_empty(spec) is spec  # not a copy: callers read the object itself
    assert mapping_or_empty(frozen) is frozen  # any Mapping, not only dict
    assert list_or_empty(requests) is requests


def test_a_hostile_field_reads_as_empty() -> None:
    for bad in (None, "spec", 7, 1.5, True, ["a"], ("a",), b"{}", {"a"}):
        assert mapping_or_empty(bad) == {}
    for bad in (None, "ab", 7, {"a": 1}, ("a",), b"[]", {"a"}):
        assert list_or_empty(bad) == []
    # a path through malformed fields ends empty instead of raising
    pod = {"metadata": "not an object", "spec": {"resourceClaims": {"x": 1}}}
    assert mapping_or_empty(mapping_or_empty(pod.get("metadata")).get("annotations")) == {}
    assert list_or_empty(mapping_or_empty(pod.get("spec")).get("resourceClaims")) == []
    assert meta_of(pod) == {}


def test_each_empty_list_is_its_own() -> None:
    first = list_or_empty(None)
    first.append("x")
    assert list_or_empty(None) == []


@given(JSON_VALUES)
def test_never_raises_and_keeps_the_type(value: Any) -> None:
    got = mapping_or_empty(value)
    assert got is value if isinstance(value, dict) else got == {}
    items = list_or_empty(value)
    assert items is value if isinstance(value, list) else items == []
