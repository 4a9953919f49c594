"""The feedback loop's writes: the region's two fields (HAMi's tools read them) and the
container's feedback file (:mod:`hami.deviceplugin.feedbackfile`, what libvgpu trusts).
Both are logged, never raised: one container's broken file must not stop a tick."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hami.deviceplugin import feedbackfile
from hami.monitor.feedback import ContainerFeedback

log = logging.getLogger("hami.monitor")


def write_region(cf: Any, old: ContainerFeedback, new: ContainerFeedback) -> None:
    """Store the fields of ``new`` that differ from ``old`` in the region ``cf``
    (:class:`hami.monitor.lister.CacheFile`); a failure is logged."""
    try:
        if new.recent_kernel != old.recent_kernel:
            cf.write_int32("recent_kernel", new.recent_kernel)
        if new.utilization_switch != old.utilization_switch:
            cf.write_int32("utilization_switch", new.utilization_switch)
    except (OSError, ValueError) as exc:  # RegionError is a ValueError
        log.warning("feedback write to %s failed: %s", old.key, exc)


def write_feedback(errors: dict[str, str], key: str, path: Path, new: ContainerFeedback) -> None:
    """Store ``new``'s ``utilization_switch`` and block (``recent_kernel < 0``) in the
    feedback file at ``path`` (none there: a pod allocated without one, nothing done). A
    failure is logged once per distinct error, remembered in ``errors`` under ``key``."""
    try:
        feedbackfile.write(str(path), new.utilization_switch, new.recent_kernel < 0)
    except OSError as exc:
        if errors.get(key) != str(exc):
            log.warning("feedback file of %s: %s", key, exc)
        errors[key] = str(exc)
        return
    errors.pop(key, None)
