"""Shared fixtures."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import SHARED


@pytest.fixture
def field_cases() -> dict[str, dict[str, Any]]:
    """The field cases of ``shared/cases/field-bugs.json`` by id."""
    path = SHARED / "cases" / "field-bugs.json"
    if not path.exists():
        pytest.skip("shared/cases/field-bugs.json not present")
    return {c["id"]: c for c in json.loads(path.read_text())}
