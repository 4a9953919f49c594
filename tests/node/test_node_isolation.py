"""What Allocate hands a container so that the node side holds against it (issue 12 §4):
a read-only limits file next to libvgpu and a lock directory of its own, both from a
host directory the container never sees. Through the real plugin (gRPC, fake kubelet);
the last test then runs libvgpu on the stub driver inside the mounts the response
asks for (a private mount namespace), with the environment wiped."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from hami.deviceplugin import allocate as al
from hami.deviceplugin import feedbackfile
from hami.monitor.lister import ContainerLister
from tests.node.conftest import PluginHarness
from tests.node.test_plugin_grpc import A, B, bound_pod, up, wait

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "libvgpu" / "build"
MiB = 1 << 20


def _mounts(c: object) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in c.mounts}  # type: ignore[attr-defined]


def test_each_container_gets_a_read_only_limits_file_and_its_own_lock_dir(harness: PluginHarness) -> None:
    up(harness)
    h = harness.hook_path
    bound_pod(harness, "p", f"{A},NVIDIA,3000,30:;{B},NVIDIA,2000,20:;", containers=("c1", "c2"))
    resp = [harness.kubelet.allocate([f"{A}-0"]).container_responses[0],
            harness.kubelet.allocate([f"{B}-0"]).container_responses[0]]
    wait(lambda: harness.kube.pods[("default", "p")].annotations.get(al.BIND_PHASE) == "success")
    locks = []
    for name, c, limit, cores in (("c1", resp[0], "3000m", "30"), ("c2", resp[1], "2000m", "20")):
        m = _mounts(c)
        private = Path(f"{h}/vgpu/containers/uid-p_{name}.plugin")
        assert m[f"{h}/vgpu/limits.env"] == (str(private / "limits.env"), True)
        text = (private / "limits.env").read_text()
        assert text == (f"CUDA_DEVICE_MEMORY_LIMIT_0={limit}\nCUDA_DEVICE_SM_LIMIT={cores}\n"
                        f"CUDA_DEVICE_MEMORY_SHARED_CACHE={c.envs['CUDA_DEVICE_MEMORY_SHARED_CACHE']}\n")
        assert stat.S_IMODE((private / "limits.env").stat().st_mode) == 0o444
        # the monitor's feedback file: read-only in the container, safe initial values
        assert m[f"{h}/vgpu/feedback"] == (str(private / "feedback"), True)
        assert feedbackfile.decode((private / "feedback").read_bytes()) == (1, False)
        lock_host, ro = m["/tmp/vgpulock"]
        assert (lock_host, ro) == (str(private / "vgpulock"), False) and Path(lock_host).is_dir()
        locks.append(lock_host)
        # no mount source lies in a directory the container can write (its cache dir):
        # it could otherwise replace the source with a symlink before a restart
        cache_dir = m[f"{h}/vgpu"][0]
        assert all(not src.startswith(cache_dir + "/") for src, _ in m.values())
    assert locks[0] != locks[1]
    # the monitor never takes the plugin's directory for a container's, and removes it
    # with the pod
    lister = ContainerLister(Path(f"{h}/vgpu/containers"), grace_s=0.0)
    lister.update({"uid-p"})
    assert "uid-p_c1.plugin" not in lister.errors and "uid-p_c1.plugin" not in lister.containers
    lister.update(set())
    assert not Path(f"{h}/vgpu/containers/uid-p_c1.plugin").exists()


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or not _can_unshare(),
                    reason="needs root and unshare -m to apply the response's bind mounts")
def test_a_process_that_lost_its_environment_keeps_the_limit(harness: PluginHarness) -> None:
    """Allocate, then the container as the runtime would build it from the response (bind
    mounts, read-only where asked): a process started with ``env -i`` and only the preload
    gets the granted 48 MiB, in the container's region; the limits file cannot be
    changed from inside."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "libvgpu")], check=True, capture_output=True)
    up(harness)
    h = harness.hook_path
    (h / "vgpu").mkdir(parents=True, exist_ok=True)
    shutil.copy(BUILD / "libvgpu.so", h / "vgpu" / "libvgpu.so")
    bound_pod(harness, "p", f"{A},NVIDIA,48,30:;")
    c = harness.kubelet.allocate([f"{A}-0"]).container_responses[0]
    mounts = sorted(((m.container_path, m.host_path, m.read_only) for m in c.mounts
                     if m.container_path.startswith(f"{h}/")), key=lambda m: m[0].count("/"))
    # the host's view of the hook path stays reachable at /mnt once the container's
    # mounts cover it (here host and container paths are the same)
    script = ["set -e", "mount --make-rprivate /", f"mount --bind '{h}' /mnt"]
    for cpath, host, ro in mounts:  # parents first, like the container runtime
        src = "/mnt" + host[len(str(h)):] if host.startswith(f"{h}/") else host
        script.append(f"[ -e '{cpath}' ] || touch '{cpath}'")
        script.append(f"mount --bind '{src}' '{cpath}'")
        if ro:
            script.append(f"mount -o remount,bind,ro '{cpath}'")
    script += [f"if echo CUDA_DEVICE_MEMORY_LIMIT_0=80g > '{h}/vgpu/limits.env'; then echo writable; fi",
               f"exec env -i LD_PRELOAD='{h}/vgpu/libvgpu.so' LD_LIBRARY_PATH='{BUILD / 'stub'}' "
               f"VGPU_STUB_STATE='{harness.root / 'stub.state'}' '{BUILD / 'tests' / 'vgtest'}' "
               f"init alloc mem {48 * MiB + 1} -1 alloc mem {48 * MiB} -1"]
    p = subprocess.run(["unshare", "-m", "sh", "-c", "\n".join(script)], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "writable" not in p.stdout
    assert [ln.rsplit(" ", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("alloc ")] == ["2", "0"], \
        p.stdout + p.stderr
    # the process used the container's region (the file's cache path), on the host
    cache = Path(f"{h}/vgpu/containers/uid-p_c") / Path(c.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name
    assert cache.stat().st_size == 2_008_953
