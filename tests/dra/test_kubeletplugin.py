"""The DRA kubelet plugin over its real unix sockets (the kubelet side is a gRPC client
built from our protos; the claim comes from a stub getter: the e2e test reads it from a
real apiserver)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hami.deviceplugin import feedbackfile
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.dra.kubeletplugin import DraNode, PluginPaths, serve
from hami.dra.registration import api_pb2 as regpb
from hami.dra.registration import api_pb2_grpc as reggrpc
from hami.dra.v1 import api_pb2 as pb
from hami.dra.v1 import api_pb2_grpc as pbgrpc

CLAIM = {
    "metadata": {"uid": "uid-1", "namespace": "ns", "name": "c"},
    "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-1",
         "shareID": "s-1", "consumedCapacity": {"memory": "2Gi", "cores": "25", "shares": "1"}},
    ]}}},
}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for the plugin's unix sockets: gRPC listens on paths of at most 105
    bytes, and pytest's ``tmp_path`` grows with the user name, ``$TMPDIR`` and its run
    counter (under a 40-character ``--basetemp`` the registration socket's did not fit)."""
    path = Path(tempfile.mkdtemp(prefix="hd", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_prepare_and_unprepare_over_the_sockets(short_dir: Path) -> None:
    tmp_path = short_dir
    paths = PluginPaths(tmp_path / "reg", tmp_path / "plug", tmp_path / "cdi")
    hook = tmp_path / "hook"
    claims = {("ns", "c"): CLAIM}
    node = DraNode("n1", lambda ns, n: claims.get((ns, n)), lambda: {"gpu-1": "GPU-b"},
                   PluginConfig(), NodeSettings(hook_path=str(hook)), paths.cdi_dir)
    server, _ = serve(node, paths)
    try:
        with grpc.insecure_channel(f"unix://{paths.registration_socket}") as ch:
            info = reggrpc.RegistrationStub(ch).GetInfo(  # type: ignore[no-untyped-call]
                regpb.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DRAPlugin", "gpu.hami.io", str(paths.dra_socket), ["v1.DRAPlugin"])
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch:
            stub = pbgrpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            req = pb.NodePrepareResourcesRequest(claims=[
                pb.Claim(namespace="ns", name="c", uid="uid-1"),
                pb.Claim(namespace="ns", name="gone", uid="uid-2"),
                pb.Claim(namespace="ns", name="c", uid="uid-other")])
            resp = stub.NodePrepareResources(req, timeout=5)
            ok = resp.claims["uid-1"]
            assert ok.error == ""
            (dev,) = ok.devices
            assert (list(dev.request_names), dev.pool_name, dev.device_name, dev.share_id,
                    list(dev.cdi_device_ids)) == (["gpu"], "n1", "gpu-1", "s-1",
                                                  ["gpu.hami.io/claim=uid-1"])
            assert "not found" in resp.claims["uid-2"].error
            assert "has UID uid-1" in resp.claims["uid-other"].error
            spec_file = paths.cdi_dir / "gpu.hami.io-uid-1.json"
            env = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["env"]
            assert "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in env and "CUDA_DEVICE_SM_LIMIT=25" in env
            limits = hook / "vgpu/claims/uid-1.plugin/limits.env"
            assert "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in limits.read_text()
            # the monitor's feedback file: created with the safe values, mounted read-only
            feedback = hook / "vgpu/claims/uid-1.plugin/feedback"
            assert feedbackfile.decode(feedback.read_bytes()) == (1, False)
            mounts = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["mounts"]
            assert {"hostPath": str(feedback), "containerPath": f"{hook}/vgpu/feedback",
                    "options": ["rbind", "ro", "nosuid", "nodev"]} in mounts
            again = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(
                claims=[pb.Claim(namespace="ns", name="c", uid="uid-1")]), timeout=5)
            assert again.claims["uid-1"].error == ""  # idempotent
            un = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace="ns", name="c", uid="uid-1"),
                        pb.Claim(namespace="ns", name="x", uid="../evil")]), timeout=5)
            assert un.claims["uid-1"].error == ""
            assert "malformed" in un.claims["../evil"].error
            assert not spec_file.exists() and not limits.parent.exists()
    finally:
        server.stop(0)


def test_a_socket_path_too_long_for_unix_is_a_clear_error(short_dir: Path) -> None:
    """A registry or plugin directory whose socket path is longer than gRPC listens on
    (105 bytes) is refused naming the path and the limit (gRPC said only 'Failed to
    bind'), before anything is created; at exactly 105 bytes the plugin serves."""
    from hami.deviceplugin.sockets import MAX_SOCKET_PATH_BYTES

    node = DraNode("n1", lambda ns, n: None, lambda: {}, PluginConfig(),
                   NodeSettings(hook_path=str(short_dir / "hook")), short_dir / "cdi")
    fill = MAX_SOCKET_PATH_BYTES - len(f"{short_dir}/") - len("/dra.sock")
    fits = short_dir / ("p" * fill)
    assert len(str(fits / "dra.sock")) == MAX_SOCKET_PATH_BYTES
    server, _ = serve(node, PluginPaths(short_dir / "reg", fits, short_dir / "cdi"))
    server.stop(0)
    long_dir = short_dir / ("q" * (fill + 1))
    with pytest.raises(RuntimeError, match=r"dra\.sock is 106 bytes.*at most 105"):
        serve(node, PluginPaths(short_dir / "reg2", long_dir, short_dir / "cdi2"))
    assert not long_dir.exists() and not (short_dir / "reg2").exists()
