"""Operating mode ``mps``: HAMi's behaviour by default (mode reported, hami-core Allocate
response, hami-core-spec §B.7) and our opt-in MPS plumbing (``docs/mps.md``): config,
env formats, Allocate through the real gRPC server, and the control-daemon manager
against a fake ``nvidia-cuda-mps-control`` that speaks NVIDIA's command-line protocol."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hami.core.model import ContainerDevice
from hami.deviceplugin import allocate as al
from hami.deviceplugin import mps
from hami.deviceplugin.config import PluginConfig, PluginConfigError, apply_node_config
from hami.deviceplugin.mpsdaemon import MpsControlDaemon, MpsDaemonError
from tests.node.conftest import NODE, PluginHarness
from tests.node.test_plugin_grpc import A, B, bound_pod, up, wait

# --- config ------------------------------------------------------------------------------------


def node_entry(**fields: object) -> str:
    return json.dumps({"nodeconfig": [{"name": NODE, **fields}]})


def test_mps_is_off_by_default_and_parses_every_key() -> None:
    assert PluginConfig().mps == mps.MpsSettings(enabled=False)
    cfg = apply_node_config(PluginConfig(), node_entry(operatingmode="mps"), NODE)
    assert cfg.operating_mode == "mps" and not cfg.mps.enabled
    cfg = apply_node_config(PluginConfig(), node_entry(operatingmode="mps", mps={
        "enabled": True, "pipeDirectory": "/run/mps/pipe/", "logDirectory": "/run/mps/log",
        "shmDirectory": "/run/mps/shm", "startDaemon": True,
        "controlCommand": "/usr/bin/nvidia-cuda-mps-control"}), NODE)
    assert cfg.mps == mps.MpsSettings(True, "/run/mps/pipe", "/run/mps/log", "/run/mps/shm",
                                      True, "/usr/bin/nvidia-cuda-mps-control")


@pytest.mark.parametrize(("fields", "message"), [
    ({"operatingmode": "mps", "mps": True}, "mps must be an object"),
    ({"operatingmode": "mps", "mps": {"enable": True}}, "unknown key"),
    ({"operatingmode": "mps", "mps": {"enabled": "yes"}}, "mps.enabled must be true or false"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "tmp/mps"}}, "mps.pipeDirectory must be an absolute"),
    ({"operatingmode": "mps", "mps": {"logDirectory": "/a,b"}}, "mps.logDirectory"),
    ({"operatingmode": "mps", "mps": {"shmDirectory": 3}}, "mps.shmDirectory must be a string"),
    ({"operatingmode": "mps", "mps": {"controlCommand": " "}}, "mps.controlCommand"),
    ({"operatingmode": "mps", "mps": {"startDaemon": True}}, "startDaemon needs mps.enabled"),
    ({"operatingmode": "hami-core", "mps": {"enabled": True}}, 'needs operatingmode "mps"'),
    ({"mps": {"enabled": True}}, 'needs operatingmode "mps"'),
    # found by a breaker: these mounted host directories read-write into every container
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/"}}, "system directory"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "//"}}, "system directory"),
    ({"operatingmode": "mps", "mps": {"shmDirectory": "/"}}, "system directory"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/etc"}}, "system directory"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/tmp/../etc"}}, "normalised path"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/usr/local/vgpu"}}, "collides"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/tmp/vgpulock/mps"}}, "collides"),
    ({"operatingmode": "mps", "mps": {"pipeDirectory": "/usr/local/vgpu/x"}}, "collides"),
])
def test_bad_mps_config_is_a_clear_error(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        apply_node_config(PluginConfig(), node_entry(**fields), NODE)


# --- env formats ---------------------------------------------------------------------------

U0, U1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-0000-0000-0000-000000000000"
ON = mps.MpsSettings(enabled=True, pipe_directory="/run/mps/pipe")


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


@pytest.mark.parametrize(("devices", "expected"), [
    ([dev(U0, 3000, 30)], {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe",
                           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M"}),
    # cores 0 (no core limit) and 100 (whole GPU): MPS's default 100 % applies
    ([dev(U0, 3000, 0)], {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe",
                          "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M"}),
    ([dev(U0, 81920, 100)], {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe",
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=81920M"}),
    # two GPUs: one item each, ordinal = position in NVIDIA_VISIBLE_DEVICES; d[0]'s cores
    ([dev(U1, 4000, 25), dev(U0, 2000, 50)],
     {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M,1=2000M"}),
    # a GPU named twice is one device in the container: one item, the sum
    ([dev(U0, 1000, 10), dev(U1, 500, 10), dev(U0, 1500, 10)],
     {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2500M,1=500M"}),
    # no memory on a GPU: no item for it (no limit rather than a 0 M limit)
    ([dev(U0, 0, 20), dev(U1, 700, 20)],
     {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=700M"}),
    ([dev(U0, 0, 0)], {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe"}),
])
def test_client_env(devices: list[ContainerDevice], expected: dict[str, str]) -> None:
    assert mps.client_env(devices, ON) == expected


def test_client_mounts_and_daemon_env() -> None:
    assert mps.client_mounts(ON) == (("/run/mps/pipe", "/run/mps/pipe", False),)
    with_shm = replace(ON, shm_directory="/run/mps/shm")
    assert mps.client_mounts(with_shm)[1] == ("/dev/shm", "/run/mps/shm", False)
    assert mps.daemon_env(ON, [U0, U1]) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe", "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
        "CUDA_VISIBLE_DEVICES": f"{U0},{U1}"}
    with pytest.raises(mps.MpsConfigError, match="no GPU registered"):
        mps.daemon_env(ON, [])


# --- Allocate plan (pure) --------------------------------------------------------------------

SETTINGS = al.NodeSettings(hook_path="/usr/local", lock_dir="/tmp/vgpulock")


def plan_for(cfg: PluginConfig) -> al.ContainerPlan:
    p = al.PodView("default", "p", "uid-p", NODE, annotations={},
                   containers=(al.ContainerView("c"),))
    return al.container_plan([dev(U0, 3000, 30)], p, 0, cfg, SETTINGS, "cache-1")


def test_mps_mode_without_plumbing_answers_exactly_like_hami_core() -> None:
    hami_core = plan_for(PluginConfig())
    assert plan_for(PluginConfig(operating_mode="mps")) == hami_core
    # the MPS options only act in mode mps, whatever a caller built
    assert plan_for(PluginConfig(mps=ON)) == hami_core


def test_mps_plumbing_adds_to_the_hami_core_response() -> None:
    hami_core = plan_for(PluginConfig())
    plan = plan_for(PluginConfig(operating_mode="mps", mps=replace(ON, shm_directory="/run/shm")))
    assert plan.envs == {**hami_core.envs, "CUDA_MPS_PIPE_DIRECTORY": "/run/mps/pipe",
                         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M"}
    assert plan.mounts == (*hami_core.mounts, al.Mount("/run/mps/pipe", "/run/mps/pipe", False),
                           al.Mount("/dev/shm", "/run/shm", False))
    assert plan.host_dirs == hami_core.host_dirs


# --- through the real gRPC server -------------------------------------------------------------

REGISTER = "hami.io/node-nvidia-register"


def test_mps_node_registers_mode_mps_and_allocates_like_hami_core(harness: PluginHarness) -> None:
    up(harness, node_config=node_entry(operatingmode="mps"))
    wait(lambda: REGISTER in harness.kube.nodes[NODE][0], what="register annotation")
    registered = json.loads(harness.kube.nodes[NODE][0][REGISTER])
    assert [(d["id"], d["mode"], d["count"], d["devcore"]) for d in registered] == [
        (A, "mps", 10, 100), (B, "mps", 10, 100)]
    bound_pod(harness, "p", f"{A},NVIDIA,3000,30:;")
    c = harness.kubelet.allocate([f"{A}-0"]).container_responses[0]
    envs = dict(c.envs)
    assert envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE").endswith(".cache")
    assert envs == {"NVIDIA_VISIBLE_DEVICES": A, "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
                    "CUDA_DEVICE_SM_LIMIT": "30"}
    h = harness.hook_path
    assert [(m.container_path, m.host_path, m.read_only) for m in c.mounts] == [
        (f"{h}/vgpu/libvgpu.so", f"{h}/vgpu/libvgpu.so", True),
        (f"{h}/vgpu", f"{h}/vgpu/containers/uid-p_c", False),
        (f"{h}/vgpu/limits.env", f"{h}/vgpu/containers/uid-p_c.plugin/limits.env", True),
        (f"{h}/vgpu/feedback", f"{h}/vgpu/containers/uid-p_c.plugin/feedback", True),
        ("/tmp/vgpulock", f"{h}/vgpu/containers/uid-p_c.plugin/vgpulock", False),
        ("/etc/ld.so.preload", f"{h}/vgpu/ld.so.preload", True)]
    cache_dir = Path(f"{h}/vgpu/containers/uid-p_c")                # host side, as hami-core
    assert cache_dir.is_dir() and (cache_dir.stat().st_mode & 0o777) == 0o777
    assert harness.kube.pods[("default", "p")].annotations[al.BIND_PHASE] == "success"


def test_mps_plumbing_through_allocate(harness: PluginHarness) -> None:
    pipe, shm = harness.root / "mps-pipe", harness.root / "mps-shm"
    up(harness, node_config=node_entry(operatingmode="mps", mps={
        "enabled": True, "pipeDirectory": str(pipe), "shmDirectory": str(shm)}))
    bound_pod(harness, "p", f"{A},NVIDIA,3000,30:{B},NVIDIA,4000,30:;")
    c = harness.kubelet.allocate([f"{A}-0", f"{B}-0"]).container_responses[0]
    envs = dict(c.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4000m"          # libvgpu's limits stay
    assert {k: v for k, v in envs.items() if k.startswith("CUDA_MPS_")} == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M,1=4000M"}
    mounts = [(m.container_path, m.host_path, m.read_only) for m in c.mounts]
    assert mounts[-2:] == [(str(pipe), str(pipe), False), ("/dev/shm", str(shm), False)]
    assert mounts[5] == ("/etc/ld.so.preload", f"{harness.hook_path}/vgpu/ld.so.preload", True)


def test_bad_mps_config_stops_the_plugin(harness: PluginHarness) -> None:
    from tests.node.conftest import start_plugin
    start_plugin(harness, node_config=node_entry(operatingmode="hami-core",
                                                 mps={"enabled": True}))
    assert harness.thread is not None
    harness.thread.join(timeout=10)
    assert [type(e) for e in harness.errors] == [PluginConfigError]
    assert harness.kubelet.registrations == []


# --- the control daemon -------------------------------------------------------------------------

#: A stand-in for nvidia-cuda-mps-control with NVIDIA's protocol: ``-d`` leaves a background
#: process and its pid in $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid; ``quit`` on
#: stdin stops it. It records its environment and every command for the test.
FAKE_CONTROL = textwrap.dedent("""\
    #!{python}
    import json, os, signal, subprocess, sys
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    mode = os.environ.get("FAKE_MPS_MODE", "")
    with open(os.path.join(pipe, "calls.jsonl"), "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "stdin": "" if "-d" in sys.argv
                            else sys.stdin.read(),
                            "env": {{k: v for k, v in os.environ.items()
                                    if k.startswith("CUDA_")}}}}) + "\\n")
    if sys.argv[1:] == ["-d"]:
        if mode == "fail":
            sys.stderr.write("An instance of this daemon is already running\\n")
            sys.exit(1)
        if mode == "no-pid":
            sys.exit(0)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True)
        with open(pidfile, "w") as f:
            f.write(str(child.pid))
        sys.exit(0)
    with open(pidfile) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGTERM)
    os.unlink(pidfile)
    """)


@pytest.fixture
def fake_control(tmp_path: Path) -> Path:
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text(FAKE_CONTROL.format(python=sys.executable))
    exe.chmod(0o755)
    return exe


def calls(pipe: Path) -> list[dict[str, object]]:
    path = pipe / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def settings_for(tmp_path: Path, exe: Path) -> mps.MpsSettings:
    return mps.MpsSettings(enabled=True, pipe_directory=str(tmp_path / "pipe"),
                           log_directory=str(tmp_path / "log"), start_daemon=True,
                           control_command=str(exe))


def test_daemon_start_is_idempotent_and_stop_quits(tmp_path: Path, fake_control: Path) -> None:
    s = settings_for(tmp_path, fake_control)
    daemon = MpsControlDaemon(s, [U0, U1], base_env={"PATH": os.environ["PATH"]})
    assert daemon.pid() is None
    assert daemon.start() is True
    pid = daemon.pid()
    assert pid is not None and (tmp_path / "log").is_dir()
    first = calls(tmp_path / "pipe")[0]
    assert first["argv"] == ["-d"]
    assert first["env"] == {"CUDA_MPS_PIPE_DIRECTORY": s.pipe_directory,
                            "CUDA_MPS_LOG_DIRECTORY": s.log_directory,
                            "CUDA_VISIBLE_DEVICES": f"{U0},{U1}"}
    # a second manager finds the running daemon and leaves it alone
    other = MpsControlDaemon(s, [U0, U1])
    assert other.start() is False and not other.started
    assert len(calls(tmp_path / "pipe")) == 1
    daemon.stop()
    assert daemon.pid() is None and not daemon.started
    assert calls(tmp_path / "pipe")[-1]["argv"] == [] and calls(tmp_path / "pipe")[-1]["stdin"] == "quit\n"
    wait(lambda: _gone(pid), what="the daemon process to exit")
    daemon.stop()                   # nothing running: a no-op
    assert len(calls(tmp_path / "pipe")) == 2


def _gone(pid: int) -> bool:
    """The process has exited (no /proc entry, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# The timeout also bounds each run of the fake control command (a Python script: its
# start alone can take a good part of a second on a loaded machine); the one that never
# writes its pid costs the whole timeout.
@pytest.mark.parametrize(("mode", "message", "timeout_s"), [
    ("fail", "exited 1: An instance of this daemon is already running", 15.0),
    ("no-pid", "wrote no live pid", 3.0),
])
def test_daemon_start_failures_are_clear(tmp_path: Path, fake_control: Path, mode: str,
                                         message: str, timeout_s: float) -> None:
    daemon = MpsControlDaemon(settings_for(tmp_path, fake_control), [U0],
                              base_env={"FAKE_MPS_MODE": mode}, timeout_s=timeout_s)
    with pytest.raises(MpsDaemonError, match=message):
        daemon.start()
    assert not daemon.started


def test_daemon_missing_executable_and_stale_pid_file(tmp_path: Path) -> None:
    s = settings_for(tmp_path, tmp_path / "absent-control")
    daemon = MpsControlDaemon(s, [U0])
    os.makedirs(s.pipe_directory)
    (Path(s.pipe_directory) / mps.CONTROL_PID_FILE).write_text("not a pid")
    assert daemon.pid() is None
    (Path(s.pipe_directory) / mps.CONTROL_PID_FILE).write_text("999999999")   # no such process
    assert daemon.pid() is None
    with pytest.raises(MpsDaemonError, match="absent-control"):
        daemon.start()


def test_plugin_starts_the_daemon_for_its_gpus_and_stops_it(harness: PluginHarness,
                                                            fake_control: Path) -> None:
    pipe = harness.root / "pipe"
    up(harness, node_config=node_entry(operatingmode="mps", filterdevices={"index": [1]}, mps={
        "enabled": True, "startDaemon": True, "pipeDirectory": str(pipe),
        "logDirectory": str(harness.root / "log"), "controlCommand": str(fake_control)}))
    started = calls(pipe)
    assert [c["argv"] for c in started] == [["-d"]]
    assert started[0]["env"]["CUDA_VISIBLE_DEVICES"] == A         # GPU 1 is filtered out
    pid = int((pipe / mps.CONTROL_PID_FILE).read_text())
    os.kill(pid, 0)
    harness.stop.set()
    assert harness.thread is not None
    harness.thread.join(timeout=10)
    assert harness.errors == []
    assert [c["stdin"] for c in calls(pipe)] == ["", "quit\n"]
    assert not (pipe / mps.CONTROL_PID_FILE).exists()
    wait(lambda: _gone(pid), what="the daemon process to exit")
