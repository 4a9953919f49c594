"""Regenerate the DRA gRPC modules (``v1/`` and ``registration/``) from their ``.proto``.

Run ``python -m hami.dra.regen`` (grpcio-tools) after editing a ``.proto``; the generated
files are committed so installing hami needs no code generation.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    """Run protoc on both protos with ``src/`` as the include root; returns its status."""
    from grpc_tools import protoc

    here = Path(__file__).resolve().parent
    src = here.parents[1]
    rc = 0
    for sub in ("v1", "registration"):
        rel = here.relative_to(src) / sub / "api.proto"
        rc |= int(protoc.main([
            "grpc_tools.protoc", f"-I{src}", f"--python_out={src}", f"--pyi_out={src}",
            f"--grpc_python_out={src}", str(rel),
        ]))
        for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):  # keep linters off
            path = here / sub / name
            text = path.read_text()
            if not text.startswith("# ruff: noqa"):
                path.write_text("# ruff: noqa\n# mypy: ignore-errors\n" + text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
