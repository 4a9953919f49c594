"""How much work one tenant-written object may cost DRA mode's scheduler.

Anyone who reaches the webhook port can POST an AdmissionReview, and a pod's spec is
tenant text: every handler that walks a list the tenant sizes (``spec.resourceClaims``,
the containers asking for GPUs, the templates a pod names) reads the API at most once
per distinct name and refuses, with a message, a list longer than these limits, before
any request. Kubernetes v1.37 puts no limit on the number of ``spec.resourceClaims``
entries of a pod (``pkg/apis/core/validation``: names must be distinct DNS labels, no
count); the pod's size (the API server's 3 MiB request body, etcd's 1.5 MiB object)
is the only cap, about 20,000 entries. hami's limit is far above what a real pod uses
(one claim per GPU container) and far below that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_POD_CLAIMS", "REVIEW_DEADLINE_S", "claims_denial"]

#: At most this many entries in a pod's ``spec.resourceClaims`` (the pod's own and
#: those hami's translation adds) in DRA mode.
MAX_POD_CLAIMS = 128
#: One AdmissionReview's API reads end within this many seconds, or it is refused
#: (the API server waits 10 s for a webhook by default: the chart's ``timeoutSeconds``).
REVIEW_DEADLINE_S = 5.0


def claims_denial(pod: Mapping[str, Any], what: str = "the pod") -> str | None:
    """The refusal when ``pod``'s ``spec.resourceClaims`` has more than
    :data:`MAX_POD_CLAIMS` entries, else None (also for a malformed pod: its shape is
    checked where it is read). Pure; never raises."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    if not isinstance(entries, list) or len(entries) <= MAX_POD_CLAIMS:
        return None
    return (f"{what} has {len(entries)} entries in spec.resourceClaims; hami's DRA mode "
            f"accepts at most {MAX_POD_CLAIMS} per pod (one claim per GPU container is "
            "what a pod needs): use fewer claims, or share a claim between containers")
