"""Deploy tests share the e2e control-plane fixtures (skipped when the binaries, lightkube,
cryptography or aiohttp are missing, unless HAMI_E2E_REQUIRED=1)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("HAMI_E2E_REQUIRED") != "1":
    for _module in ("lightkube", "cryptography", "aiohttp"):
        pytest.importorskip(_module)

from tests.e2e.conftest import control_plane, kube_client  # noqa: E402,F401
