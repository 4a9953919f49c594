"""Operating mode ``mps``: HAMi's behaviour plus our opt-in NVIDIA MPS plumbing. Pure.

HAMi v2.10 (HAMi-core 1.2): a node with ``operatingmode: mps`` registers its GPUs
with ``mode: "mps"`` and Allocate answers exactly as in ``hami-core`` (libvgpu env +
mounts, HAMi-core 1.2). Nothing else happens; that stays the default here.

Ours (not in HAMi), opt-in per node with an ``mps`` object in the node's
``config.json`` entry (``docs/mps.md``)::

    {"name": "gpu-7", "operatingmode": "mps",
     "mps": {"enabled": true, "pipeDirectory": "/tmp/nvidia-mps",
             "logDirectory": "/var/log/nvidia-mps", "shmDirectory": "",
             "startDaemon": false, "controlCommand": "nvidia-cuda-mps-control"}}

With ``enabled`` each mps-mode container additionally gets the MPS client environment
(NVIDIA MPS documentation, "Environment Variables"):

* ``CUDA_MPS_PIPE_DIRECTORY=<pipeDirectory>`` and a read-write bind mount of that host
  directory at the same path (the control daemon's named pipes and sockets);
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<cores>`` when the container's cores are limited
  (``0 < d[0].Usedcores < 100``; the same first-device value as ``CUDA_DEVICE_SM_LIMIT``);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<ordinal>=<MiB>M[,...]``: one item per GPU, the
  ordinal being the GPU's position in ``NVIDIA_VISIBLE_DEVICES`` (the container's CUDA
  device numbering, the same positions as ``CUDA_DEVICE_MEMORY_LIMIT_<i>``);
* with ``shmDirectory`` set, that host directory mounted read-write at ``/dev/shm``.

The control daemon itself (``nvidia-cuda-mps-control -d``) is started by
:mod:`hami.deviceplugin.mpsdaemon` when ``startDaemon`` is true, with
:func:`daemon_env`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami.core.model import ContainerDevice

MODE_MPS = "mps"

#: NVIDIA's default pipe directory (MPS documentation, ``CUDA_MPS_PIPE_DIRECTORY``).
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
#: NVIDIA's default log directory (MPS documentation, ``CUDA_MPS_LOG_DIRECTORY``).
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
DEFAULT_CONTROL_COMMAND = "nvidia-cuda-mps-control"
#: The file the control daemon writes into its pipe directory (MPS documentation).
CONTROL_PID_FILE = "nvidia-cuda-mps-control.pid"

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
SHM_CONTAINER_PATH = "/dev/shm"

_KEYS = {"enabled", "pipeDirectory", "logDirectory", "shmDirectory", "startDaemon",
         "controlCommand"}


class MpsConfigError(ValueError):
    """The node config's ``mps`` object is malformed (message names the key)."""


@dataclass(frozen=True, slots=True)
class MpsSettings:
    """Our MPS options for one node (all off by default = HAMi behaviour).

    ``pipe_directory``/``log_directory``/``shm_directory`` are absolute host paths
    (``shm_directory`` "" = no ``/dev/shm`` mount); ``control_command`` is the control
    daemon executable (a name looked up in ``$PATH``, or a path).
    """

    enabled: bool = False
    pipe_directory: str = DEFAULT_PIPE_DIRECTORY
    log_directory: str = DEFAULT_LOG_DIRECTORY
    shm_directory: str = ""
    start_daemon: bool = False
    control_command: str = DEFAULT_CONTROL_COMMAND


#: Directories an MPS path may not be (the pipe directory is mounted read-write at the
#: same path in every container; the shm directory is exposed read-write at /dev/shm).
_SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib",
                          "/lib64", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys",
                          "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/var"})
#: Container paths of the hami-core mounts (HAMi-core 1.2) an MPS directory may not overlap.
_HAMI_MOUNTS = ("/usr/local/vgpu", "/tmp/vgpulock", "/etc/ld.so.preload", "/tmp/license",
                "/usr/bin/vgpuvalidator")


def _path(raw: Mapping[str, object], key: str, default: str, allow_empty: bool) -> str:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise MpsConfigError(f"mps.{key} must be a string, got {value!r}")
    if value == "" and allow_empty:
        return ""
    if not value.startswith("/") or any(c in value for c in ",:\n\0"):
        raise MpsConfigError(f"mps.{key} must be an absolute path without ',', ':' or "
                             f"newlines, got {value!r}")
    path = value.rstrip("/") or "/"
    if posixpath.normpath(path) != path:
        raise MpsConfigError(f"mps.{key} must be a normalised path (no '.', '..' or '//'), "
                             f"got {value!r}")
    if path in _SYSTEM_DIRS:
        raise MpsConfigError(f"mps.{key} {path!r} is a system directory: it would be mounted "
                             "read-write into every container; use a dedicated directory")
    clash = next((r for r in _HAMI_MOUNTS
                  if path == r or path.startswith(r + "/") or r.startswith(path + "/")), None)
    if clash is not None:
        raise MpsConfigError(f"mps.{key} {path!r} collides with hami's own mount {clash!r}")
    return path


def _flag(raw: Mapping[str, object], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise MpsConfigError(f"mps.{key} must be true or false, got {value!r}")
    return value


def parse_settings(raw: object) -> MpsSettings:
    """Parse the ``mps`` object of a ``nodeconfig`` entry (format above; ours).

    Keys: ``enabled``, ``startDaemon`` (bools, default false); ``pipeDirectory``,
    ``logDirectory`` (absolute paths, NVIDIA's defaults); ``shmDirectory`` (absolute path
    or "", default ""); ``controlCommand`` (non-empty string). ``None`` = defaults.
    Raises :class:`MpsConfigError` for a non-object, an unknown key or a bad value.
    """
    if raw is None:
        return MpsSettings()
    if not isinstance(raw, dict):
        raise MpsConfigError(f"mps must be an object, got {raw!r}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise MpsConfigError(f"mps: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
    command = raw.get("controlCommand", DEFAULT_CONTROL_COMMAND)
    if not isinstance(command, str) or not command.strip():
        raise MpsConfigError(f"mps.controlCommand must be a non-empty string, got {command!r}")
    settings = MpsSettings(
        enabled=_flag(raw, "enabled"),
        pipe_directory=_path(raw, "pipeDirectory", DEFAULT_PIPE_DIRECTORY, False),
        log_directory=_path(raw, "logDirectory", DEFAULT_LOG_DIRECTORY, False),
        shm_directory=_path(raw, "shmDirectory", "", True),
        start_daemon=_flag(raw, "startDaemon"),
        control_command=command,
    )
    if settings.start_daemon and not settings.enabled:
        raise MpsConfigError("mps.startDaemon needs mps.enabled: true")
    return settings


def active(operating_mode: str, settings: MpsSettings) -> bool:
    """True when Allocate adds the MPS client environment (mode ``mps`` and enabled)."""
    return operating_mode == MODE_MPS and settings.enabled


def pinned_memory_limit(devices: Sequence[ContainerDevice]) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` value: ``"<ordinal>=<MiB>M"`` joined by ``,``.

    The ordinal is the GPU's position among the entry's distinct UUIDs (the order of
    ``NVIDIA_VISIBLE_DEVICES``); a GPU named twice gets the sum; GPUs with 0 MiB get no
    item. ``M`` is the megabyte qualifier of NVIDIA's MPS interface (the control
    daemon's ``set_default_device_pinned_mem_limit 0 10G`` syntax). "" when no item.
    """
    order: dict[str, int] = {}
    memory: dict[str, int] = {}
    for d in devices:
        order.setdefault(d.uuid, len(order))
        memory[d.uuid] = memory.get(d.uuid, 0) + d.used_memory_mib
    return ",".join(f"{order[u]}={memory[u]}M" for u in order if memory[u] > 0)


def client_env(devices: Sequence[ContainerDevice], settings: MpsSettings) -> dict[str, str]:
    """The MPS variables for one container (see module docstring); ``devices`` non-empty.

    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` only when ``0 < devices[0].used_cores_percent
    < 100``; ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` only when some GPU has memory > 0.
    """
    env = {PIPE_ENV: settings.pipe_directory}
    cores = devices[0].used_cores_percent if devices else 0
    if 0 < cores < 100:
        env[THREAD_ENV] = str(cores)
    limit = pinned_memory_limit(devices)
    if limit:
        env[PINNED_MEM_ENV] = limit
    return env


def client_mounts(settings: MpsSettings) -> tuple[tuple[str, str, bool], ...]:
    """``(container path, host path, read only)`` to add: the pipe directory (same path,
    read-write: clients connect to sockets there) and, when set, ``shmDirectory`` at
    ``/dev/shm``."""
    mounts = [(settings.pipe_directory, settings.pipe_directory, False)]
    if settings.shm_directory:
        mounts.append((SHM_CONTAINER_PATH, settings.shm_directory, False))
    return tuple(mounts)


def daemon_env(settings: MpsSettings, gpu_uuids: Sequence[str]) -> dict[str, str]:
    """Variables for ``nvidia-cuda-mps-control``: pipe and log directory, and
    ``CUDA_VISIBLE_DEVICES`` = the node's registered GPU UUIDs (NVIDIA recommends UUIDs
    over indices). Raises :class:`MpsConfigError` when ``gpu_uuids`` is empty."""
    if not gpu_uuids:
        raise MpsConfigError("no GPU registered: nothing for an MPS control daemon to serve")
    return {PIPE_ENV: settings.pipe_directory, LOG_ENV: settings.log_directory,
            "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids)}
