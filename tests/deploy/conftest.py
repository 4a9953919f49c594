"""Fixtures of the chart tests."""

from __future__ import annotations

import os

import pytest

from tests.deploy.chart import HelmMissing, helm_binary


@pytest.fixture(scope="module")
def require_helm() -> None:
    """Skip the module when helm is missing, or fail it when ``HAMI_DEPLOY_REQUIRED=1``
    (CI sets it); modules use ``pytest.mark.usefixtures("require_helm")``."""
    try:
        helm_binary()
    except HelmMissing as err:
        if os.environ.get("HAMI_DEPLOY_REQUIRED") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))
