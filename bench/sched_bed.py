"""Measuring tools for ``bench_scheduler.py throughput``: what the API server served (by
verb and resource), CPU seconds per process of the bed, and when each pod was bound.

All three are read the same way for hami and for kube-scheduler alone, so the figures
of one run compare side by side.
"""

from __future__ import annotations

import os
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_REQUEST = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+-]+)$', re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
WRITE_VERBS = ("POST", "PATCH", "PUT", "DELETE", "APPLY")


def api_requests(cp: Any) -> dict[str, float]:
    """``apiserver_request_total`` summed by ``"VERB resource[/subresource]"`` (the API
    server's own count of what it served, every client together)."""
    url = f"{cp.server}/metrics"
    with urllib.request.urlopen(url, context=cp.ssl_context(), timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for match in _REQUEST.finditer(text):
        labels = dict(_LABEL.findall(match.group(1)))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f"{labels.get('verb', '?')} {resource}"
        out[key] = out.get(key, 0.0) + float(match.group(2))
    return out


def settle(cp: Any, quiet_s: float = 2.0, timeout_s: float = 60.0) -> dict[str, float]:
    """:func:`api_requests` once no write has reached the API server for ``quiet_s``
    (the fake Allocates and the queued events of the last pods are done), or after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = api_requests(cp)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = api_requests(cp)
        writes = [k for k in now if k.split(" ")[0] in WRITE_VERBS and "leases" not in k]
        if all(now.get(k) == last.get(k) for k in writes):
            return now
        last = now
    return last


def per_pod(before: dict[str, float], after: dict[str, float], pods: int,
            skip: Iterable[str] = ()) -> dict[str, Any]:
    """Requests per pod between two :func:`api_requests` snapshots: by verb and resource
    (rounded, zeros left out), and the write and read totals. ``skip``: keys that are the
    harness's own bookkeeping (its polling), left out of everything."""
    skipped = set(skip)
    by_key = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / pods
              for k in sorted(after) if k not in skipped}
    by_key = {k: round(v, 2) for k, v in by_key.items() if round(v, 2)}
    writes = sum(v for k, v in by_key.items() if k.split(" ")[0] in WRITE_VERBS)
    reads = sum(v for k, v in by_key.items() if k.split(" ")[0] in ("GET", "LIST"))
    return {"writes": round(writes, 2), "reads": round(reads, 2), "by_verb": by_key}


def plain_watch_client(cp: Any, namespace: str = "default") -> Any:
    """``cp.client()`` whose watches ask for an uncompressed body. kube-apiserver gzips a
    watch whose first write is large (a watch resumed after its server timeout replays
    the events since, hundreds in a burst) one gzip member per event, and the client
    decodes only the first member: the harness's pod watches (bound times, the fake
    Allocate) lost events and lagged by a watch period."""
    import httpx2
    from lightkube import Client, KubeConfig

    class Identity(httpx2.HTTPTransport):
        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            if request.url.params.get("watch") in ("true", "1"):
                request.headers["Accept-Encoding"] = "identity"
            return super().handle_request(request)

    config = KubeConfig.from_file(cp.kubeconfig)
    ctx = ssl.create_default_context(cafile=str(cp.pki_dir / "ca.crt"))
    ctx.load_cert_chain(cp.pki_dir / "admin.crt", cp.pki_dir / "admin.key")
    return Client(config, namespace=namespace, field_manager="hami-e2e", trust_env=False,
                  transport=Identity(verify=ctx))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0.0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuMeter:
    """CPU seconds per named process between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.pids["harness"] = os.getpid()  # the pod creator, the watcher, the fake Allocate
        self._start: dict[str, float] = {}

    def start(self) -> None:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self, pods: int) -> dict[str, float]:
        """Milliseconds of CPU per pod, per process and ``total``."""
        out = {name: round(1000 * (cpu_seconds(pid) - self._start[name]) / pods, 1)
               for name, pid in self.pids.items()}
        out["total"] = round(sum(out.values()), 1)
        return out


class BoundWatcher:
    """A pod watch in a thread: the monotonic time each pod was first seen bound."""

    def __init__(self, cp: Any, namespace: str = "default") -> None:
        self.cp = cp
        self.namespace = namespace
        self.bound_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bound-watcher")

    def start(self) -> BoundWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from lightkube.resources.core_v1 import Pod

        client = self.cp.client()
        while not self._stop.is_set():
            try:
                for _, pod in client.watch(Pod, namespace=self.namespace, server_timeout=5):
                    if pod.spec.nodeName and pod.metadata.name not in self.bound_at:
                        self.bound_at[pod.metadata.name] = time.monotonic()
                    if self._stop.is_set():
                        return
            except Exception:
                time.sleep(0.1)

    def wait(self, pods: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.bound_at) < pods:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.bound_at)}/{pods} pods bound after {timeout_s}s")
            time.sleep(0.05)


def quantiles_ms(values: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of seconds, in milliseconds (nearest rank)."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]

    return {"p50": round(1000 * rank(0.5)), "p90": round(1000 * rank(0.9)),
            "p99": round(1000 * rank(0.99)), "max": round(1000 * ordered[-1])}
