"""hami's own images for the real test node, built without a registry or a container engine.

- the hami image (what ``deploy/docker/*.Dockerfile`` build for users): a Python runtime
  rootfs made of the running interpreter and its standard library (``sys.base_prefix``),
  hami from this checkout and every runtime distribution hami requires, copied from the
  environment the tests run in (so the image holds exactly the versions that were
  tested), and ``libvgpu.so`` at ``/opt/hami/lib/libvgpu.so`` where the chart's
  ``install-libvgpu`` step looks for it. ``hami`` is on ``PATH`` as in the Dockerfiles.
  One image serves as both the scheduler and the device-plugin image;
- the kube-scheduler image: the statically linked ``kube-scheduler`` built by
  ``hack/k8s/build.sh`` under the name the chart renders by default
  (``registry.k8s.io/kube-scheduler:<cluster version>``), so it is never pulled.

Both are packed like the other test images (:mod:`hami.testing.images`: umoci, skopeo,
``docker-archive``). Nothing here reaches a network.

Run ``python -m hami.testing.hamiimage OUTDIR`` to build the archives by hand (then
``ctr -n k8s.io images import OUTDIR/*.tar`` on a node).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hami.testing.images import (
    ImageArchive,
    ImageBuildError,
    _copy_resolved,
    _needed_libraries,
    _pack,
)

#: The hami image's name (chart values: registry hami.local, repository hami, tag test).
HAMI_IMAGE = "hami.local/hami:test"
#: Where the rootfs keeps the interpreter, the standard library and site-packages.
PREFIX = "/opt/hami"
#: Standard-library entries a server never imports (tests, GUI, build files, installers).
STDLIB_SKIP = frozenset({"test", "site-packages", "idlelib", "tkinter", "turtledemo",
                         "ensurepip", "lib2to3", "dist-packages"})
REPO = Path(__file__).resolve().parents[3]


def kube_scheduler_image_name(k8s_version: str) -> str:
    """What the chart renders for kube-scheduler with default values on a cluster of
    ``k8s_version`` (``v1.37.2``)."""
    return f"registry.k8s.io/kube-scheduler:{k8s_version}"


def runtime_distributions(root: str = "hami") -> list[md.Distribution]:
    """``root`` and every distribution it requires, transitively, as installed here.

    Requirements limited to an extra (``extra == "dev"``) are left out; a requirement whose
    environment marker excludes this interpreter is not installed and is skipped.

    Raises:
        ImageBuildError: ``root`` is not installed in this environment.
    """
    try:
        first = md.distribution(root)
    except md.PackageNotFoundError:
        raise ImageBuildError(f"{root} is not installed in {sys.prefix}") from None
    seen: dict[str, md.Distribution] = {}
    todo = [first]
    while todo:
        dist = todo.pop()
        key = _norm(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = dist
        for req in dist.requires or []:
            name, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
            if m is None:
                continue
            try:
                todo.append(md.distribution(m.group(1)))
            except md.PackageNotFoundError:
                continue  # excluded by its marker on this interpreter
    return list(seen.values())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_files(dist: md.Distribution) -> Iterator[tuple[Path, Path]]:
    """(installed file, path relative to site-packages) of ``dist``; scripts and files
    outside site-packages are skipped."""
    base = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        rel = Path(str(f))
        if rel.parts and rel.parts[0] == "..":
            continue
        src = base / rel
        if src.is_file():
            yield src, rel


def _copy_tree(src: Path, dest: Path, skip: Iterable[str] = ()) -> None:
    skipped = set(skip)
    shutil.copytree(src, dest, symlinks=False, dirs_exist_ok=True,
                    ignore=lambda d, names: [n for n in names if n in skipped and
                                             Path(d) == src])


def assemble_python_rootfs(rootfs: Path, src_dir: Path = REPO / "src") -> Path:
    """Interpreter + stdlib + hami + its runtime distributions under ``rootfs``.

    Layout: ``/opt/hami/bin/python3`` (and ``hami``), ``/opt/hami/lib/python3.X`` with
    ``site-packages``; the shared libraries they load at their host paths. Compiled
    ``__pycache__`` files come along (copies keep mtimes, so they stay valid).

    Returns the ``site-packages`` directory inside ``rootfs``.

    Raises:
        ImageBuildError: hami is not installed here or ``ldd`` failed.
    """
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prefix = rootfs / PREFIX.lstrip("/")
    bindir = prefix / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    shutil.copy2(exe, bindir / ver)
    (bindir / "python3").symlink_to(ver)
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix,
                                            "platbase": sys.base_prefix})["stdlib"])
    libdir = prefix / "lib" / ver
    _copy_tree(stdlib, libdir, skip=STDLIB_SKIP | {n.name for n in stdlib.glob("config-*")})
    site = libdir / "site-packages"
    site.mkdir(exist_ok=True)
    for dist in runtime_distributions():
        if _norm(dist.metadata["Name"]) == "hami":
            continue  # from this checkout below, not the (editable) install
        for f, rel in _dist_files(dist):
            dest = site / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
    _copy_tree(src_dir / "hami", site / "hami")
    script = bindir / "hami"
    script.write_text(f"#!{PREFIX}/bin/python3\nimport sys\nfrom hami.cli import app\n"
                      "sys.exit(app())\n")
    script.chmod(0o755)
    # the C libraries the interpreter and the extension modules load from the system
    objects = [exe, *libdir.rglob("*.so"), *libdir.rglob("*.so.*")]
    for lib in _needed_libraries(objects, skip=()):
        if not str(lib).startswith(str(rootfs)):
            _copy_resolved(lib, rootfs)
    for d in ("tmp", "etc", "proc", "sys", "dev"):
        (rootfs / d).mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/false\n"
                                           "nonroot:x:65532:65532::/:/bin/false\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\nnonroot:x:65532:\n")
    return site


def build_hami_image(work: Path, libvgpu_build: Path, src_dir: Path = REPO / "src"
                     ) -> ImageArchive:
    """The hami image (see the module docstring) as a docker-archive in ``work``.

    Raises:
        ImageBuildError: ``libvgpu.so`` is missing (``make native``), hami is not
            installed here, or a packing tool failed.
    """
    lib = libvgpu_build / "libvgpu.so"
    if not lib.is_file():
        raise ImageBuildError(f"{lib} is missing: run `make native` first")
    rootfs = work / "hami-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    assemble_python_rootfs(rootfs, src_dir)
    shutil.copy2(lib, rootfs / PREFIX.lstrip("/") / "lib" / "libvgpu.so")
    env = {"PATH": f"{PREFIX}/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1"}
    return _pack(rootfs, HAMI_IMAGE, [f"{PREFIX}/bin/hami"], work, env=env)


def build_kube_scheduler_image(work: Path, binary: Path, k8s_version: str) -> ImageArchive:
    """kube-scheduler (static) at ``/usr/local/bin/kube-scheduler``, named as the chart's
    default image for a cluster of ``k8s_version``.

    Raises:
        ImageBuildError: the binary is missing or a packing tool failed.
    """
    if not binary.is_file():
        raise ImageBuildError(f"{binary} is missing: run hack/k8s/build.sh")
    rootfs = work / "kube-scheduler-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    (rootfs / "usr/local/bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir()
    (rootfs / "tmp").chmod(0o1777)
    shutil.copy2(binary, rootfs / "usr/local/bin/kube-scheduler")
    return _pack(rootfs, kube_scheduler_image_name(k8s_version),
                 ["/usr/local/bin/kube-scheduler"], work,
                 env={"PATH": "/usr/local/bin:/usr/bin:/bin"})


def main(argv: list[str] | None = None) -> int:
    """``python -m hami.testing.hamiimage OUTDIR``: build both archives, print their
    names, paths and the seconds each took."""
    from hami.testing.controlplane import KUBERNETES_VERSION, default_bin_dir

    p = argparse.ArgumentParser(prog="python -m hami.testing.hamiimage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--libvgpu-build", type=Path, default=REPO / "native/libvgpu/build")
    args = p.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    try:
        builds: list[Callable[[], Any]] = [
            lambda: build_hami_image(args.outdir, args.libvgpu_build),
            lambda: build_kube_scheduler_image(args.outdir, default_bin_dir() / "kube-scheduler",
                                               KUBERNETES_VERSION)]
        for build in builds:
            t0 = time.monotonic()
            img = build()
            print(f"{img.name} {img.path} {time.monotonic() - t0:.1f}s")
    except ImageBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
