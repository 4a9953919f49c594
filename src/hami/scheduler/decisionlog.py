"""The scheduler's decisions as one structured log line each (``hami.scheduler.decisions``).

At INFO (the default): every ``/filter`` answer (pod, chosen node and devices, or why
not), every ``/bind`` (node, time spent waiting for the node lock, result) and every
admission the webhook denies. At DEBUG (``-v 4`` or ``--debug``): one more line per node
that was found unfit, with its reason. The format (key=value or JSON) is
:mod:`hami.logs`'; a line is built only when its level is on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hami.logs import event

log = logging.getLogger("hami.scheduler.decisions")

INFO = logging.INFO
DEBUG = logging.DEBUG


def _pod(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _reasons(failed: Mapping[str, str]) -> str:
    """``"2 nodes: 1/1 CardInsufficientMemory; 1 nodes: 1/4 NumaNotFit"``: nodes per
    distinct reason, most frequent first."""
    counts: dict[str, int] = {}
    for reason in failed.values():
        counts[reason] = counts.get(reason, 0) + 1
    return "; ".join(f"{n} nodes: {r}" for r, n in sorted(counts.items(),
                                                          key=lambda kv: (-kv[1], kv[0])))


def filter_placed(meta: Mapping[str, Any], node: str, annotations: Mapping[str, str],
                  score: float, candidates: int, seconds: float) -> None:
    """A pod was placed: ``devices`` are the ``*-devices-allocated`` annotation values
    (HAMi's encoding, e.g. ``GPU-a,NVIDIA,4000,30:;``), ``seconds`` the decision time."""
    if not log.isEnabledFor(INFO):
        return
    devices = " ".join(v for k, v in annotations.items() if k.endswith("-allocated") and v)
    event(log, INFO, "filter", pod=_pod(meta), result="placed", node=node, devices=devices,
          score=round(score, 2), candidates=candidates, took_ms=round(seconds * 1e3, 2))


def filter_unschedulable(meta: Mapping[str, Any], failed: Mapping[str, str],
                         candidates: int, seconds: float) -> None:
    """No node fits: the reasons grouped at INFO, one line per node at DEBUG."""
    event(log, INFO, "filter", pod=_pod(meta), result="unschedulable",
          reasons=_reasons(failed), candidates=candidates, took_ms=round(seconds * 1e3, 2))
    if log.isEnabledFor(DEBUG):
        for node, reason in sorted(failed.items()):
            event(log, DEBUG, "filter node", pod=_pod(meta), node=node, fits=False,
                  reason=reason)


def filter_other(meta: Mapping[str, Any], result: str, detail: str = "",
                 candidates: int = 0) -> None:
    """Any other answer: ``result`` ``passthrough`` (the pod asks for no device) or
    ``error`` (``detail`` says why: an invalid request, caches not synced, ...)."""
    event(log, INFO, "filter", pod=_pod(meta), result=result, error=detail,
          candidates=candidates)


def bind(namespace: str, name: str, node: str, lock_wait_s: float, error: str,
         seconds: float) -> None:
    """A ``/bind``: ``lock_wait_s`` the time spent taking the node lock(s)."""
    event(log, INFO, "bind", pod=f"{namespace}/{name}", node=node,
          result="error" if error else "bound", error=error,
          lock_wait_ms=round(lock_wait_s * 1e3, 1), took_ms=round(seconds * 1e3, 1))


def admission_denied(namespace: str, name: str, code: int, message: str) -> None:
    """The webhook refused a pod (``code`` 403 denied, 400 malformed)."""
    event(log, INFO, "admission denied", pod=f"{namespace}/{name}", code=code,
          reason=message)
