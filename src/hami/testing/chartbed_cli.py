"""``python -m hami.testing.chartbed_cli up`` (``make cluster NODE=chart``): the hami chart
installed on the real test node (:class:`~hami.testing.chartbed.ChartBed`), kept running
in the foreground until Ctrl-C or SIGTERM, so that an operator can try their values,
``hami top``, the metrics and pods by hand; then everything is stopped and removed.

``--values FILE`` (repeatable) is merged over the test node's values
(:func:`~hami.testing.chartbed.chart_test_values`: local images, the fake GPU backend);
``--release``/``--namespace`` name the release. The printed text says where the
kubeconfig, an example GPU pod, the metrics, the logs and the bed's values file (for
further ``helm install``/``upgrade`` by hand) are. While it runs, the controllers' part
(:func:`hami.testing.chartcontrol.reconcile`) is played every second, so those helm
commands and node relabels take effect as in a cluster; what it does is printed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hami.testing.chartbed import (
    NAMESPACE,
    RELEASE,
    ChartBed,
    _merge,
    chart_test_values,
    helm_binary,
)
from hami.testing.gpubed_cli import EXAMPLE_COMMAND
from hami.testing.gpupods import gpu_test_pod

#: In the work directory: the test node's values only (local images, fake GPUs), without
#: ``--values``, for a further ``helm install`` by hand.
NODE_VALUES = "node-values.yaml"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` without the program name).

    Raises:
        SystemExit: status 2 with argparse's message for an unknown command or option.
    """
    parser = argparse.ArgumentParser(prog="python -m hami.testing.chartbed_cli",
                                     description="the hami chart on a real test node, "
                                                 "kept running until Ctrl-C")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--values", "-f", type=Path, action="append", default=[],
                        help="a values file merged over the test node's (repeatable)")
    parser.add_argument("--release", default=RELEASE, help="the Helm release")
    parser.add_argument("--namespace", default=NAMESPACE, help="the release namespace")
    return parser.parse_args(argv)


def merged_values(files: Sequence[Path]) -> dict[str, Any]:
    """The files' values, later files winning (as ``helm -f a -f b``).

    Raises:
        ValueError: a file that is not a YAML mapping (its name in the message).
    """
    out: dict[str, Any] = {}
    for path in files:
        doc = yaml.safe_load(path.read_text()) or {}
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: not a mapping of values")
        out = _merge(out, doc)
    return out


def usage(bed: ChartBed, example: Path) -> str:
    """What to do with the running bed (paths and commands)."""
    assert bed.cp is not None and bed.node is not None
    plugin = bed.pods.get(f"{bed.release}-device-plugin", "<device-plugin pod>")
    return f"""ready. In another shell:
  export KUBECONFIG={bed.cp.kubeconfig}
  kubectl apply -f {example}   # 512 MiB slice; it keeps running
  {Path(sys.executable).parent / "hami"} top   # the node's cards and the pod's share
  kubectl -n {bed.namespace} get pod {plugin} -o jsonpath='{{.status.podIP}}'
  curl -s http://<that IP>:9394/metrics | grep hami_vgpu   # the monitor, while it runs
  helm upgrade {bed.release} deploy/helm/hami -n {bed.namespace} --reuse-values --set ...
  helm install <release> deploy/helm/hami -n <ns> --create-namespace \\
    -f {bed.workdir / NODE_VALUES} ...   # the bed's images and fake GPUs
helm is {helm_binary()}. This process plays kube-controller-manager's part every second
(pods of new, upgraded and removed Deployments and DaemonSets, DaemonSets after node
relabels, Service endpoints) and prints what it does.
logs: {bed.workdir}/k8s/logs and {bed.workdir}/node/logs; container logs under
{bed.node.host_path('/var/log/pods')}. Ctrl-C stops and removes everything."""


def _prepare_default_namespace(bed: ChartBed) -> None:
    """What kube-controller-manager would give namespace ``default`` (its ServiceAccount
    and the ``kube-root-ca.crt`` ConfigMap every pod's token volume needs), so that the
    example pod and the operator's own start there."""
    from hami.testing.controlplane import ensure_namespace
    from hami.testing.node import ensure_root_ca

    assert bed.cp is not None
    client = bed.client()
    try:
        ensure_namespace(client, "default")
        ensure_root_ca(client, "default", bed.cp.ca_file)
    finally:
        client.close()


def _controllers(bed: ChartBed) -> None:
    """One :func:`~hami.testing.chartcontrol.reconcile` pass; prints what it did, or why
    the API refused (the next pass retries)."""
    from lightkube import ApiError

    from hami.testing.chartcontrol import reconcile

    assert bed.cp is not None
    client = bed.client()
    try:
        for line in reconcile(client, bed.cp.ca_file):
            print(f"controllers: {line}", flush=True)
    except ApiError as err:
        print(f"controllers: {err.status.message}", flush=True)
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Start the bed, print how to use it, run until Ctrl-C/SIGTERM, stop it. Exit status
    2 when this machine cannot run a node or a values file is unreadable."""
    from hami.testing.nodeprereq import NodeUnavailable
    from hami.testing.processes import BinariesMissing

    args = parse_args(argv)
    try:
        values = merged_values(args.values)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"error: {exc}")
        return 2
    print("starting: control plane, node (kubelet, containerd), images, helm install of "
          "deploy/helm/hami (one to three minutes) ...", flush=True)
    bed = ChartBed(values=values, release=args.release, namespace=args.namespace)
    try:
        bed.start()
    except (NodeUnavailable, BinariesMissing) as err:
        print(f"error: {err}")
        return 2
    _prepare_default_namespace(bed)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        (bed.workdir / NODE_VALUES).write_text(
            yaml.safe_dump(chart_test_values(bed.workdir / "inventory.yaml")))
        example = bed.workdir / "gpu-pod.yaml"
        example.write_text(yaml.safe_dump(gpu_test_pod("gpu-pod", EXAMPLE_COMMAND,
                                                       memory_mib=512)))
        print(usage(bed, example), flush=True)
        while not stop:
            time.sleep(1.0)
            assert bed.node is not None and bed.cp is not None
            bed.node.check_alive()
            bed.cp.check_alive()
            _controllers(bed)
    finally:
        print("stopping ...", flush=True)
        bed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
