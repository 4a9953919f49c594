"""Whether a DRA claim spec is the one hami's translation writes. Pure.

* :func:`hami_shaped`: a claim spec (``ResourceClaim.spec`` or a template's ``spec.spec``)
  is exactly what :func:`hami.dra.translate.claim_spec` writes for some count, memory,
  cores, selectors and MIG profiles; the quota's booking rules
  (:func:`hami.dra.booking.admission_asks`) count such a spec as hami books a translated
  pod, and read any other strictly.
* :func:`same_template_spec`: a ResourceClaimTemplate found under the name of one of
  hami's templates asks what hami would write (the webhook and the template reconciler
  refuse one that does not).

Both compare as the API server stores objects: empty fields left out, capacity request
quantities by value (``2048Mi`` may come back as ``2Gi``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from hami.core.podobjects import mapping_or_empty
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra import translate as tr
from hami.dra.slices import MIB

#: The MIG profile a subrequest of hami's prioritized list selects (a JSON string in CEL).
_PROFILE = re.compile(r'\.profile == ("(?:[^"\\]|\\.)*")')


def _shape_params(entry: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(count, memory MiB, cores percent)`` of an ``exactly`` entry as hami writes it
    (whole MiB; no memory: 0), None for values hami never writes."""
    wanted = mapping_or_empty(mapping_or_empty(entry.get("capacity")).get("requests"))
    try:
        count = entry.get("count", 1)
        memory = to_int_exact(quantity(wanted["memory"])) if "memory" in wanted else 0
        cores = to_int_exact(quantity(wanted.get("cores", 0)))
    except (QuantityError, ValueError, TypeError):
        return None
    if not isinstance(count, int) or memory is None or cores is None or memory % MIB:
        return None
    return count, memory // MIB, cores


def hami_shaped(claim_spec: Mapping[str, Any]) -> bool:
    """True when a claim spec (``ResourceClaim.spec`` or a template's ``spec.spec``) is
    exactly what hami's translation writes for some request
    (:func:`hami.dra.translate.claim_spec` of its count, memory, cores, selectors and MIG
    profiles), compared as :func:`same_template_spec` does (the API server's rewriting
    of empty fields and quantities aside). Such a spec asks what its shared-card entry
    says: a MIG instance of its list is chosen to hold at least that memory and is booked
    at it, as for the pods hami translates."""
    requests = mapping_or_empty(mapping_or_empty(claim_spec).get("devices")).get("requests")
    if not isinstance(requests, list) or len(requests) != 1 or not isinstance(
            requests[0], Mapping) or requests[0].get("name") != "gpu":
        return False
    request = requests[0]
    first = request.get("firstAvailable")
    entry = mapping_or_empty(first[-1]) if isinstance(first, list) and first else \
        mapping_or_empty(request.get("exactly"))
    params = _shape_params(entry)
    if params is None:
        return False
    sel = entry.get("selectors") or []
    profiles = []
    for sub in (first[:-1] if isinstance(first, list) else []):
        sels = mapping_or_empty(sub).get("selectors")
        exprs = [mapping_or_empty(mapping_or_empty(x).get("cel")).get("expression")
                 for x in (sels if isinstance(sels, list) else [])]
        found = [m for e in exprs if isinstance(e, str) and (m := _PROFILE.search(e))]
        try:
            profiles.append(str(json.loads(found[-1].group(1))))
        except (IndexError, ValueError):
            return False
    try:
        ours = tr.claim_spec(*params, sel if isinstance(sel, list) else [], profiles)
    except (TypeError, ValueError, AttributeError):
        return False
    return bool(_canon(ours) == _canon(claim_spec))


def same_template_spec(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> bool:
    """True when two ResourceClaimTemplate ``spec`` objects (``{"spec": claim spec,
    "metadata": ...}``) are equal up to the API server's rewriting: empty fields left out,
    capacity request quantities compared by value."""
    return bool(_canon(ours) == _canon(theirs))


def _canon(value: Any, key: str = "") -> Any:
    """``value`` with empty fields dropped and capacity requests as exact numbers."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if key == "capacity" and k == "requests" and isinstance(v, Mapping):
                try:
                    out[k] = {name: quantity(q) for name, q in v.items()}
                except (QuantityError, ValueError, TypeError):
                    out[k] = dict(v)
                continue
            c = _canon(v, str(k))
            if c not in (None, {}, [], ""):
                out[k] = c
        return out
    if isinstance(value, list):
        return [_canon(v, key) for v in value]
    return value
