"""hack/*/build.sh (k8s, containerd, helm) without a real build: a fake ``go`` first on
PATH records its arguments and writes the ``-o`` file, and HAMI_CACHE_DIR is a temporary
directory, so the scripts' cache check, locking, go build command line and output are
exercised in milliseconds and nothing is ever compiled."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: script dir => (cache dir prefix, binaries it builds, Go package of the first one)
SCRIPTS = {
    "k8s": ("k8s-", ("kube-apiserver", "kube-scheduler", "kubelet", "kube-controller-manager",
                     "etcd"), "k8s.io/kubernetes/cmd/kube-apiserver"),
    "containerd": ("containerd-", ("containerd", "containerd-shim-runc-v2", "ctr"),
                   "github.com/containerd/containerd/v2/cmd/containerd"),
    "helm": ("helm-", ("helm",), "helm.sh/helm/v3/cmd/helm"),
}

FAKE_GO = """#!/bin/sh
printf '%s\\n' "CGO_ENABLED=$CGO_ENABLED GOCACHE=$GOCACHE $*" >> "$FAKE_GO_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then printf 'fake\\n' > "$2"; chmod +x "$2"; fi
  shift
done
"""


def _run(tmp_path: Path, which: str, *args: str, **extra_env: str
         ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "go").write_text(FAKE_GO)
    (fake_bin / "go").chmod(0o755)
    log = tmp_path / "go.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAMI_")}
    env.update(PATH=f"{fake_bin}:{os.environ['PATH']}", HAMI_CACHE_DIR=str(tmp_path / "cache"),
               FAKE_GO_LOG=str(log), **extra_env)
    proc = subprocess.run([str(REPO / "hack" / which / "build.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def _bindir(tmp_path: Path, which: str) -> Path:
    proc, calls = _run(tmp_path, which, "--print-dir")
    assert proc.returncode == 0 and calls == []
    bindir = Path(proc.stdout.strip())
    assert bindir.parent.parent == tmp_path / "cache"
    assert bindir.parent.name.startswith(SCRIPTS[which][0] + "v") and bindir.name == "bin"
    return bindir


@pytest.mark.parametrize("which", SCRIPTS)
def test_print_dir_only_prints(tmp_path: Path, which: str) -> None:
    bindir = _bindir(tmp_path, which)
    assert not bindir.exists()  # --print-dir creates nothing


@pytest.mark.parametrize("which", SCRIPTS)
def test_full_cache_exits_at_once_without_go(tmp_path: Path, which: str) -> None:
    bindir = _bindir(tmp_path, which)
    bindir.mkdir(parents=True)
    for name in SCRIPTS[which][1]:
        (bindir / name).write_text("cached\n")
        (bindir / name).chmod(0o755)
    start = time.monotonic()
    proc, calls = _run(tmp_path, which)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 5
    assert calls == []
    assert proc.stdout.splitlines()[-1] == str(bindir)
    said = proc.stdout + proc.stderr
    for name in SCRIPTS[which][1]:
        assert f"build.sh: {name} present in {bindir}" in said
    assert not (bindir / ".lock").exists()  # no lock taken: a running build does not block it


def test_full_cache_needs_no_go_on_path(tmp_path: Path) -> None:
    """With every binary cached, k8s/build.sh succeeds where no ``go`` can be found."""
    bindir = _bindir(tmp_path, "k8s")
    bindir.mkdir(parents=True)
    for name in SCRIPTS["k8s"][1]:
        (bindir / name).write_text("cached\n")
        (bindir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAMI_")}
    tools = tmp_path / "tools"  # bash and the few tools the script uses, but no go
    tools.mkdir()
    for tool in ("bash", "dirname", "grep", "awk", "mkdir", "flock", "du", "cut", "rm"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                               text=True, check=True).stdout.strip()
        (tools / tool).symlink_to(found)
    env.update(PATH=str(tools), HAMI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([str(REPO / "hack/k8s/build.sh")], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(bindir)


@pytest.mark.parametrize("which", SCRIPTS)
def test_empty_cache_builds_each_binary_once(tmp_path: Path, which: str) -> None:
    bindir = _bindir(tmp_path, which)
    proc, calls = _run(tmp_path, which)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(bindir)
    names = SCRIPTS[which][1]
    assert len(calls) == len(names)
    gocache = bindir.parent / "go-build"
    for name, call in zip(names, calls, strict=True):
        assert call.startswith(f"CGO_ENABLED=0 GOCACHE={gocache} build -trimpath ")
        assert f" -o {bindir}/.{name}.tmp " in call
        assert (bindir / name).read_text() == "fake\n"
        assert not (bindir / f".{name}.tmp").exists()
    assert calls[0].endswith(" " + SCRIPTS[which][2])
    assert "-X" in calls[0]  # the version is stamped in
    said = proc.stdout + proc.stderr
    assert all(f"build.sh: built {name} in " in said for name in names)
    # a second run finds them all
    again, calls_again = _run(tmp_path, which)
    assert again.returncode == 0 and calls_again == calls


def test_missing_go_with_empty_cache_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAMI_")}
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "dirname", "grep", "awk"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                               text=True, check=True).stdout.strip()
        (tools / tool).symlink_to(found)
    env.update(PATH=str(tools), HAMI_CACHE_DIR=str(tmp_path / "cache"))
    for which in SCRIPTS:
        proc = subprocess.run([str(REPO / "hack" / which / "build.sh")], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 1
        assert "build.sh: needs Go" in proc.stderr


def test_go_mod_without_the_module_says_so(tmp_path: Path) -> None:
    """A go.mod that does not require the module: exit 1 with a line naming it."""
    (tmp_path / "hack" / "k8s").mkdir(parents=True)
    for rel in ("hack/lib.sh", "hack/k8s/build.sh"):
        (tmp_path / rel).write_text((REPO / rel).read_text())
    (tmp_path / "hack/k8s/go.mod").write_text("module example.com/x\n\ngo 1.25\n")
    proc = subprocess.run(["bash", str(tmp_path / "hack/k8s/build.sh"), "--print-dir"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1
    assert "no k8s.io/kubernetes requirement in" in proc.stderr


#: script dir => (its version variable, a release pinned under versions/, the Go package of
#: its first binary there)
OTHER_PINS = {
    "k8s": ("K8S_VERSION", "v1.31.14", "k8s.io/kubernetes/cmd/kube-apiserver"),
    "containerd": ("CONTAINERD_VERSION", "v1.7.35",
                   "github.com/containerd/containerd/cmd/containerd"),
}


@pytest.mark.parametrize("which", OTHER_PINS)
def test_version_variable_builds_another_pin(tmp_path: Path, which: str) -> None:
    """K8S_VERSION / CONTAINERD_VERSION (with or without the v) pick versions/<version>/:
    its own cache directory, its Go module, its version stamped in."""
    var, version, pkg = OTHER_PINS[which]
    proc, calls = _run(tmp_path, which, **{var: version.removeprefix("v")})
    assert proc.returncode == 0, proc.stderr
    bindir = tmp_path / "cache" / f"{SCRIPTS[which][0]}{version}" / "bin"
    assert proc.stdout.splitlines()[-1] == str(bindir)
    assert len(calls) == len(SCRIPTS[which][1])
    assert calls[0].endswith(" " + pkg) and f"={version}" in calls[0]
    pinned, _ = _run(tmp_path, which, "--print-dir")
    assert pinned.stdout.strip() != str(bindir)  # without the variable: the go.mod pin


@pytest.mark.parametrize("which", OTHER_PINS)
def test_version_variable_without_a_pin_says_so(tmp_path: Path, which: str) -> None:
    var = OTHER_PINS[which][0]
    proc, calls = _run(tmp_path, which, **{var: "v1.2.3"})
    assert proc.returncode == 1 and calls == []
    assert "v1.2.3 is not pinned" in proc.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("which", OTHER_PINS)
def test_the_tests_variable_picks_the_pin_too(tmp_path: Path, which: str) -> None:
    """HAMI_K8S_VERSION / HAMI_CONTAINERD_VERSION (what the tests read) pick the same pin
    when the build variable is unset, so a helper that runs build.sh inside a test run
    (deploy/local/quickstart.py) gets the release the test runs."""
    var, version, _ = OTHER_PINS[which]
    proc, _ = _run(tmp_path, which, "--print-dir", **{f"HAMI_{var}": version})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"{SCRIPTS[which][0]}{version}/bin")
