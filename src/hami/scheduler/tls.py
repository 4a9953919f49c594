"""The scheduler's TLS: a certificate pair reloaded when its files change, and the
secure metrics listener's choice between its own pair and a self-signed certificate."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

from hami.metricsauth import self_signed_context
from hami.scheduler.settings import SchedulerSettings

log = logging.getLogger("hami.scheduler.server")

class TlsReloader:
    """A server SSLContext that reloads its certificate pair when the files change."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self.reloads = 0
        self.load()

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def load(self) -> None:
        stamp = self._mtimes()
        self.context.load_cert_chain(self.cert_file, self.key_file)
        self._stamp = stamp
        self.reloads += 1

    def maybe_reload(self) -> bool:
        try:
            if self._mtimes() == self._stamp:
                return False
            self.load()
            log.info("reloaded TLS certificate %s", self.cert_file)
            return True
        except (OSError, ssl.SSLError) as exc:  # half-written files: keep the old pair
            log.warning("TLS reload failed, keeping the old certificate: %s", exc)
            return False

    async def watch(self, interval_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.maybe_reload()


class _FixedTls:
    """A TLS context that never changes (the self-signed one of secure metrics)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context


def metrics_tls(settings: SchedulerSettings) -> TlsReloader | _FixedTls:
    """The TLS of the secure metrics listener: the ``--metrics-cert-file`` pair, reloaded
    when it changes, or a self-signed certificate made now
    (:func:`hami.metricsauth.self_signed_context`)."""
    if settings.metrics_cert_file:
        return TlsReloader(settings.metrics_cert_file, settings.metrics_key_file)
    return _FixedTls(self_signed_context()[0])
