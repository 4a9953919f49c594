"""Container images for the real test node, built without a registry or a Docker engine.

Two images, each a single layer packed with ``umoci`` (OCI image layout) and turned into
a ``docker-archive`` tarball by ``skopeo``, ready for ``ctr -n k8s.io images import``:

- the pod sandbox ("pause") image: Kubernetes' own ``build/pause/linux/pause.c`` from
  the Go module cache (the same release as the control plane), compiled static;
- the GPU test image: busybox-static for a shell, libvgpu's ``vgtest`` driver client and
  the stub CUDA driver and NVML (``libcuda.so.1``, ``libnvidia-ml.so.1``) where a real
  NVIDIA container runtime would mount the host's driver, plus the glibc files they need.

Nothing here reaches a network: inputs are Debian packages (busybox-static, umoci,
skopeo), the C toolchain, the libvgpu build tree and the Go module cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The sandbox image name containerd is configured with (never pulled).
PAUSE_IMAGE = "hami.local/pause:test"
#: The GPU test image; pods use ``imagePullPolicy: Never``.
GPU_TEST_IMAGE = "hami.local/gpu-test:test"
#: Where the stub driver libraries live inside the GPU test image (on the loader's
#: default multiarch path, as the NVIDIA container toolkit mounts the real ones).
DRIVER_DIR = "/usr/lib/x86_64-linux-gnu"

TOOLS = ("umoci", "skopeo", "busybox", "gcc", "go")


class ImageBuildError(RuntimeError):
    """A tool is missing or failed; the message names it and carries its output."""


@dataclass(frozen=True)
class ImageArchive:
    """A ``docker-archive`` tarball holding one image.

    Attributes:
        name: the image reference stored in the archive (what pods and containerd use).
        path: the tarball.
    """

    name: str
    path: Path


def missing_tools(tools: Iterable[str] = TOOLS) -> list[str]:
    """Names of the image-building tools not found on ``PATH``."""
    return [t for t in tools if shutil.which(t) is None]


def _run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
         ) -> str:
    try:
        p = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=300)
    except FileNotFoundError as err:
        raise ImageBuildError(f"{argv[0]} not found: {err}") from None
    if p.returncode != 0:
        raise ImageBuildError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout


def pause_source(k8s_version: str) -> Path:
    """``build/pause/linux/pause.c`` of ``k8s.io/kubernetes@<k8s_version>`` in the Go module
    cache (filled by ``hack/k8s/build.sh``).

    Raises:
        ImageBuildError: Go is missing or the module is not in the cache.
    """
    modcache = _run(["go", "env", "GOMODCACHE"]).strip()
    src = Path(modcache) / f"k8s.io/kubernetes@{k8s_version}" / "build/pause/linux/pause.c"
    if not src.is_file():
        raise ImageBuildError(f"{src} is missing: run hack/k8s/build.sh (it downloads the module)")
    return src


def _pack(rootfs: Path, name: str, entrypoint: Sequence[str], work: Path,
          env: Mapping[str, str] | None = None) -> ImageArchive:
    """One-layer image from ``rootfs`` with ``entrypoint`` (and ``env``, the image's
    environment), as a docker-archive tarball."""
    layout = work / "oci"
    tag = hashlib.sha256(name.encode()).hexdigest()[:12]
    if not layout.exists():
        _run(["umoci", "init", "--layout", str(layout)])
    ref = f"{layout}:{tag}"
    _run(["umoci", "new", "--image", ref])
    _run(["umoci", "insert", "--image", ref, str(rootfs), "/"])
    argv = ["umoci", "config", "--image", ref, "--os", "linux", "--architecture", "amd64"]
    for part in entrypoint:
        argv += ["--config.entrypoint", part]
    for key, value in (env or {}).items():
        argv += ["--config.env", f"{key}={value}"]
    _run(argv)
    out = work / f"{tag}.tar"
    out.unlink(missing_ok=True)
    _run(["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{layout}:{tag}",
          f"docker-archive:{out}:{name}"])
    return ImageArchive(name, out)


def build_pause(work: Path, k8s_version: str) -> ImageArchive:
    """The sandbox image: Kubernetes' ``pause.c`` compiled static, at ``/pause``.

    Raises:
        ImageBuildError: a tool failed (message has its output).
    """
    rootfs = work / "pause-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.mkdir(parents=True)
    src = pause_source(k8s_version)
    _run([os.environ.get("CC", "gcc"), "-Os", "-static", "-DVERSION=hami-test", "-o",
          str(rootfs / "pause"), str(src)])
    _run(["strip", str(rootfs / "pause")])
    return _pack(rootfs, PAUSE_IMAGE, ["/pause"], work)


def _needed_libraries(binaries: Iterable[Path], skip: Iterable[str]) -> set[Path]:
    """Absolute paths of the shared objects ``ldd`` resolves for ``binaries`` (the
    loader included), except names in ``skip``."""
    skipped = set(skip)
    found: set[Path] = set()
    for b in binaries:
        for line in _run(["ldd", str(b)]).splitlines():
            parts = line.split()
            path = next((p for p in parts if p.startswith("/")), None)
            if path is None or Path(path).name in skipped:
                continue
            found.add(Path(path))
    return found


def _copy_resolved(src: Path, rootfs: Path) -> None:
    """Copy ``src`` (following links) to the same absolute path under ``rootfs``."""
    dest = rootfs / str(src).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src.resolve(), dest)


def build_gpu_test_image(work: Path, libvgpu_build: Path) -> ImageArchive:
    """The GPU test image: ``/bin/busybox`` (+ applet links), ``/usr/local/bin/vgtest``,
    the stub driver in :data:`DRIVER_DIR`, and glibc.

    Args:
        work: scratch directory.
        libvgpu_build: ``native/libvgpu/build`` after ``make -C native/libvgpu``.

    Raises:
        ImageBuildError: a tool failed or the libvgpu build is missing.
    """
    vgtest = libvgpu_build / "tests" / "vgtest"
    stubs = [libvgpu_build / "stub" / "libcuda.so.1", libvgpu_build / "stub" / "libnvidia-ml.so.1"]
    for f in (vgtest, *stubs):
        if not f.is_file():
            raise ImageBuildError(f"{f} is missing: run `make native` first")
    rootfs = work / "gpu-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    for d in ("bin", "usr/local/bin", DRIVER_DIR.lstrip("/"), "tmp", "etc", "proc", "sys",
              "dev", "var/run"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    busybox = Path(shutil.which("busybox") or "/bin/busybox")
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for applet in _run([str(busybox), "--list"]).split():
        if applet != "busybox":
            (rootfs / "bin" / applet).symlink_to("busybox")
    shutil.copy2(vgtest, rootfs / "usr/local/bin/vgtest")
    for stub in stubs:
        shutil.copy2(stub, rootfs / DRIVER_DIR.lstrip("/") / stub.name)
    # glibc for vgtest and for libvgpu.so, which Allocate mounts from the host and
    # /etc/ld.so.preload loads into every process (busybox is static)
    libs = _needed_libraries([vgtest, libvgpu_build / "libvgpu.so"],
                             skip=[s.name for s in stubs])
    for lib in libs:
        _copy_resolved(lib, rootfs)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    return _pack(rootfs, GPU_TEST_IMAGE, ["/bin/sh"], work)
