"""Which NVML events make a GPU unhealthy (HAMi-core 1.2; NVIDIA ``rm/health.go``).

Pure decisions; the event loops live in :mod:`hami.deviceplugin.discovery`.

* Only ``XidCriticalError`` events act; DBE/SBE events are registered but ignored.
* XIDs 13, 31, 43, 45, 68, 109 are application errors and ignored by default.
* ``DP_DISABLE_HEALTHCHECKS``: ``all`` or ``xids`` disables health checking; otherwise a
  comma list of extra XIDs to ignore.
* ``DP_ENABLE_HEALTHCHECKS``: comma list of XIDs that count even if ignored above
  (``all`` = no XID is ignored).
* An event whose device UUID is unknown (or a failed wait) marks every GPU unhealthy.
* No recovery: an unhealthy GPU stays unhealthy until the plugin restarts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: XIDs caused by applications, not by the GPU (ignored by default).
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: NVML event type bits (nvml.h): single-bit ECC, double-bit ECC, critical XID.
EVENT_SINGLE_BIT_ECC = 0x0000000000000001
EVENT_DOUBLE_BIT_ECC = 0x0000000000000002
EVENT_XID_CRITICAL = 0x0000000000000008
EVENT_MASK = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Effective health-check settings; build with :func:`policy_from_env`."""

    disabled: bool = False
    ignored_xids: frozenset[int] = field(default_factory=lambda: DEFAULT_IGNORED_XIDS)


def _xids(text: str) -> set[int]:
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.add(int(part))
        except ValueError:
            continue  # NVIDIA's plugin also skips entries it cannot parse
    return out


def policy_from_env(env: Mapping[str, str]) -> HealthPolicy:
    """Read ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` from ``env``."""
    disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    enable = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
    if disable in ("all", "xids"):
        return HealthPolicy(disabled=True, ignored_xids=frozenset())
    ignored = set(DEFAULT_IGNORED_XIDS) | _xids(disable)
    if enable == "all":
        ignored = set()
    else:
        ignored -= _xids(enable)
    return HealthPolicy(disabled=False, ignored_xids=frozenset(ignored))


def event_is_fatal(policy: HealthPolicy, event_type: int, xid: int) -> bool:
    """True when an NVML event of ``event_type`` carrying ``xid`` makes its GPU unhealthy."""
    if policy.disabled:
        return False
    if not event_type & EVENT_XID_CRITICAL:
        return False
    return xid not in policy.ignored_xids


def gpus_to_mark(policy: HealthPolicy, event_type: int, xid: int, uuid: str | None,
                 known: Iterable[str]) -> frozenset[str]:
    """UUIDs to turn Unhealthy for one event: the event's GPU, or every GPU when its
    UUID is ``None`` (wait error) or unknown; empty when the event is not fatal."""
    known_set = frozenset(known)
    if uuid is None:
        return frozenset() if policy.disabled else known_set
    if not event_is_fatal(policy, event_type, xid):
        return frozenset()
    return frozenset({uuid}) if uuid in known_set else known_set
