"""The allocation key directory (:class:`hami.keyring.KeyRing`)."""

from __future__ import annotations

import os

import pytest

from hami.keyring import KeyRing, KeyRingError


def test_current_then_previous_and_rotation_without_restart(tmp_path) -> None:
    (tmp_path / "current").write_text("a" * 64 + "\n")
    ring = KeyRing(tmp_path, recheck_s=0)
    assert ring.signing_key() == b"a" * 64 and ring.verifying_keys() == (b"a" * 64,)
    (tmp_path / "previous").write_text("a" * 64)
    (tmp_path / "current").write_text("b" * 64)
    os.utime(tmp_path / "current", (1, 1))  # a different stamp, whatever the clock
    assert ring.signing_key() == b"b" * 64
    assert ring.verifying_keys() == (b"b" * 64, b"a" * 64)
    (tmp_path / "current").write_text("short")  # half-written: the old keys stay
    os.utime(tmp_path / "current", (2, 2))
    assert ring.signing_key() == b"b" * 64


def test_missing_or_short_key_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(KeyRingError, match="cannot read"):
        KeyRing(tmp_path)
    (tmp_path / "current").write_text("x" * 10)
    with pytest.raises(KeyRingError, match="at least 32"):
        KeyRing(tmp_path)
