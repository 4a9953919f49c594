"""Log set-up shared by every ``hami`` command: one structured line per record.

Two formats, chosen with ``--log-format``:

* ``keyvalue`` (default): ``time=2025-01-02T03:04:05.678Z level=info logger=hami.scheduler
  msg=filter pod=ns/p node=n1`` (logfmt: values with spaces, quotes or ``=`` are quoted
  as JSON strings);
* ``json``: one JSON object per line with the same keys.

Structured fields ride on a record as ``extra={"fields": {...}}``; :func:`event` builds
that and costs one ``isEnabledFor`` check when the level is off. Verbosity follows klog:
``-v`` 4 or more, or ``--debug``, turns on DEBUG for hami's own loggers (per-node detail
of each decision); the HTTP client libraries stay at WARNING.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

#: ``--log-format`` values.
LOG_FORMATS = ("keyvalue", "json")
#: klog verbosity from which hami's loggers log at DEBUG.
DEBUG_VERBOSITY = 4

_QUIET = ("httpx", "httpx2", "asyncio", "aiohttp.access", "grpc", "matplotlib", "PIL")


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with ``fields`` (str/int/float/bool/None or JSON-able values) as one
    structured line; nothing is built when ``level`` is off for ``logger``."""
    if logger.isEnabledFor(level):
        logger.log(level, msg, extra={"fields": fields}, stacklevel=2)


def _iso(created: float) -> str:
    secs = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + \
        f".{int((created - secs) * 1000):03d}Z"


def _kv_value(value: Any) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"),
                                                          default=str)
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    return json.dumps(text)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"time": _iso(record.created), "level": record.levelname.lower(),
                           "logger": record.name, "msg": record.getMessage()}
    extra = getattr(record, "fields", None)
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            out[key if key not in out else f"field.{key}"] = value
    if record.exc_info and record.exc_info[0] is not None:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class KeyValueFormatter(logging.Formatter):
    """A record as one ``key=value`` line (logfmt)."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_kv_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    """A record as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), separators=(",", ":"), default=str)


class _HamiHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed, so a second set-up replaces only it."""


def setup_logging(verbosity: int = 0, debug: bool = False, log_format: str = "keyvalue",
                  stream: TextIO | None = None) -> None:
    """Send every record to ``stream`` (stderr) as one line in ``log_format``
    (:data:`LOG_FORMATS`): INFO and up, DEBUG for ``hami.*`` when ``verbosity`` >=
    :data:`DEBUG_VERBOSITY` or ``debug``. Replaces a handler from an earlier call and
    leaves other handlers (pytest's) alone.

    Raises:
        ValueError: unknown ``log_format``.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, "
                         f"got {log_format!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _HamiHandler)]:
        root.removeHandler(old)
    handler = _HamiHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("hami").setLevel(
        logging.DEBUG if debug or verbosity >= DEBUG_VERBOSITY else logging.INFO)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
