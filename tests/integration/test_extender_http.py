"""``--extender-http-bind``: kube-scheduler in the same pod reaches ``/filter`` and
``/bind`` over plain HTTP on loopback, so a burst of concurrent binds costs no TLS
handshakes (kube-scheduler's extender client keeps two idle connections and no TLS
sessions); the main listener stays HTTPS, and a non-loopback address is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hami.core.config import ConfigError

from .fake_kube import FakeKube
from .listening import serving_ports
from .support import SETTINGS, gpu_pod, node, run


@contextlib.asynccontextmanager
async def scheduler(kube: FakeKube, **overrides: Any) -> AsyncIterator[dict[str, int]]:
    """``serve()`` on free ports (metrics off); yields its ports by listener."""
    async with serving_ports(kube, **overrides) as ports:
        yield ports


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str,
               body: Any) -> tuple[bytes, Any]:
    """One request on an open connection; (status line, decoded JSON body)."""
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    status = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status.strip(), json.loads(await reader.readexactly(length))


def test_filter_and_bind_over_plain_http_on_one_kept_alive_connection(tmp_path: Path) -> None:
    from hami.testing.pki import CertificateAuthority

    ca = CertificateAuthority.create("extender-ca")
    cert_file, key_file = ca.issue("hami", ip_sans=["127.0.0.1"], server=True).write(
        tmp_path, "serving")
    kube = FakeKube()
    lock_free = node("n1")  # the device plugin's mode cdi: binds take no node lock
    lock_free["metadata"]["annotations"]["hami.io/node-allocate-mode"] = "cdi"
    kube.put("Node", lock_free)
    pods = [gpu_pod(f"p{i}", memory_mib=1000) for i in range(3)]
    for i, pod in enumerate(pods):
        pod["metadata"]["uid"] = f"00000000-0000-4000-8000-00000000000{i}"
        kube.put("Pod", pod)

    async def scenario() -> None:
        async with scheduler(kube, cert_file=str(cert_file), key_file=str(key_file),
                             extender_http_bind="127.0.0.1:0") as ports:
            assert ports["extender_http"] not in (0, ports["http"])
            reader, writer = await asyncio.open_connection("127.0.0.1", ports["extender_http"])
            try:
                for pod in pods:  # several calls, one connection: no handshake, no reconnect
                    status, result = await post(reader, writer, "/filter", {
                        "Pod": pod, "Nodes": None, "NodeNames": ["n1"]})
                    assert status == b"HTTP/1.1 200 OK"
                    assert result["NodeNames"] == ["n1"] and result["Error"] == "", json.dumps(result)
                    meta = pod["metadata"]
                    status, result = await post(reader, writer, "/bind", {
                        "PodName": meta["name"], "PodNamespace": "default",
                        "PodUID": meta["uid"], "Node": "n1"})
                    assert status == b"HTTP/1.1 200 OK" and result == {"Error": ""}, result
            finally:
                writer.close()
            # the main listener still speaks TLS only
            context = ssl.create_default_context(cadata=ca.cert_pem.decode()
                                                 if isinstance(ca.cert_pem, bytes) else ca.cert_pem)
            reader, writer = await asyncio.open_connection("127.0.0.1", ports["http"],
                                                           ssl=context)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()

    run(scenario)


@pytest.mark.parametrize("address", ["0.0.0.0:9444", ":9444", "10.0.0.1:9444", "localhost:9444"])
def test_extender_http_bind_must_be_a_loopback_address(address: str) -> None:
    with pytest.raises(ConfigError, match="loopback"):
        replace(SETTINGS, extender_http_bind=address).validate()
    replace(SETTINGS, extender_http_bind="127.0.0.1:9444").validate()
    replace(SETTINGS, extender_http_bind="[::1]:9444").validate()
