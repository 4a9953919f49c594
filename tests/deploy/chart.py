"""Render the chart with the helm CLI (built by hack/helm/build.sh) for the deploy tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami"
CI_VALUES = CHART / "ci"
#: The release every test renders; its namespace must not be kube-system.
RELEASE = "hami"
NAMESPACE = "hami-system"
#: Kubernetes version the chart is rendered for (the e2e control plane's).
KUBE_VERSION = "v1.37.2"


def chart_range() -> str:
    """The chart's ``kubeVersion`` (``>=1.31.0-0``)."""
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])


def release_of(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a Kubernetes version (``v1.29.6``)."""
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def chart_floor() -> tuple[int, int]:
    """``(major, minor)`` of the chart's ``kubeVersion: ">=1.31.0-0"``."""
    wanted = chart_range()
    m = re.fullmatch(r">=\s*v?(\d+)\.(\d+)\.\d+(-0)?", wanted.strip())
    assert m, f"the chart's kubeVersion is no single floor: {wanted!r}"
    return int(m.group(1)), int(m.group(2))


class HelmMissing(RuntimeError):
    """No helm binary (run hack/helm/build.sh)."""


def helm_binary() -> str:
    """``$HAMI_HELM``, else the one hack/helm/build.sh built, else ``helm`` on PATH."""
    env = os.environ.get("HAMI_HELM")
    if env:
        return env
    bindir = subprocess.run([str(ROOT / "hack/helm/build.sh"), "--print-dir"], check=True,
                            capture_output=True, text=True).stdout.strip()
    built = Path(bindir) / "helm"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("helm")
    if found:
        return found
    raise HelmMissing("no helm: run hack/helm/build.sh (builds it from its Go module)")


def helm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm (``stdin``: its standard input, e.g. for ``-f -``); the result's
    returncode is not checked."""
    return subprocess.run([helm_binary(), *args], input=stdin, capture_output=True, text=True,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/hami-helm/cache",
                               "HELM_CONFIG_HOME": "/tmp/hami-helm/config",
                               "HELM_DATA_HOME": "/tmp/hami-helm/data"}, timeout=120)


def _set_args(values: Mapping[str, Any] | None,
              files: Sequence[Path]) -> tuple[list[str], str | None]:
    """helm's ``-f`` arguments and its standard input: ``values`` (JSON is YAML) go in
    through ``-f -``, so no values file is left behind (a file per render was)."""
    args: list[str] = []
    for f in files:
        args += ["-f", str(f)]
    if not values:
        return args, None
    return [*args, "-f", "-"], json.dumps(dict(values))


def render(values: Mapping[str, Any] | None = None, *, files: Sequence[Path] = (),
           namespace: str = NAMESPACE, kube_version: str = KUBE_VERSION,
           api_versions: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``helm template`` the chart and return every rendered object."""
    set_args, stdin = _set_args(values, files)
    cmd = ["template", RELEASE, str(CHART), "--namespace", namespace,
           "--kube-version", kube_version, *set_args]
    for api in api_versions:
        cmd += ["--api-versions", api]
    proc = helm(*cmd, stdin=stdin)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(objs: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of ``kind`` (and ``name``)."""
    hits = [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return dict(hits[0])


def kinds(objs: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def scheduler_config(objs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the chart gives kube-scheduler."""
    cm = find(objs, "ConfigMap", f"{RELEASE}-scheduler-config")
    return dict(yaml.safe_load(cm["data"]["config.yaml"]))


def container(pod_spec: Mapping[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    hits = [c for c in pod_spec.get(key) or [] if c["name"] == name]
    assert len(hits) == 1, f"container {name}"
    return dict(hits[0])


def render_notes(values: Mapping[str, Any] | None = None, *, files: Sequence[Path] = (),
                 kube_version: str = KUBE_VERSION, below_floor: bool = False) -> str:
    """NOTES.txt as `helm install` prints it (helm template skips NOTES.txt: a copy of the
    chart renders it into a ConfigMap instead). ``below_floor``: the copy drops the
    chart's ``kubeVersion`` range, to render what its templates say on an older API."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "hami"
        shutil.copytree(CHART, chart)
        (chart / "notes.tpl").write_text((CHART / "templates" / "NOTES.txt").read_text())
        if below_floor:
            meta = chart / "Chart.yaml"
            meta.write_text("\n".join(ln for ln in meta.read_text().splitlines()
                                      if not ln.startswith("kubeVersion:")) + "\n")
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
            'data:\n  NOTES.txt: {{ tpl (.Files.Get "notes.tpl") . | toJson }}\n')
        set_args, stdin = _set_args(values, files)
        proc = helm("template", RELEASE, str(chart), "--namespace", NAMESPACE,
                    "--kube-version", kube_version, "--show-only", "templates/zz-notes.yaml",
                    *set_args, stdin=stdin)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return str(yaml.safe_load(proc.stdout)["data"]["NOTES.txt"])
