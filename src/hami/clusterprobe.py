"""Read what the API server offers at start-up: ``/version``, ``/api`` and ``/apis``
(discovery documents: ``version.Info``, ``APIVersions``, ``APIGroupList``) into
:class:`hami.core.clusterfacts.ClusterFacts`.

lightkube has no call for these paths, so the GETs go through the HTTP client of the
lightkube client given (its configured server, credentials, TLS and transport); nothing
else is sent. A failed read raises :class:`ProbeError` with one line: hami reads these at
start-up and does not start on a server it cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.core.clusterfacts import ClusterFacts, facts_from

#: The discovery paths read, in order.
PATHS = ("/version", "/api", "/apis")


class ProbeError(RuntimeError):
    """A discovery document could not be read or is not a JSON object."""


def _http(client: Any) -> Any:
    """The httpx client inside a lightkube ``Client``/``AsyncClient``."""
    inner = getattr(getattr(client, "_client", None), "_client", None)
    if inner is None or not hasattr(inner, "get"):
        raise ProbeError("this Kubernetes client offers no HTTP client for discovery")
    return inner


def _document(path: str, response: Any) -> Mapping[str, Any]:
    if response.status_code != 200:
        raise ProbeError(f"GET {path}: HTTP {response.status_code}")
    try:
        doc = response.json()
    except ValueError as exc:
        raise ProbeError(f"GET {path}: not JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise ProbeError(f"GET {path}: not a JSON object")
    return doc


async def read_facts_async(client: Any) -> ClusterFacts:
    """The facts through a lightkube ``AsyncClient``. Raises :class:`ProbeError`."""
    http = _http(client)
    docs = []
    for path in PATHS:
        try:
            response = await http.get(path)
        except Exception as exc:  # noqa: BLE001 - any transport failure is one line
            raise ProbeError(f"GET {path}: {exc}") from None
        docs.append(_document(path, response))
    return facts_from(*docs)


def read_facts(client: Any) -> ClusterFacts:
    """The facts through a lightkube ``Client``. Raises :class:`ProbeError`."""
    http = _http(client)
    docs = []
    for path in PATHS:
        try:
            response = http.get(path)
        except Exception as exc:  # noqa: BLE001 - any transport failure is one line
            raise ProbeError(f"GET {path}: {exc}") from None
        docs.append(_document(path, response))
    return facts_from(*docs)
