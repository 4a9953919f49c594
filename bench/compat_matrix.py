"""The version matrix: hami's test layers against several Kubernetes and containerd releases.

For each Kubernetes release (``--k8s``; pinned by ``hack/k8s/pin.sh``, built by
``hack/k8s/build.sh`` with ``K8S_VERSION``) it runs, each as one pytest run with
``HAMI_K8S_VERSION`` set (and ``HAMI_CONTAINERD_VERSION`` for the real node):

* ``cp``: the control-plane e2e suite (``tests/e2e``: real etcd, kube-apiserver,
  kube-scheduler, kube-controller-manager of that release; extender and DRA mode);
* ``chart``: the chart installed by helm on that API server (``tests/deploy/e2e``),
  rendered with the server's own API versions;
* ``node``: the chart on a real node (that release's kubelet, containerd ``--containerd``,
  runc) and a GPU pod through it, allocate mode ``auto`` (``tests/realnode/
  test_chart_on_node.py``), and pods bound at once in mode ``cdi`` (``tests/realnode/
  test_lockfree.py``: ``auto`` on containerd 2.x, set explicitly on 1.7), once per
  containerd release.

Each pytest run holds ``/tmp/hami-heavy.lock`` (one control plane at a time on a shared
machine). The results (passed / failed / skipped / errors per run, the failing and skipped
test ids with their first line, the seconds each took) go to a JSON lines file and a
Markdown table (``--out``, default ``bench/results/compat_matrix``).

Usage::

    python bench/compat_matrix.py --k8s v1.31.14 v1.33.13 v1.37.2 \
        --containerd v2.4.2 v1.7.35 [--layers cp chart node] [--build]
    make compat K8S_VERSIONS="v1.31.14 v1.37.2"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = "/tmp/hami-heavy.lock"
#: layer => pytest arguments (paths and markers).
LAYERS: dict[str, list[str]] = {
    "cp": ["-m", "e2e", "tests/e2e"],
    "chart": ["-m", "e2e", "tests/deploy/e2e"],
    "node": ["tests/realnode/test_chart_on_node.py", "tests/realnode/test_lockfree.py"],
}


@dataclass
class Run:
    """One pytest run of one layer on one release (and containerd for ``node``)."""

    k8s: str
    layer: str
    containerd: str = ""
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    #: seconds from start to end of the run, the wait for the heavy lock included
    #: (``seconds`` is pytest's own time, from its junit report, when there is one)
    wall_seconds: float = 0.0
    rc: int = 0
    problems: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.rc not in (0, 1) and not (self.passed or self.failed):
            return f"did not run (rc {self.rc})"
        if self.failed or self.errors:
            return f"{self.passed} passed, {self.failed + self.errors} failed"
        return f"{self.passed} passed" + (f", {self.skipped} skipped" if self.skipped else "")


def parse_junit(path: Path, run: Run) -> None:
    """Fill ``run``'s counts and problem lines from a pytest ``--junitxml`` file."""
    if not path.exists():
        return
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is not None and suite.get("time"):
        run.seconds = round(float(suite.get("time") or 0.0), 1)
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            if bad.tag == "error":
                run.errors += 1
            else:
                run.failed += 1
            first = (bad.get("message") or "").strip().splitlines()[:1]
            run.problems.append(f"{test_id}: {first[0][:200] if first else bad.tag}")
        elif skip is not None:
            run.skipped += 1
            run.skips.append(f"{test_id}: {(skip.get('message') or '')[:200]}")
        else:
            run.passed += 1


def run_layer(k8s: str, layer: str, containerd: str, workdir: Path,
              extra: Sequence[str], lock: bool = True) -> Run:
    """One pytest run under the heavy lock (``lock``: taken here; else the caller holds
    it); returns its :class:`Run`."""
    run = Run(k8s, layer, containerd)
    junit = workdir / f"{k8s}-{layer}-{containerd or 'na'}.xml"
    env = {**os.environ, "HAMI_K8S_VERSION": k8s, "HAMI_E2E_REQUIRED": "1",
           "HAMI_DEPLOY_REQUIRED": "1", "HAMI_NODE_REQUIRED": "1"}
    if containerd:
        env["HAMI_CONTAINERD_VERSION"] = containerd
    cmd = [*(["flock", LOCK] if lock else []), sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", f"--junitxml={junit}", *LAYERS[layer], *extra]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, check=False)
    run.seconds = run.wall_seconds = round(time.monotonic() - t0, 1)
    run.rc = proc.returncode
    parse_junit(junit, run)
    return run


def build(k8s: Sequence[str], containerd: Sequence[str]) -> dict[str, float]:
    """Build what is missing (nice 19), seconds per release (0: cached)."""
    out: dict[str, float] = {}
    for v in k8s:
        t0 = time.monotonic()
        subprocess.run(["nice", "-n", "19", "hack/k8s/build.sh"], cwd=REPO, check=True,
                       env={**os.environ, "K8S_VERSION": v})
        out[f"k8s {v}"] = round(time.monotonic() - t0, 1)
    for v in containerd:
        t0 = time.monotonic()
        subprocess.run(["nice", "-n", "19", "hack/containerd/build.sh"], cwd=REPO, check=True,
                       env={**os.environ, "CONTAINERD_VERSION": v})
        out[f"containerd {v}"] = round(time.monotonic() - t0, 1)
    return out


def table(runs: Sequence[Run]) -> str:
    """The Markdown table: one row per release and layer."""
    lines = ["# Version matrix (bench/compat_matrix.py)", "",
             "Rows in the order first run; a row's failures are listed below the table. "
             "What each failure was and how it was fixed (the recheck rows ran after the "
             "fixes): compat_matrix_notes.md. seconds 0: recorded from a separate pytest "
             "run. seconds: the pytest run itself (its junit report) in the rows from "
             "v1.29.6 on; earlier rows include the wait for the shared heavy lock.", "",
             "| Kubernetes | layer | containerd | result | seconds |",
             "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r.k8s} | {r.layer} | {r.containerd or '-'} | {r.verdict} | "
                     f"{r.seconds:.0f} |")
    problems = [(r, p) for r in runs for p in r.problems]
    if problems:
        lines += ["", "Failures:", ""]
        lines += [f"- {r.k8s} {r.layer} {r.containerd}: {p}" for r, p in problems]
    return "\n".join(lines) + "\n"


def latest(jsonl: Path) -> list[Run]:
    """The last run of each (release, layer, containerd) in the results file, in the order
    they were first run (earlier invocations' rows stay in the table)."""
    rows: dict[tuple[str, str, str], Run] = {}
    for line in jsonl.read_text().splitlines():
        doc = json.loads(line)
        doc.pop("at", None)
        r = Run(**doc)
        rows[(r.k8s, r.layer, r.containerd)] = r
    return list(rows.values())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k8s", nargs="+", required=True, help="Kubernetes releases (v1.31.14)")
    p.add_argument("--containerd", nargs="+", default=["v2.4.2"],
                   help="containerd releases for the node layer")
    p.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=list(LAYERS))
    p.add_argument("--build", action="store_true", help="build missing releases first")
    p.add_argument("--no-lock", action="store_true",
                   help=f"the caller holds {LOCK} (flock {LOCK} python bench/compat_matrix.py ...)")
    p.add_argument("--out", type=Path, default=REPO / "bench/results/compat_matrix")
    p.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = p.parse_args(argv)
    if args.build:
        print(json.dumps({"build_seconds": build(args.k8s, args.containerd)}), flush=True)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "hami-compat"
    workdir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".jsonl"), "a") as log:
        for k8s in args.k8s:
            for layer in args.layers:
                for ctd in (args.containerd if layer == "node" else [""]):
                    r = run_layer(k8s, layer, ctd, workdir, args.pytest_args,
                                  lock=not args.no_lock)
                    runs.append(r)
                    log.write(json.dumps({**asdict(r), "at": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
                    log.flush()
                    print(f"{k8s} {layer} {ctd}: {r.verdict} ({r.seconds:.0f} s)", flush=True)
    md = table(latest(args.out.with_suffix(".jsonl")))
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if all(not (r.failed or r.errors) and r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
