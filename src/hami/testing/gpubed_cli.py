"""``python -m hami.testing.gpubed up`` (``make cluster NODE=real``): a
:class:`~hami.testing.gpubed.GpuBed` in the foreground until Ctrl-C or SIGTERM, with an
example GPU pod to apply.

Options choose how the node serves GPU pods:

* ``--allocate-mode node-lock`` (default): HAMi's protocol, the device plugin's
  ``Allocate`` after hami's ``/bind`` took the node lock;
* ``--allocate-mode cdi``: the device plugin answers a CDI device per container and writes
  the limits at ``PreStartContainer`` from the kubelet's pod-resources API; no node lock
  (docs/performance.md, "Allocate mode cdi");
* ``--allocate-mode auto``: the device plugin chooses from the Node's runtime and kubelet
  versions (the chart's default); the bed's containerd 2.x makes it ``cdi``;
* ``--dra``: DRA mode next to it (:func:`hami.testing.dranode.start_dra`:
  kube-controller-manager, the DeviceClass, ``hami dra-plugin`` publishing the node's
  ResourceSlice); the example is then the pod as hami's DRA webhook rewrites it (a
  ResourceClaimTemplate and a pod that uses it), placed by kube-scheduler alone.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from hami.testing.gpubed import GpuBed
from hami.testing.gpupods import gpu_test_pod

#: ``hami device-plugin`` arguments of allocate mode cdi on the bed's node (its kubelet's
#: pod-resources socket and its containerd's CDI directory, inside the node's namespace).
CDI_PLUGIN_ARGS = ("--allocate-mode=cdi",
                   "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
                   "--cdi-spec-dir=/run/cdi")
#: Allocate mode auto with the same sockets (the plugin picks cdi on the bed's containerd 2.x).
AUTO_PLUGIN_ARGS = ("--allocate-mode=auto", *CDI_PLUGIN_ARGS[1:])
ALLOCATE_MODES = ("node-lock", "cdi", "auto")
#: The example pod's command: a 512 MiB slice allocated whole, then one byte more; then it
#: keeps holding the slice, so that the monitor's metrics show it, until it is deleted.
EXAMPLE_COMMAND = ("vgtest init info alloc mem 536870912 0 alloc mem 1 2 info "
                   "echo holding-512MiB hold")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` without the program name; default ``sys.argv[1:]``).

    Raises:
        SystemExit: status 2 with argparse's message for an unknown command or value.
    """
    parser = argparse.ArgumentParser(prog="python -m hami.testing.gpubed",
                                     description="hami on a real node (no GPU needed)")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--node", default="gpu-node-0", help="the Node's name")
    parser.add_argument("--allocate-mode", choices=ALLOCATE_MODES, default="node-lock",
                        help="the device plugin's allocate mode: node-lock (HAMi's "
                             "protocol), cdi (no node lock; CDI specs written at "
                             "PreStartContainer) or auto (the plugin chooses from the "
                             "Node's runtime version)")
    parser.add_argument("--dra", action="store_true",
                        help="also run DRA mode (kube-controller-manager, hami "
                             "dra-plugin); the example pod then uses a ResourceClaim")
    return parser.parse_args(argv)


def plugin_args(allocate_mode: str) -> tuple[str, ...]:
    """``hami device-plugin`` arguments for ``allocate_mode`` (``node-lock``: none, the
    plugin's default).

    Raises:
        ValueError: a mode not in :data:`ALLOCATE_MODES`.
    """
    if allocate_mode not in ALLOCATE_MODES:
        raise ValueError(f"allocate mode {allocate_mode!r}: expected one of {ALLOCATE_MODES}")
    return {"cdi": CDI_PLUGIN_ARGS, "auto": AUTO_PLUGIN_ARGS}.get(allocate_mode, ())


def example_objects(dra: bool) -> list[dict[str, Any]]:
    """The example to ``kubectl apply``: pod ``gpu-pod`` asking for a 512 MiB slice; with
    ``dra``, the ResourceClaimTemplate(s) and pod that hami's DRA webhook makes of it
    (``hami.dra.translate``), so it is placed from the node's ResourceSlice."""
    pod = gpu_test_pod("gpu-pod", EXAMPLE_COMMAND, memory_mib=512)
    if not dra:
        return [pod]
    from hami.devices.nvidia import NvidiaConfig
    from hami.dra.translate import translate

    translated = translate(pod, NvidiaConfig())
    assert translated is not None, "a gpumem pod is always translated"
    return [*translated.templates.values(), translated.pod]


def main(argv: Sequence[str] | None = None) -> int:
    """Start the bed, print how to use it, run until Ctrl-C/SIGTERM. Exit status 2 when
    this machine cannot run a node or DRA mode lacks kube-controller-manager (the reason
    is printed)."""
    from hami.testing.nodeprereq import NodeUnavailable
    from hami.testing.processes import BinariesMissing

    args = parse_args(argv)
    extra = ", hami dra-plugin and kube-controller-manager" if args.dra else ""
    print("starting: control plane, hami scheduler + webhook, kube-scheduler, containerd, "
          f"kubelet, hami device-plugin (allocate mode {args.allocate_mode}) and "
          f"monitor{extra} (about 20 s) ...", flush=True)
    bed = GpuBed(node_name=args.node, plugin_args=plugin_args(args.allocate_mode))
    try:
        bed.start()
    except NodeUnavailable as err:
        print(f"error: {err}")
        return 2
    try:
        if args.dra:
            from hami.testing.dranode import start_dra

            start_dra(bed)
    except BinariesMissing as err:
        bed.stop()
        print(f"error: {err}")
        return 2
    except BaseException:
        bed.stop()
        raise
    _print_usage(bed, args.dra)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop:
            time.sleep(0.5)
            bed.check_alive()
    finally:
        bed.stop()
    return 0


def _print_usage(bed: GpuBed, dra: bool) -> None:
    assert bed.cp is not None and bed.node is not None
    example = bed.workdir / ("dra-pod.yaml" if dra else "gpu-pod.yaml")
    example.write_text(yaml.safe_dump_all(example_objects(dra)))
    what = ("ResourceClaim for a 512 MiB slice" if dra else "512 MiB slice")
    more = ("\n  kubectl get resourceslices      # the node's GPUs, as hami dra-plugin "
            "publishes them" if dra else "")
    ready_s = bed.timings["total"] + bed.timings.get("dra-plugin", 0.0)
    print(f"""ready in {ready_s:.0f} s. In another shell:
  export KUBECONFIG={bed.cp.kubeconfig}
  kubectl apply -f {example}      # {what}; vgtest allocates it, then 1 byte more
  kubectl get pod gpu-pod         # Running after a few seconds, holding its slice{more}
  cat {bed.node.host_path('/var/log/pods')}/default_gpu-pod_*/c/0.log
  curl -s http://127.0.0.1:{bed.monitor_port}/metrics | grep hami_vgpu   # its series
  kubectl delete pod gpu-pod --grace-period=0   # the series go with it
logs: {bed.workdir}/k8s/logs and {bed.workdir}/node/logs. Ctrl-C stops everything.""",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
