"""``hami device-plugin``: typer-compatible entry point (register in ``hami.cli``)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hami.api import names
from hami.cliargs import choose, completer
from hami.deviceplugin.discovery import BACKENDS
from hami.deviceplugin.guard import AllocationGuard
from hami.durations import seconds
from hami.keyring import KeyRing

if TYPE_CHECKING:
    from hami.deviceplugin.kube import KubeApi

log = logging.getLogger("hami.deviceplugin")

# The flags of the node agents (``hami device-plugin`` and ``hami dra-plugin`` take them
# alike; each gives its own default where it declares the parameter).
NodeNameOption = Annotated[str, typer.Option(envvar="NODE_NAME", help="this node")]
HookPathOption = Annotated[str, typer.Option(envvar="HOOK_PATH", help="host dir holding vgpu/")]
DeviceConfigOption = Annotated[Path | None, typer.Option(
    "--device-config-file", help="HAMi device-config.yaml")]
NodeConfigOption = Annotated[Path, typer.Option(help="per-node JSON override")]
BackendOption = Annotated[str, typer.Option(
    help="where GPUs are found: nvml (this node's NVIDIA driver) or fake (the YAML "
         "inventory of --fake-inventory)", metavar="[" + "|".join(BACKENDS) + "]",
    autocompletion=completer(BACKENDS))]
FakeInventoryOption = Annotated[Path | None, typer.Option(
    help="YAML inventory for --backend fake")]
KubeconfigOption = Annotated[Path | None, typer.Option(
    envvar="KUBECONFIG",
    help="kubeconfig file (default: the pod's service account, else ~/.kube/config)")]

#: Where the libvgpu build lands in the repository (native/libvgpu/Makefile).
DEFAULT_LIB = Path(__file__).resolve().parents[3] / "native" / "libvgpu" / "build" / "libvgpu.so"


def install_lib(dest: Path, lib: Path, version: str) -> list[Path]:
    """Place ``libvgpu.so``, ``libvgpu.so.<version>`` and ``ld.so.preload`` in ``dest``
    (the chart's init step, HAMi ``vgpu-init.sh``): files are replaced only when their
    bytes differ; ``ld.so.preload`` holds ``"<dest>/libvgpu.so\\n"``.

    Returns the paths written. Raises ``OSError`` (e.g. ``lib`` missing).
    """
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "containers").mkdir(exist_ok=True)
    data = lib.read_bytes()
    written = []
    for name in ("libvgpu.so", f"libvgpu.so.{version}"):
        target = dest / name
        if not target.exists() or target.read_bytes() != data:
            tmp = dest / f".{name}.tmp"
            shutil.copyfile(lib, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
            written.append(target)
    preload = dest / "ld.so.preload"
    text = f"{dest}/libvgpu.so\n"
    if not preload.exists() or preload.read_text() != text:
        preload.write_text(text)
        written.append(preload)
    return written


def device_plugin(
    node_name: NodeNameOption = "",
    hook_path: HookPathOption = "/usr/local",
    device_plugin_path: Annotated[Path, typer.Option(help="kubelet device-plugin directory")] = Path(
        "/var/lib/kubelet/device-plugins"),
    kubelet_socket: Annotated[Path | None, typer.Option(envvar="KUBELET_SOCKET",
                                                        help="default <dir>/kubelet.sock")] = None,
    config_file: DeviceConfigOption = None,
    node_config_file: NodeConfigOption = Path("/config/config.json"),
    backend: BackendOption = "nvml",
    fake_inventory: FakeInventoryOption = None,
    kubeconfig: KubeconfigOption = None,
    lock_dir: Annotated[str, typer.Option(
        help="ignored (kept for compatibility): each container gets its own /tmp/vgpulock")] = "/tmp/vgpulock",
    register_interval: Annotated[float, typer.Option(
        parser=seconds, metavar="DURATION",
        help="time between register passes (30s, or seconds: 30)", show_default="30s")] = 30.0,
    install_lib_dir: Annotated[Path | None, typer.Option(
        "--install-lib", help="install libvgpu.so + ld.so.preload into DIR and exit")] = None,
    lib_path: Annotated[Path, typer.Option(
        help="libvgpu.so to install",
        show_default="native/libvgpu/build/libvgpu.so of hami's source tree")] = DEFAULT_LIB,
    mig_apply_lock: Annotated[Path, typer.Option(
        help="MIG apply lock file (operatingmode mig)")] = Path("/tmp/hami/hami-mig-apply.lock"),
    watch_idle_timeout: Annotated[float, typer.Option(
        parser=seconds, metavar="DURATION",
        help="time without an event or bookmark after which the node watch is "
             "resumed on a new connection (2m, or seconds: 120)", show_default="2m")] = 120.0,
    allocation_key_dir: Annotated[Path | None, typer.Option(
        help="directory of the allocation key shared with the scheduler (files 'current', "
             "'next', 'previous'): only allocations hami's scheduler signed are served; "
             "without it (and without --trust-unsigned-allocations) none is served")] = None,
    trust_unsigned_allocations: Annotated[bool, typer.Option(
        help="serve allocations without checking who wrote them (HAMi's behaviour; for a "
             "migration from HAMi): any pod creator can then forge one")] = False,
    scheduler_name: Annotated[str, typer.Option(
        help="schedulerName of the pods whose allocations are served")] = "hami-scheduler",
    allocate_mode: Annotated[str, typer.Option(
        help="how Allocate learns the pod: 'node-lock' (HAMi's protocol: the scheduler "
             "locks the node until Allocate) or 'cdi' (per-container CDI devices filled "
             "in at PreStartContainer from the kubelet's pod-resources API; the node is "
             "annotated so that hami's scheduler binds without the lock; needs a runtime "
             "with CDI enabled) or 'auto' (cdi where the Node reports a runtime that "
             "applies CDI devices by default, containerd 2.x or CRI-O 1.28+, and a kubelet "
             "1.29+; node-lock elsewhere; chosen once at startup)")] = "node-lock",
    pod_resources_socket: Annotated[Path, typer.Option(
        help="the kubelet's pod-resources socket (allocate mode cdi or auto)")] = Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"),
    cdi_spec_dir: Annotated[Path, typer.Option(
        help="CDI spec directory of the container runtime (allocate mode cdi or auto)")] = Path(
        "/var/run/cdi"),
) -> None:
    """Kubelet device plugin: advertise GPU replicas, answer Allocate (HAMi-core 1.2)."""
    from hami import __version__
    from hami.netlimits import raise_open_files_limit

    choose(backend, BACKENDS, "--backend")  # before any file, socket or API server
    raise_open_files_limit()
    if install_lib_dir is not None:
        try:
            for p in install_lib(install_lib_dir, lib_path, __version__):
                typer.echo(f"installed {p}")
        except OSError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        return
    if not node_name:
        typer.echo("error: NODE_NAME is required", err=True)
        raise typer.Exit(2)
    stop = threading.Event()
    try:
        run_plugin(node_name=node_name, hook_path=hook_path, plugin_dir=device_plugin_path,
                   kubelet_socket=kubelet_socket or device_plugin_path / "kubelet.sock",
                   config_file=config_file, node_config_file=node_config_file,
                   backend_kind=backend, fake_inventory=fake_inventory, kubeconfig=kubeconfig,
                   lock_dir=lock_dir, register_interval_s=register_interval, stop=stop,
                   install_signals=True, version=__version__, mig_apply_lock=mig_apply_lock,
                   watch_idle_timeout_s=watch_idle_timeout,
                   guard=_guard(allocation_key_dir, trust_unsigned_allocations, scheduler_name),
                   allocate_mode=allocate_mode, pod_resources_socket=pod_resources_socket,
                   cdi_spec_dir=cdi_spec_dir)
    except Exception as exc:  # noqa: BLE001 - report and exit non-zero
        from hami.kubehint import kube_hint

        typer.echo(f"error: {kube_hint(exc) or exc}", err=True)
        raise typer.Exit(1) from None


def _guard(key_dir: Path | None, trust_unsigned: bool,
           scheduler_name: str) -> AllocationGuard | None:
    """The Allocate guard the flags ask for: None (allocations are not authenticated)
    only with ``--trust-unsigned-allocations``; without it and without a key directory,
    a guard that refuses every allocation (fail closed: HAMi serves them all).

    Raises:
        hami.keyring.KeyRingError: ``key_dir`` has no usable ``current`` key.
    """
    if trust_unsigned:
        log.warning("--trust-unsigned-allocations: allocations are served without "
                    "checking that hami's scheduler wrote them")
        return None
    if key_dir is None:
        log.error("no --allocation-key-dir: no allocation will be served (pass the "
                  "scheduler's key directory, or --trust-unsigned-allocations to serve "
                  "allocations without checking who wrote them)")
        return AllocationGuard(None, scheduler_name)
    return AllocationGuard(KeyRing(key_dir), scheduler_name)


def resolve_auto(kube: KubeApi, node: str, operating_mode: str, probe_s: float,
                 stop: threading.Event) -> str:
    """Allocate mode ``auto`` on ``node``: ``cdi`` or ``node-lock``
    (:func:`hami.deviceplugin.automode.choose_allocate_mode`), logged with the reason.

    The Node's ``status.nodeInfo`` is read once; while it cannot be read or reports no
    runtime version, again every second for up to ``probe_s`` seconds (or until
    ``stop``); then ``node-lock``. Never raises."""
    from hami.deviceplugin.automode import AutoChoice, choose_allocate_mode
    from hami.deviceplugin.kube import KubeError

    if operating_mode == "mig":
        choice = choose_allocate_mode(None, None, operating_mode)
    else:
        deadline = time.monotonic() + probe_s
        versions: tuple[str, str] = ("", "")
        error: KubeError | None = None
        while True:
            try:
                versions, error = kube.node_versions(node), None
            except KubeError as exc:
                error = exc
            if (error is None and versions[0]) or time.monotonic() >= deadline \
                    or stop.wait(1.0):
                break
        choice = (AutoChoice(names.ALLOCATE_MODE_NODE_LOCK,
                             f"Node {node} could not be read: {error}")
                  if error is not None else choose_allocate_mode(*versions, operating_mode))
    log.info("allocate mode auto: %s (%s)", choice.mode, choice.reason)
    return choice.mode


def run_plugin(*, node_name: str, hook_path: str, plugin_dir: Path, kubelet_socket: Path,
               config_file: Path | None, node_config_file: Path | None, backend_kind: str,
               fake_inventory: Path | None, kubeconfig: Path | None, lock_dir: str,
               register_interval_s: float, stop: threading.Event,
               install_signals: bool = False, version: str = "0.1.0",
               kube_api: object | None = None, mig_apply_lock: Path | None = None,
               mig_reconcile_s: float = 5.0, watch_idle_timeout_s: float = 120.0,
               guard: AllocationGuard | None = None, allocate_mode: str = "node-lock",
               pod_resources_socket: Path | None = None, cdi_spec_dir: Path | None = None,
               cdi_sweep_s: float = 60.0, auto_probe_s: float = 30.0) -> None:
    """Build and run every loop until ``stop`` is set (SIGINT/SIGTERM set it; SIGHUP
    restarts the gRPC server). ``kube_api`` replaces the lightkube client (tests).

    In ``operatingmode: mig`` the GPUs' MIG profiles are read through the backend and the
    allowlist (:mod:`hami.deviceplugin.mig`), a reconciler runs every ``mig_reconcile_s``
    and ``mig_apply_lock`` (default ``/tmp/hami/hami-mig-apply.lock``) pauses
    registration and health checks while instances change. The node watch restarts after
    ``watch_idle_timeout_s`` seconds without an event or bookmark.

    ``allocate_mode`` ``cdi`` (:mod:`hami.deviceplugin.cdimode`) asks the kubelet's
    ``pod_resources_socket`` at PreStartContainer, writes CDI specs into ``cdi_spec_dir``
    and sweeps stale ones every ``cdi_sweep_s``. ``auto`` becomes ``cdi`` or ``node-lock``
    once, here, from the Node's runtime and kubelet versions (:func:`resolve_auto`,
    waiting up to ``auto_probe_s`` seconds for a readable Node). Raises
    ``PluginConfigError`` when mig mode has no ``migProfileAllowlist``, for an unknown
    allocate mode, and for mode ``cdi`` with ``operatingmode: mig``;
    :class:`~hami.deviceplugin.sockets.SocketPathError` (before the API server or the
    GPUs are touched) when this plugin's socket in ``plugin_dir`` or a socket it
    connects to has a path longer than a unix socket's."""
    from hami.deviceplugin import allocate as al
    from hami.deviceplugin import mig as migmod
    from hami.deviceplugin import mps
    from hami.deviceplugin.automode import ALLOCATE_MODE_AUTO
    from hami.deviceplugin.cdiallocate import DEFAULT_POD_RESOURCES_SOCKET
    from hami.deviceplugin.config import PluginConfigError, apply_node_config, from_device_config
    from hami.deviceplugin.discovery import open_backend
    from hami.deviceplugin.health import policy_from_env
    from hami.deviceplugin.kube import KubeApi, make_client
    from hami.deviceplugin.mpsdaemon import MpsControlDaemon, MpsDaemonError
    from hami.deviceplugin.service import (
        DeviceState,
        NodeRegistrar,
        PluginServer,
        health_loop,
        socket_name,
    )
    from hami.deviceplugin.servicer import DevicePluginServicer
    from hami.deviceplugin.sockets import check_socket_paths
    from hami.kubehttp import watch_timeout_for

    cfg = from_device_config(config_file.read_text() if config_file else None)
    if node_config_file is not None and node_config_file.exists():
        cfg = apply_node_config(cfg, node_config_file.read_text(), node_name)
    if cfg.operating_mode == "mig" and not cfg.mig_allowlist:  # a config error: say it first
        raise PluginConfigError("operatingmode mig needs nvidia.migProfileAllowlist in the "
                                "device config (HAMi v2.10; the chart's "
                                "devices.nvidia.migProfileAllowlist)")
    if allocate_mode not in (names.ALLOCATE_MODE_NODE_LOCK, names.ALLOCATE_MODE_CDI,
                             ALLOCATE_MODE_AUTO):
        raise PluginConfigError(f"unknown allocate mode {allocate_mode!r} "
                                "(node-lock, cdi, auto)")
    if allocate_mode == names.ALLOCATE_MODE_CDI and cfg.operating_mode == "mig":
        raise PluginConfigError("allocate mode cdi does not serve operatingmode mig; use "
                                "--allocate-mode node-lock")
    check_socket_paths(  # before the API server, the GPUs and any file
        listen=[plugin_dir / socket_name(cfg.resource_name)],
        connect=[kubelet_socket, *([pod_resources_socket or DEFAULT_POD_RESOURCES_SOCKET]
                                   if allocate_mode != names.ALLOCATE_MODE_NODE_LOCK else [])])
    kube = kube_api if isinstance(kube_api, KubeApi) else KubeApi(
        make_client(kubeconfig, watch_idle_timeout_s=watch_idle_timeout_s),
        watch_timeout_s=watch_timeout_for(watch_idle_timeout_s))
    if allocate_mode == ALLOCATE_MODE_AUTO:
        allocate_mode = resolve_auto(kube, node_name, cfg.operating_mode, auto_probe_s, stop)
    gpu_backend = open_backend(backend_kind, fake_inventory)
    gpus = gpu_backend.devices()
    lock_path = mig_apply_lock or migmod.DEFAULT_APPLY_LOCK
    mig_manager = None
    if cfg.operating_mode == "mig":
        driver = gpu_backend.mig_driver()
        profiles = migmod.discover(driver, [(g.uuid, g.name) for g in gpus if g.mig_capable],
                                   cfg.mig_allowlist)
        mig_manager = migmod.MigManager(driver, kube, node_name, profiles, lock_path)
        mig_manager.clear_stale_apply_lock()
        state = DeviceState(gpus, cfg, profiles)
    else:
        state = DeviceState(gpus, cfg)
    mps_daemon = None
    if mps.active(cfg.operating_mode, cfg.mps) and cfg.mps.start_daemon:  # ours: docs/mps.md
        mps_daemon = MpsControlDaemon(cfg.mps, [d.uuid for d in state.devices])
    if kube.client is not None:
        kube.start_node_watch(node_name, stop)
        kube.start_pod_watch(node_name, stop)
    vgpu = Path(hook_path) / "vgpu"
    settings = al.NodeSettings(hook_path=hook_path, lock_dir=lock_dir, version=version,
                               versioned_lib=(vgpu / f"libvgpu.so.{version}").exists(),
                               license=(vgpu / "license").exists())
    servicer = DevicePluginServicer(state, kube, node_name, settings, stop)
    servicer.mig = mig_manager
    servicer.guard = guard
    if allocate_mode == names.ALLOCATE_MODE_CDI:
        from hami.deviceplugin.cdiallocate import (
            DEFAULT_CDI_DIR,
            CdiAllocator,
            PodResourcesClient,
        )

        servicer.cdi = CdiAllocator(
            state, kube, node_name, settings,
            PodResourcesClient(pod_resources_socket or DEFAULT_POD_RESOURCES_SOCKET),
            cdi_spec_dir or DEFAULT_CDI_DIR, guard, lambda: servicer.new_cache_name())
    server = PluginServer(servicer, plugin_dir, kubelet_socket, cfg.resource_name)

    def paused() -> bool:
        return mig_manager is not None and migmod.apply_lock_held(lock_path)

    registrar = NodeRegistrar(state, kube, node_name, interval_s=register_interval_s,
                              paused=paused, allocate_mode=allocate_mode,
                              trust_unsigned=guard is None)
    if install_signals:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: setattr(server, "restart_requested", True))
    threads = [
        threading.Thread(target=registrar.run, args=(stop,), name="register", daemon=True),
        threading.Thread(target=health_loop, args=(gpu_backend, state, policy_from_env(os.environ),
                                                   registrar.kick, stop, paused),
                         name="health", daemon=True),
    ]
    if servicer.cdi is not None:
        threads.append(threading.Thread(target=servicer.cdi.sweep_loop, args=(stop, cdi_sweep_s),
                                        name="cdi-sweep", daemon=True))
    if mig_manager is not None:
        # The first pass (at start) adopts what pods reference and resets the rest.
        threads.append(threading.Thread(target=mig_manager.run, args=(stop, mig_reconcile_s),
                                        name="mig-reconcile", daemon=True))
    for t in threads:
        t.start()
    try:
        if mps_daemon is not None:
            mps_daemon.start()
        server.run(stop)
    finally:
        stop.set()
        gpu_backend.close()
        if mps_daemon is not None and mps_daemon.started:
            try:
                mps_daemon.stop()
            except MpsDaemonError as exc:
                log.error("%s", exc)
        for t in threads:
            t.join(timeout=6)
