"""``hami top`` on a cluster that serves no resource.k8s.io/v1 (Kubernetes before 1.34):
the API server answers the DRA lists with a plain-text ``404 page not found`` (no Status
body), which lightkube raises as the HTTP client's error, not ``ApiError``. A real HTTP
server here answers as kube-apiserver v1.31.14 did (bench/results/compat_matrix.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hami.top import list_dra_objects


class _Handler(BaseHTTPRequestHandler):
    status = 404

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"404 page not found\n" if self.status == 404 else b"boom\n"
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(srv: ThreadingHTTPServer) -> object:
    from lightkube import Client, KubeConfig

    url = f"http://127.0.0.1:{srv.server_address[1]}"
    config = KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]})
    return Client(config, trust_env=False)


def test_no_dra_api_is_no_dra_objects(server: ThreadingHTTPServer) -> None:
    _Handler.status = 404
    assert list_dra_objects(_client(server)) == ([], [])


def test_a_server_error_is_not_taken_for_a_missing_api(server: ThreadingHTTPServer) -> None:
    _Handler.status = 500
    try:
        with pytest.raises(Exception, match="500"):
            list_dra_objects(_client(server))
    finally:
        _Handler.status = 404
