"""containerd for the real test node (:mod:`hami.testing.node`): which build, and its
configuration.

The node prefers the containerd built by ``hack/containerd/build.sh`` (``containerd``,
``containerd-shim-runc-v2`` and ``ctr`` at :data:`CONTAINERD_VERSION`, from the Go module
proxy): 2.x by default, because 2.x injects CDI devices (a device plugin's
``cdi_devices``, a DRA driver's claims) out of the box; ``HAMI_CONTAINERD_VERSION=v1.7.35``
runs the 1.7 line, with CDI turned on in its configuration. Without that build, or with
``HAMI_CONTAINERD=system``, it runs the machine's containerd found on ``PATH`` (Debian
bookworm's is 1.6, without CDI). runc is always the machine's.

Configurations follow containerd's documented files: ``version = 3`` for 2.x (CRI split
into ``io.containerd.cri.v1.images`` and ``io.containerd.cri.v1.runtime``, CDI always on,
``cdi_spec_dirs``), ``version = 2`` for 1.x (one ``io.containerd.grpc.v1.cri`` section).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami.testing.processes import selected_release

#: The release ``hack/containerd/go.mod`` pins (a unit test checks that they agree).
PINNED_CONTAINERD_VERSION = "v2.4.2"
_RELEASE = re.compile(r"v?(\d{1,3}\.\d{1,3}\.\d{1,3})")


def selected_containerd_version(environ: Mapping[str, str] | None = None) -> str:
    """The containerd build the real node runs: ``$HAMI_CONTAINERD_VERSION`` (``v1.7.35``
    or ``1.7.35``; ``make ... CONTAINERD_VERSION=...`` sets it) when set and not empty,
    else :data:`PINNED_CONTAINERD_VERSION`. ``hack/containerd/build.sh`` builds the ones
    pinned under ``hack/containerd/versions/``.

    Raises:
        ValueError: the variable is not ``[v]<major>.<minor>.<patch>``.
    """
    return selected_release("HAMI_CONTAINERD_VERSION", PINNED_CONTAINERD_VERSION, _RELEASE,
                            "v1.7.35", environ)


#: The containerd release of this run (:func:`selected_containerd_version`).
CONTAINERD_VERSION = selected_containerd_version()
#: What ``hack/containerd/build.sh`` builds.
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
_VERSION_WORD = re.compile(r"^v?(\d+)\.(\d+)")
#: Where Debian (``containernetworking-plugins``) and upstream put the CNI plugins.
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


def default_containerd_dir() -> Path:
    """Where ``hack/containerd/build.sh`` puts its binaries: ``$HAMI_CONTAINERD_BIN_DIR``
    when set, else ``${HAMI_CACHE_DIR:-~/.cache/hami}/containerd-<version>/bin``."""
    explicit = os.environ.get("HAMI_CONTAINERD_BIN_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("HAMI_CACHE_DIR") or Path.home() / ".cache" / "hami"
    return Path(cache) / f"containerd-{CONTAINERD_VERSION}" / "bin"


@dataclass(frozen=True, slots=True)
class Containerd:
    """The containerd a node runs: ``bin_dir`` holds all of :data:`BINARIES`, or None for
    the machine's (``PATH``); ``major``/``minor`` its version (2.4, 1.7, 1.6)."""

    bin_dir: Path | None
    major: int
    minor: int = 0

    def binary(self, name: str) -> str:
        """Path (or ``PATH`` name) of ``containerd``, ``ctr`` or the shim."""
        return str(self.bin_dir / name) if self.bin_dir is not None else name

    def path_env(self, path: str | None = None) -> str:
        """``PATH`` for containerd: ``bin_dir`` first, so it starts its own shim (it looks
        the shim up on ``PATH`` before beside itself) and the machine's runc."""
        path = path if path is not None else os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        return f"{self.bin_dir}{os.pathsep}{path}" if self.bin_dir is not None else path

    @property
    def has_cdi(self) -> bool:
        """Whether the CRI plugin injects CDI devices: 2.x always; 1.7 because the node's
        configuration sets ``enable_cdi`` (:func:`config_toml`); 1.6 has no CDI."""
        return (self.major, self.minor) >= (1, 7)


def parse_major(version_output: str) -> int:
    """:func:`parse_major_minor`'s major."""
    return parse_major_minor(version_output)[0]


def parse_major_minor(version_output: str) -> tuple[int, int]:
    """Major and minor version from ``containerd --version`` output, e.g. ``containerd
    github.com/containerd/containerd/v2 v2.4.2 rev`` -> (2, 4), Debian's ``containerd
    github.com/containerd/containerd 1.6.20~ds1 ...`` -> (1, 6).

    Raises:
        ValueError: no version word in the output.
    """
    for word in version_output.split()[1:]:
        m = _VERSION_WORD.match(word)
        if m:
            return int(m.group(1)), int(m.group(2))
    raise ValueError(f"no version in containerd --version output {version_output!r}")


def find_containerd(bin_dir: Path | None = None) -> Containerd:
    """The containerd a node should run: the build in ``bin_dir`` (default
    :func:`default_containerd_dir`) when it has all three binaries and
    ``HAMI_CONTAINERD`` is not ``system``; else the machine's.

    Raises:
        ValueError: the chosen ``containerd --version`` prints no version.
        OSError: it cannot be run (absent from ``PATH``: check
            :func:`hami.testing.nodeprereq.missing_prerequisites` first).
    """
    built = bin_dir or default_containerd_dir()
    chosen = built if os.environ.get("HAMI_CONTAINERD") != "system" and all(
        os.access(built / b, os.X_OK) for b in BINARIES) else None
    exe = str(chosen / "containerd") if chosen is not None else shutil.which("containerd")
    if exe is None:
        raise FileNotFoundError("containerd is neither built (hack/containerd/build.sh) "
                                "nor on PATH")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return Containerd(chosen, *parse_major_minor(out))


@dataclass(frozen=True, slots=True)
class NodeRuntimeConfig:
    """What a node's containerd configuration names. ``socket``: the gRPC socket (ttrpc
    gets ``<socket>.ttrpc``); ``cni_bin_dir``/``cni_conf_dir``: the CNI plugins and the
    node's conflist; ``cdi_dirs``: CDI spec directories (containerd 2.x and 1.7)."""

    socket: Path
    sandbox_image: str
    cni_bin_dir: str
    cni_conf_dir: Path
    cdi_dirs: tuple[str, ...] = ("/run/cdi",)


def config_toml(major: int, cfg: NodeRuntimeConfig, *, minor: int = 0) -> str:
    """containerd's configuration for a test node: state under ``/var/lib/containerd``
    and ``/run/containerd`` (tmpfs in the node's namespace), overlayfs, runc through the
    v2 shim with cgroupfs (``SystemdCgroup = false``, as the kubelet's ``cgroupDriver``),
    the CNI bridge, no SELinux/AppArmor, OOM score adjustments restricted; with 2.x also
    the CDI spec directories. ``major``: 1 (``version = 2`` file) or 2 (``version = 3``).
    On 1.7 (``minor`` 7 or later) CDI is off by default; the file turns it on with
    ``enable_cdi = true`` and ``cdi_spec_dirs`` (containerd's documented 1.7 CRI options),
    as a cluster that runs hami's allocate mode ``cdi`` on 1.7 must.
    """
    common = f"""root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "{cfg.socket}"
[ttrpc]
  address = "{cfg.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"
"""
    runc = """default_runtime_name = "runc"
    [{p}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{p}.containerd.runtimes.runc.options]
        SystemdCgroup = false"""
    cni = f"""bin_dir{{s}} = {{b}}
    conf_dir = "{cfg.cni_conf_dir}"
    max_conf_num = 1"""
    security = """enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true"""
    if major >= 2:
        rt = "plugins.'io.containerd.cri.v1.runtime'"
        dirs = ", ".join(f'"{d}"' for d in cfg.cdi_dirs)
        # NRI would listen on the machine's /var/run/nri/nri.sock, shared by parallel nodes
        return f"""version = 3
disabled_plugins = ["io.containerd.nri.v1.nri"]
{common}[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{cfg.sandbox_image}"
[{rt}]
  {security}
  cdi_spec_dirs = [{dirs}]
  [{rt}.containerd]
    {runc.format(p=rt)}
  [{rt}.cni]
    {cni.format(s='s', b=f'["{cfg.cni_bin_dir}"]')}
"""
    p = 'plugins."io.containerd.grpc.v1.cri"'
    if minor >= 7:
        dirs = ", ".join(f'"{d}"' for d in cfg.cdi_dirs)
        security += f"\n  enable_cdi = true\n  cdi_spec_dirs = [{dirs}]"
    return f"""version = 2
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
{common}[{p}]
  sandbox_image = "{cfg.sandbox_image}"
  {security}
  [{p}.containerd]
    snapshotter = "overlayfs"
    {runc.format(p=p)}
  [{p}.cni]
    {cni.format(s='', b=f'"{cfg.cni_bin_dir}"')}
"""


def cni_bin_dir() -> str:
    """The first of :data:`CNI_BIN_DIRS` that has the ``bridge`` plugin (else Debian's)."""
    for d in CNI_BIN_DIRS:
        if (Path(d) / "bridge").exists():
            return d
    return CNI_BIN_DIRS[0]


def bridge_conflist(name: str, bridge: str, subnet: str, ipam_dir: Path) -> dict[str, Any]:
    """A CNI conflist (JSON document) for one ``bridge`` network: ``bridge`` is the Linux
    bridge's name, ``subnet`` the pod CIDR (host-local IPAM, state in ``ipam_dir``). The
    bridge is the pods' default gateway, so pods reach the host (and through it the
    apiserver, see :mod:`hami.testing.podnet`) as on a cluster node; no masquerade."""
    return {
        "cniVersion": "1.0.0", "name": name,
        "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": True,
            "isDefaultGateway": True, "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "dataDir": str(ipam_dir)},
        }],
    }
