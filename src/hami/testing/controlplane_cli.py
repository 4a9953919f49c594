"""``python -m hami.testing.controlplane up`` (also ``python -m hami.testing.controlplane_cli
up``): run a test control plane in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from hami.testing.controlplane import ControlPlane
from hami.testing.kubeobjects import create_gpu_node
from hami.testing.processes import KUBERNETES_VERSION, BinariesMissing, ControlPlaneError
from hami.testing.scheduler_config import ExtenderConfig


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hami.testing.controlplane up``: run a cluster until Ctrl-C/SIGTERM.

    Prints the kubeconfig path (``export KUBECONFIG=...``) once everything is ready.
    Returns the process exit code.
    """
    parser = argparse.ArgumentParser(prog="python -m hami.testing.controlplane")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, kube-apiserver and kube-scheduler")
    up.add_argument("--workdir", type=Path, help="state and logs (default: a new temp dir)")
    up.add_argument("--bin-dir", type=Path, help="binaries (default: build.sh's cache dir)")
    up.add_argument(
        "--extender-url",
        help="also run a kube-scheduler with profile hami-scheduler and this extender, "
        "e.g. https://127.0.0.1:8443",
    )
    up.add_argument(
        "--gpu-node",
        action="append",
        default=[],
        metavar="NAME",
        help="create a Ready node NAME with nvidia.com/gpu=10 (repeatable)",
    )
    up.add_argument("-v", "--verbosity", type=int, default=1)
    args = parser.parse_args(argv)

    try:
        cp = ControlPlane(args.bin_dir, args.workdir, keep_workdir=True, verbosity=args.verbosity)
    except BinariesMissing as err:
        print(err, file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    with cp:
        cp.start()
        if args.extender_url:
            cp.start_scheduler(
                scheduler_name="hami-scheduler", extender=ExtenderConfig(args.extender_url)
            )
        client = cp.client()
        for name in args.gpu_node:
            create_gpu_node(client, name, gpus=10)
        print(
            f"control plane {KUBERNETES_VERSION} ready in "
            f"{cp.startup_seconds['total']:.1f}s at {cp.server}"
        )
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in cp.startup_seconds.items() if k != "total")
        print(f"  ({parts})")
        print(f"logs: {cp.log_dir}")
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        # Wake twice a second to notice a dead component; a signal ends the wait at once.
        while not stop.wait(0.5):
            try:
                cp.check_alive()
            except ControlPlaneError as err:
                print(err, file=sys.stderr)
                return 1
    return 0


__all__ = ["main"]


if __name__ == "__main__":
    sys.exit(main())
