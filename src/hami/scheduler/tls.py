"""The scheduler's TLS: the secure metrics listener's choice between its own pair
(:class:`hami.tlsfiles.TlsReloader`, reloaded when its files change) and a self-signed
certificate."""

from __future__ import annotations

import ssl

from hami.metricsauth import self_signed_context
from hami.scheduler.settings import SchedulerSettings
from hami.tlsfiles import TlsReloader


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
