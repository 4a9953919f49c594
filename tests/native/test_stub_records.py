"""The stub driver's process records: a new process is never taken for a dead one.

The stub keeps one record per process in its state file (the memory each holds on each
card), keyed by PID and PID namespace so that a process that exec's keeps its record.
A new process can have the PID and namespace of a dead one: PIDs are reused inside a
namespace, and a container's PID 1 gets a new namespace whose inode the kernel may have
freed from a container that just ended (seen on the real node: a pod started after a
12000 MiB pod was deleted inherited its memory and was refused 11000 MiB on an empty
16384 MiB card). Its record must start empty.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from libvgpu_harness import Env

pytestmark = pytest.mark.native

MiB = 1 << 20


def test_a_new_process_with_a_dead_ones_pid_and_namespace_starts_with_no_memory(env: Env) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) (a PID namespace whose next PID can be set)")
    vgtest = env.build / "tests" / "vgtest"
    big = str(12000 * MiB)  # of the stub's 16384 MiB: two at once do not fit
    # in a fresh PID namespace: A holds 12000 MiB and is killed; the namespace's next
    # PID is set so that B gets A's PID (same namespace, same PID: A's key)
    script = (f"{vgtest} init alloc mem {big} 0 hold > {env.tmp}/a.out & A=$!; "
              f"until grep -q holding {env.tmp}/a.out; do sleep 0.05; done; "
              "kill -9 $A; wait $A; "
              "echo $((A - 1)) > /proc/sys/kernel/ns_last_pid; "
              f"{vgtest} init alloc mem {big} 0 echo done & B=$!; wait $B; "
              'echo "rc $? pids $A $B"')
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
                       env=env.environ(preload=False), capture_output=True, text=True,
                       timeout=60)
    summary = p.stdout.splitlines()[-1].split()
    assert summary[3] == summary[4], p.stdout  # B had A's PID in A's namespace
    assert summary[:2] == ["rc", "0"], (p.stdout, p.stderr)
    assert f"alloc mem {big} -> 0" in p.stdout and "done" in p.stdout
