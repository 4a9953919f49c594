"""DRA mode churn at scale: thousands of GPU pods of random shapes created (through hami's
webhook, a real ``hami scheduler --dra-mode`` process) and deleted on the real control
plane with kube-controller-manager's resourceclaim and garbage-collector controllers;
prints the object counts before, right after the churn, and once settled (the templates
hami made are collected ``--idle`` after their last pod's claim was made).

Usage::

    PYTHONPATH=src:. python bench/bench_dra_churn.py --pods 2000 [--batch 50] [--idle 5s]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    """One churn run; JSON on stdout."""
    from lightkube import codecs
    from tests.e2e.hami_harness import HamiProcess, Tls

    from hami.testing.controllers import start_controller_manager
    from hami.testing.controlplane import ControlPlane, ensure_namespace
    from hami.testing.drachurn import churn, counts, wait_counts
    from hami.testing.dranode import create_device_class
    from hami.testing.gpupods import webhook_configuration

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--idle", default="5s", help="--dra-template-idle of the scheduler")
    ap.add_argument("--settle", type=float, default=300.0, help="seconds to wait after")
    args = ap.parse_args()
    ns = "churn"
    with tempfile.TemporaryDirectory(prefix="bench-dra-churn-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(workdir=work / "cp")
        cp.start()
        hami = None
        try:
            start_controller_manager(cp)
            client = cp.client()
            ensure_namespace(client, ns)
            create_device_class(client)
            tls = Tls(work / "tls")
            hami = HamiProcess(cp, tls, work, args=[
                "--dra-mode", "--scheduler-name=", f"--dra-template-idle={args.idle}"]).start()
            client.create(codecs.from_dict(webhook_configuration("hami-churn", hami.url,
                                                                 tls.ca_pem)))
            before = counts(client, ns)
            stats = churn(client, ns, args.pods, batch=args.batch, timeout_s=300)
            right_after = counts(client, ns)
            settled = wait_counts(client, ns, before, timeout_s=args.settle)
            print(json.dumps({**stats, "before": before, "right_after": right_after,
                              "settled": settled, "back_to_start": settled == before},
                             indent=1))
        finally:
            if hami is not None:
                hami.stop()
            cp.stop()


if __name__ == "__main__":
    main()
