"""Fixtures of the listener tests (test_write_deadline.py, test_read_rate.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from hami.scheduler.listener import LimitedSite

from .listening import record_sites, tls_listener


@pytest.fixture
def sites(monkeypatch: pytest.MonkeyPatch) -> list[LimitedSite]:
    """The listeners ``serve()`` starts, recorded so that the tests read their gates."""
    return record_sites(monkeypatch)


@pytest.fixture
def tls(tmp_path: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """Settings overrides for a TLS listener and a client context that trusts it."""
    return tls_listener(tmp_path)
