"""hami.testing.kubescheduler.scheduler_ready: /readyz, or /healthz on a kube-scheduler
without /readyz (v1.29.6 answers 404), against a real HTTP server."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hami.testing.kubescheduler import scheduler_ready


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, int]]]:
    """An HTTP server answering each path with the status in the returned dict (404 when
    absent); yields its base URL and that dict."""
    answers: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            code = answers.get(self.path, 404)
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok" if code == 200 else b"no")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


CTX = ssl.create_default_context()


def test_readyz_decides_where_it_is_served(server: tuple[str, dict[str, int]]) -> None:
    url, answers = server
    answers.update({"/readyz": 500, "/healthz": 200})
    assert scheduler_ready(url, CTX) is False  # not ready: /healthz does not stand in
    answers["/readyz"] = 200
    assert scheduler_ready(url, CTX) is True


def test_healthz_stands_in_only_where_readyz_is_not_found(
        server: tuple[str, dict[str, int]]) -> None:
    url, answers = server
    assert scheduler_ready(url, CTX) is False  # neither served
    answers["/healthz"] = 200  # as kube-scheduler v1.29.6
    assert scheduler_ready(url, CTX) is True
    answers["/healthz"] = 503
    assert scheduler_ready(url, CTX) is False


def test_nothing_listening_is_not_ready() -> None:
    assert scheduler_ready("http://127.0.0.1:9", CTX) is False
