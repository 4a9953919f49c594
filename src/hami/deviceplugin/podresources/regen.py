"""Regenerate ``api_pb2.py`` / ``api_pb2.pyi`` / ``api_pb2_grpc.py`` from ``api.proto``
(the kubelet's pod-resources API v1) with grpcio-tools.

Run ``python -m hami.deviceplugin.podresources.regen`` after editing the ``.proto``; the
generated files are committed so installing hami needs no code generation.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    """Run protoc with ``src/`` as the include root; returns its status."""
    from grpc_tools import protoc

    here = Path(__file__).resolve().parent
    src = here.parents[2]
    rel = here.relative_to(src) / "api.proto"
    rc = int(protoc.main([
        "grpc_tools.protoc", f"-I{src}", f"--python_out={src}", f"--pyi_out={src}",
        f"--grpc_python_out={src}", str(rel),
    ]))
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):  # keep linters off
        path = here / name
        text = path.read_text()
        if not text.startswith("# ruff: noqa"):
            path.write_text("# ruff: noqa\n# mypy: ignore-errors\n" + text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
