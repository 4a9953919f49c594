"""The monitor's feedback file on the real kubelet and containerd, in both allocate modes.

Inside a GPU pod ``<HOOK_PATH>/vgpu/feedback`` (next to libvgpu, in the container's own
cache directory) is the plugin's file: the container can neither write, remove nor
rename it (read-only bind mount), and it sees the monitor's writes to it: created as
"limited" (switch 1), it turns "uncontended" (switch 0) once the monitor has ticked
with the container alone on its card.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Pod

from hami.deviceplugin import feedbackfile
from hami.testing.controlplane import wait_until
from hami.testing.gpubed import GpuBed, default_inventory
from hami.testing.gpubed_cli import plugin_args
from hami.testing.gpupods import gpu_test_pod
from tests.realnode.conftest import running_bed, skip_or_fail

INITIAL = feedbackfile.encode(*feedbackfile.INITIAL).hex()
FREE = feedbackfile.encode(0, False).hex()
#: Prints the feedback file's bytes ("fb <hex>") and tries to write, remove and rename it
#: ("write ok|refused", "rm ...", "mv ..."). Also used by the DRA real-node test.
PROBE = (
    'f="${CUDA_DEVICE_MEMORY_SHARED_CACHE%/*}/feedback"; '
    "show() { od -An -tx1 -v \"$f\" | tr -d ' \\n'; }; "
    'echo "fb $(show)"; '
    "if ( printf XXXXXXXXXXXXXXXX > \"$f\" ) 2>/dev/null; then echo 'write ok'; else echo 'write refused'; fi; "
    "if ( rm -f \"$f\" ) 2>/dev/null && [ ! -e \"$f\" ]; then echo 'rm ok'; else echo 'rm refused'; fi; "
    "if ( mv \"$f\" \"$f.x\" ) 2>/dev/null; then echo 'mv ok'; else echo 'mv refused'; fi"
)
#: The probe, one launch, then the bytes again whenever they change (at most 120 s).
SCRIPT = (
    f"{PROBE}; vgtest init launch 1 1; "
    'last="$(show)"; i=0; while [ $i -lt 240 ]; do now="$(show)"; '
    'if [ "$now" != "$last" ]; then echo "fb $now"; last="$now"; fi; '
    f'if [ "$now" = "{FREE}" ]; then break; fi; sleep 0.5; i=$((i+1)); done; echo finished'
)


def probed(log: str) -> tuple[list[str], list[str]]:
    """The probe's verdicts (write, rm, mv) and every "fb" value of a pod's log."""
    lines = log.splitlines()
    return ([ln for ln in lines if ln.endswith((" ok", " refused"))],
            [ln.split()[1] for ln in lines if ln.startswith("fb ") and len(ln.split()) > 1])


@pytest.fixture(scope="module", params=["node-lock", "cdi"])
def bed(request: pytest.FixtureRequest) -> Iterator[GpuBed]:
    mode = request.param
    if mode == "cdi":
        from hami.testing import node as nodemod

        if not hasattr(nodemod.RealNode, "cdi_dir"):
            skip_or_fail("the real node has no containerd with CDI in this tree")
    workdir = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))  # short: socket paths
    try:
        with running_bed(workdir=workdir, inventory=default_inventory(gpus=1),
                         plugin_args=plugin_args(mode)) as b:
            b.start_monitor()
            yield b
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # nothing left on the host


@pytest.fixture
def client(bed: GpuBed) -> Iterator[Any]:
    c = bed.client()
    yield c
    for p in c.list(Pod, namespace="default"):
        c.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
    wait_until(lambda: not list(c.list(Pod, namespace="default")), timeout_s=60,
               what="the test's pods deleted")
    c.close()


def test_the_feedback_file_is_read_only_in_the_pod_and_follows_the_monitor(
        bed: GpuBed, client: Any) -> None:
    client.create(codecs.from_dict(gpu_test_pod("fb", SCRIPT, memory_mib=2000,
                                                cores_percent=30, stub_devices=1)))
    assert bed.node is not None
    node = bed.node

    def log() -> str:
        return node.container_log("default", "fb", "c")

    wait_until(lambda: "finished" in log(), timeout_s=180, what="the pod's script finished")
    verdicts, seen = probed(log())
    assert verdicts == ["write refused", "rm refused", "mv refused"], log()
    assert seen[0] == INITIAL and seen[-1] == FREE, log()
