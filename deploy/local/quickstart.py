#!/usr/bin/env python3
"""From nothing to a GPU pod placed by hami, on a local control plane, with the chart's
own configuration (docs/quickstart.md walks through every step).

What runs, all on 127.0.0.1, no container engine and no GPU needed:

1. etcd + kube-apiserver (``python -m hami.testing.controlplane up``);
2. ``helm template deploy/helm/hami`` with ``deploy/local/values-local.yaml``; from its
   output: the KubeSchedulerConfiguration, the device config and the webhook;
3. ``hami certgen``: the webhook's self-signed CA + certificate, caBundle patched in;
4. ``hami scheduler`` (extender + webhook) with that certificate and device config;
5. kube-scheduler on the chart's KubeSchedulerConfiguration (profile hami-scheduler);
6. a GPU node as a device plugin would register it (the annotation is written here
   because no kubelet/device plugin runs), then a pod asking for 1 GPU slice of 3000 MiB
   and 30 % cores *without* schedulerName: the webhook sets it, kube-scheduler asks hami,
   hami binds it;
7. the scheduler's /metrics shows it (saved to ``<workdir>/scheduler-metrics.txt``), and
   ``hami top`` shows the allocation.

Usage: ``python deploy/local/quickstart.py [--workdir DIR] [--keep]``. Without ``--keep``
everything is stopped once the pod is bound, and the temp work dir is removed (unless
the run failed or ``--workdir`` named one); with it, the cluster stays up (Ctrl-C
stops it) and the printed ``export KUBECONFIG=...`` lets you try your own pods.
Exit status 0 means the pod was scheduled.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami"
NAMESPACE = "hami-system"
NODE = "gpu-0"
PY = sys.executable

#: What a device plugin registers for one T4 split 10 ways (hami.io/node-nvidia-register).
REGISTER = json.dumps([
    {"id": f"GPU-quickstart-{i}", "index": i, "count": 10, "devmem": 15360, "devcore": 100,
     "type": "NVIDIA-Tesla T4", "mode": "hami-core", "health": True} for i in range(2)])

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "cuda-slice", "namespace": "default"},
    "spec": {"containers": [{
        "name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
        "command": ["sleep", "infinity"],
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                                 "nvidia.com/gpucores": "30"}}}]},
}


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(check: Callable[[], Any], what: str, timeout: float = 90,
         procs: tuple[subprocess.Popen[bytes], ...] = ()) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"{what}: {p.args[0]} exited with {p.returncode}")
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def hami_command(sub: str) -> list[str]:
    """``hami <sub>`` when the installed CLI has it, else ``python -m <module>``."""
    modules = {"scheduler": "hami.scheduler.command", "certgen": "hami.certgen",
               "top": "hami.top"}
    exe = shutil.which("hami") or str(Path(PY).with_name("hami"))
    if Path(exe).exists():
        out = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
        if f" {sub} " in out or f"│ {sub}" in out:
            return [exe, sub]
    return [PY, "-m", modules[sub]]


class Stack:
    """The processes started here; stopped in reverse order."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        from hami.testing.controlplane import die_with_parent

        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
                                preexec_fn=die_with_parent)  # no orphans if we are killed
        self.procs.append(proc)
        print(f"    {name}: pid {proc.pid}, log {self.workdir / f'{name}.log'}")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


#: What the Go builds take the first time on a 2-core machine; afterwards they are cached.
FIRST_BUILD = {"kubernetes": "about 10 minutes on 2 cores", "helm": "a few minutes"}
#: Seconds without output from a build after which a "still building" line is printed.
HEARTBEAT_S = 30.0


def run_build(argv: list[str], what: str, heartbeat_s: float = HEARTBEAT_S) -> str:
    """Run a build script, echo its lines as they come, and print a line with the elapsed
    time whenever it has been quiet for ``heartbeat_s`` seconds (a Go build prints nothing
    for minutes). Returns its last output line (the scripts print their bin directory
    last). Raises SystemExit when the script fails."""
    import queue
    import threading

    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    last = ""
    while True:
        try:
            line = lines.get(timeout=heartbeat_s)
        except queue.Empty:
            minutes, seconds = divmod(int(time.monotonic() - start), 60)
            print(f"    ... still building {what} ({minutes}m{seconds:02d}s so far)", flush=True)
            continue
        if line is None:
            break
        last = line or last
        print(f"    {line}", flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"{argv[0]} failed (exit {proc.returncode}); its output is above")
    return last


def _missing(build: Path, names: tuple[str, ...]) -> bool:
    bindir = Path(subprocess.run([str(build), "--print-dir"], check=True, capture_output=True,
                                 text=True).stdout.strip())
    return not all((bindir / n).is_file() for n in names)


def build_tools() -> tuple[Path, str]:
    k8s_build, helm_build = ROOT / "hack/k8s/build.sh", ROOT / "hack/helm/build.sh"
    need_k8s = _missing(k8s_build, ("kube-apiserver", "kube-scheduler", "kubelet", "etcd"))
    need_helm = _missing(helm_build, ("helm",))
    if need_k8s or need_helm:
        todo = [f"Kubernetes ({FIRST_BUILD['kubernetes']})"] * need_k8s \
            + [f"helm ({FIRST_BUILD['helm']})"] * need_helm
        step(f"first run: building {' and '.join(todo)} from their Go modules; cached in "
             "~/.cache/hami afterwards")
    else:
        step("kube-apiserver, kube-scheduler, etcd and helm: already built (~/.cache/hami)")
    k8s = run_build([str(k8s_build)], "Kubernetes")
    helm_dir = run_build([str(helm_build)], "helm")
    return Path(k8s), str(Path(helm_dir) / "helm")


def render_chart(helm: str, port: int, metrics_port: int, workdir: Path,
                 extender_port: int = 9444) -> dict[str, Any]:
    step("render the chart (helm template) with deploy/local/values-local.yaml")
    out = subprocess.run(
        [helm, "template", "hami", str(CHART), "--namespace", NAMESPACE,
         "-f", str(ROOT / "deploy/local/values-local.yaml"),
         "--set", f"scheduler.httpPort={port}",
         "--set", f"scheduler.extenderLoopbackPort={extender_port}",
         "--set", f"scheduler.admissionWebhook.customURL.port={port}",
         "--set", f"scheduler.metricsBindAddress=127.0.0.1:{metrics_port}"],
        check=True, capture_output=True, text=True).stdout
    (workdir / "hami.yaml").write_text(out)
    objs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    print(f"    {len(objs)} objects -> {workdir / 'hami.yaml'}")
    return objs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="state and logs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep everything running")
    parser.add_argument("--admin", action="store_true",
                        help="run hami and kube-scheduler as cluster admin instead of with the "
                             "chart's ServiceAccount and RBAC")
    args = parser.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="hami-quickstart-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    bindir, helm = build_tools()
    stack = Stack(workdir)
    # SIGTERM (e.g. `kill`, a CI timeout) stops the stack like Ctrl-C: SystemExit runs the
    # finally below instead of leaving the apiserver and hami running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    status = 1
    try:
        status = run(stack, workdir, bindir, helm, keep=args.keep, admin=args.admin)
        return status
    finally:
        stack.stop()
        if args.workdir is None and not args.keep and status == 0:
            # its own temp dir (60-80 MB: etcd, logs); kept after a failure for its logs
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"removed {workdir} (--workdir DIR keeps the logs and files)")


def run(stack: Stack, workdir: Path, bindir: Path, helm: str, *, keep: bool,
        admin: bool = False) -> int:
    from lightkube import Client, KubeConfig, codecs
    from lightkube.resources.core_v1 import Node, Pod

    step("start etcd + kube-apiserver")
    cp_log = workdir / "controlplane.log"
    cp = stack.start("controlplane", [PY, "-m", "hami.testing.controlplane", "up",
                                      "--workdir", str(workdir / "cluster"),
                                      "--gpu-node", NODE])
    kubeconfig = wait(lambda: next((line.split("=", 1)[1] for line in
                                    cp_log.read_text().splitlines()
                                    if line.startswith("export KUBECONFIG=")), None),
                      "the control plane", timeout=180, procs=(cp,))
    print(f"    export KUBECONFIG={kubeconfig}")
    client = Client(KubeConfig.from_file(kubeconfig), field_manager="quickstart", trust_env=False)
    from hami.testing.controlplane import ensure_namespace

    ensure_namespace(client, NAMESPACE)

    port, metrics_port, extender_port = free_port(), free_port(), free_port()
    objs = render_chart(helm, port, metrics_port, workdir, extender_port)
    sched_cfg = yaml.safe_load(objs[("ConfigMap", "hami-scheduler-config")]["data"]["config.yaml"])
    sched_cfg["clientConnection"] = {"kubeconfig": kubeconfig}  # in a pod: in-cluster config
    (workdir / "scheduler-config.yaml").write_text(yaml.safe_dump(sched_cfg, sort_keys=False))
    device_cfg = objs[("ConfigMap", "hami-scheduler-device")]["data"]["device-config.yaml"]
    (workdir / "device-config.yaml").write_text(device_cfg)
    client.create(codecs.from_dict(objs[("MutatingWebhookConfiguration",
                                         "hami-scheduler-webhook")]))
    print(f"    extender URL {sched_cfg['extenders'][0]['urlPrefix']}; webhook registered")
    admin_kubeconfig = kubeconfig
    if not admin:
        step("apply the chart's ServiceAccounts, RBAC and admission policies; hami and "
             "kube-scheduler use their accounts")
        apply_chart_rbac(client, objs)
        spec = objs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]
        kubeconfig = service_account_kubeconfig(client, spec["serviceAccountName"],
                                                admin_kubeconfig, workdir)
        sched_cfg["clientConnection"] = {"kubeconfig": service_account_kubeconfig(
            client, _kube_scheduler_account(objs), admin_kubeconfig, workdir)}
        (workdir / "scheduler-config.yaml").write_text(yaml.safe_dump(sched_cfg, sort_keys=False))

    step("hami certgen: self-signed CA + serving certificate, caBundle patched")
    subprocess.run([*hami_command("certgen"), "--namespace", NAMESPACE,
                    "--secret", "hami-scheduler-tls", "--service", "hami-scheduler",
                    "--webhook", "hami-scheduler-webhook", "--out-dir", str(workdir / "tls"),
                    "--kubeconfig", kubeconfig], check=True, cwd=ROOT)

    # the chart's secure default: the scheduler signs each allocation with the key of the
    # Secret <release>-allocation-key; here a key file of this run
    key_dir = workdir / "allocation-key"
    key_dir.mkdir(exist_ok=True)
    (key_dir / "current").write_text(secrets.token_hex(32))
    key_dir.joinpath("current").chmod(0o600)

    step("start hami scheduler (extender + webhook; allocations signed)")
    hs = stack.start("hami-scheduler", [
        *hami_command("scheduler"), f"--http_bind=127.0.0.1:{port}",
        f"--allocation-key-dir={key_dir}",
        f"--cert_file={workdir / 'tls/tls.crt'}", f"--key_file={workdir / 'tls/tls.key'}",
        f"--kubeconfig={kubeconfig}", f"--device-config-file={workdir / 'device-config.yaml'}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}", "--scheduler-name=hami-scheduler",
        *(a for a in _chart_args(objs)
          if a.startswith(("--leader-elect", "--extender-http-bind")))])

    step("start kube-scheduler on the chart's KubeSchedulerConfiguration")
    ks = stack.start("kube-scheduler", [str(bindir / "kube-scheduler"),
                                        f"--config={workdir / 'scheduler-config.yaml'}",
                                        "--secure-port=0", "--v=2"])

    step(f"register node {NODE} as a hami device plugin would (2 x T4, split 10)")
    client.patch(Node, NODE, {"metadata": {"labels": {"gpu": "on"}, "annotations": {
        "hami.io/node-nvidia-register": REGISTER}}})

    step("create a pod asking for 1 GPU slice: 3000 MiB, 30 % cores (no schedulerName)")

    def admitted() -> bool:
        try:
            client.create(codecs.from_dict(POD))
        except Exception as exc:  # noqa: BLE001 - scheduler not ready yet: retry
            print(f"    retry: {exc}")
            return False
        return True

    wait(lambda: _ready(port), "hami scheduler /readyz", procs=(hs, ks))
    wait(admitted, "pod created", procs=(hs, ks))
    pod = client.get(Pod, "cuda-slice", namespace="default")
    print(f"    schedulerName set by the webhook: {pod.spec.schedulerName}")
    pod = wait(lambda: (p := client.get(Pod, "cuda-slice", namespace="default")).spec.nodeName
               and p, "the pod to be bound", timeout=120, procs=(hs, ks))
    ann = pod.metadata.annotations or {}
    print(f"    bound to {pod.spec.nodeName}; hami.io/vgpu-devices-allocated = "
          f"{ann.get('hami.io/vgpu-devices-allocated')}")

    step(f"scheduler metrics (http://127.0.0.1:{metrics_port}/metrics)")
    metrics = wait(lambda: (m := _scrape(metrics_port)) and b"hami_vgpu_memory_allocated_bytes{" in m
                   and m, "the pod in the scheduler's metrics", procs=(hs, ks))
    (workdir / "scheduler-metrics.txt").write_bytes(metrics)
    for line in metrics.decode().splitlines():
        if line.startswith("hami_vgpu_memory_allocated_bytes{"):
            print(f"    {line}")

    step("hami top")
    subprocess.run([*hami_command("top"), "--kubeconfig", admin_kubeconfig], check=True,
                   cwd=ROOT)
    ok = pod.spec.schedulerName == "hami-scheduler" and pod.spec.nodeName == NODE
    print("\nSUCCESS: the pod was placed by hami" if ok else "\nFAILED", flush=True)
    if keep and ok:
        print(f"\nStill running. export KUBECONFIG={admin_kubeconfig}\n"
              "Ctrl-C stops everything.")
        try:
            while all(p.poll() is None for p in stack.procs):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0 if ok else 1


def _chart_args(objs: dict[tuple[str, str], Any]) -> list[str]:
    """The args the chart gives the hami scheduler container."""
    spec = objs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]
    ext = next(c for c in spec["containers"] if c["name"] == "vgpu-scheduler-extender")
    return list(ext["args"])


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def apply_chart_rbac(client: Any, objs: dict[tuple[str, str], Any]) -> None:
    """Create the chart's accounts, RBAC and admission policies for real."""
    from lightkube import codecs

    for (kind, _name), doc in objs.items():
        if kind in RBAC_KINDS:
            client.create(codecs.from_dict(doc))
    print(f"    {sum(k in RBAC_KINDS for k, _ in objs)} RBAC and policy objects")


def _kube_scheduler_account(objs: dict[tuple[str, str], Any]) -> str:
    """kube-scheduler's own ServiceAccount: the one its token Secret is for."""
    (name,) = [d["metadata"]["annotations"]["kubernetes.io/service-account.name"]
               for (kind, _n), d in objs.items()
               if kind == "Secret" and d.get("type") == "kubernetes.io/service-account-token"]
    return str(name)


def service_account_kubeconfig(client: Any, sa: str, admin: str, workdir: Path) -> str:
    """A kubeconfig that authenticates as ServiceAccount ``sa`` of the release namespace (a
    fresh token), so that what runs with it has exactly the rights the chart grants."""
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccountToken

    token = client.create(ServiceAccountToken(
        metadata=ObjectMeta(name=sa, namespace=NAMESPACE),
        spec=TokenRequestSpec(audiences=[], expirationSeconds=24 * 3600)), sa,
        namespace=NAMESPACE)
    value = token.status.token
    cfg = yaml.safe_load(Path(admin).read_text())
    cfg["users"] = [{"name": sa, "user": {"token": value}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = sa
    path = workdir / f"kubeconfig-{sa}"
    path.write_text(yaml.safe_dump(cfg))
    print(f"    token of {NAMESPACE}/{sa} -> {path}")
    return str(path)


def _scrape(port: int) -> bytes:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return bytes(resp.read())
    except OSError:
        return b""


def _ready(port: int) -> bool:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=2,
                                    context=ctx) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
