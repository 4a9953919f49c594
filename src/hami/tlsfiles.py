"""TLS server contexts served from PEM files that change under a running server.

The kubelet updates a mounted Secret in place when cert-manager or ``hami certgen``
replaces it (an atomic swap of the volume's ``..data`` link), so a server that loaded its
pair once keeps presenting the old certificate until it restarts, past its expiry if
nobody restarts it. :class:`TlsReloader` keeps one ``ssl.SSLContext`` and loads the pair
into it again when either file changes; Python's ``ssl`` uses the context's current chain
for every new handshake, so connections opened after a reload get the new certificate and
open ones keep theirs. Used by the scheduler (webhook and extender TLS, secure metrics)
and the monitor (secure metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator

log = logging.getLogger(__name__)

#: How often :meth:`TlsReloader.watch` looks at the files, in seconds.
WATCH_INTERVAL_S = 2.0


class TlsReloader:
    """A server ``SSLContext`` (TLS 1.2 or newer) serving the PEM pair ``cert_file`` /
    ``key_file``, loaded again by :meth:`maybe_reload` when either file's identity
    (device, inode, size, modification time in ns) changes. ``reloads`` counts the loads,
    the first included.

    Raises:
        OSError, ssl.SSLError: at construction, a file is missing or not a matching PEM
        pair (a server must not start without its certificate).
    """

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[tuple[int, int, int, int], ...] = ()
        self.reloads = 0
        self.load()

    def _stamps(self) -> tuple[tuple[int, int, int, int], ...]:
        out = []
        for path in (self.cert_file, self.key_file):
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def load(self) -> None:
        """Load the pair now. Both files are read once and the pair is tried on a scratch
        context first: OpenSSL installs a new certificate before it checks the key, so a
        failed load straight into the live context would leave it serving a certificate
        without its key (every handshake refused).

        Raises:
            OSError, ssl.SSLError: a file is missing or the two do not make a pair (the
            context keeps the pair it had).
        """
        stamp = self._stamps()
        with open(self.cert_file, "rb") as f:
            cert_pem = f.read()
        with open(self.key_file, "rb") as f:
            key_pem = f.read()
        # ssl loads pairs from paths only: both loads read one copy of the bytes
        with pem_paths(cert_pem, key_pem) as (cert, key):
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
            self.context.load_cert_chain(cert, key)
        self._stamp = stamp
        self.reloads += 1

    def maybe_reload(self) -> bool:
        """Load the pair again if a file changed since the last load: True when it did.
        A pair that cannot be loaded (half written, mismatched, removed) is logged and
        the old one kept; it is tried again on the next call. Never raises."""
        try:
            if self._stamps() == self._stamp:
                return False
            self.load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS reload of %s failed, keeping the old certificate: %s",
                        self.cert_file, exc)
            return False
        log.info("reloaded TLS certificate %s", self.cert_file)
        return True

    async def watch(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Call :meth:`maybe_reload` every ``interval_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.maybe_reload()


@contextlib.contextmanager
def pem_paths(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths ``ssl`` can load the two PEM blobs from, for the ``with`` block: anonymous
    memory files (``memfd_create``, named through ``/proc/self/fd``) where Linux has them,
    so a container with a read-only root file system and no writable temporary
    directory (the chart's scheduler and monitor) can reload; a private temporary
    directory elsewhere. The key never reaches a file system on Linux.

    Raises:
        OSError: neither is available.
    """
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for data in (cert_pem, key_pem):
                fd = memfd("hami-tls", getattr(os, "MFD_CLOEXEC", 0))
                fds.append(fd)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="hami-tls-") as tmp:
        cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert, "wb") as out:
            out.write(cert_pem)
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key_pem)
        yield cert, key


__all__ = ["WATCH_INTERVAL_S", "TlsReloader", "pem_paths"]
