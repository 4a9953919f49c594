"""Allocate mode ``auto``: which of ``cdi`` and ``node-lock`` a node gets. Pure.

``hami device-plugin --allocate-mode=auto`` (the chart's default) reads its own Node's
``status.nodeInfo`` once at startup and serves in mode ``cdi``
(:mod:`hami.deviceplugin.cdimode`, no node lock) only where the node is known to apply
the CDI devices that mode answers at ``Allocate``; everywhere else it serves in HAMi's
``node-lock`` mode. A wrong ``cdi`` would fail closed (the container starts with
``NVIDIA_VISIBLE_DEVICES=void``, i.e. without a GPU), so every doubt picks the lock.

``cdi`` needs, on the node:

* a container runtime that applies CDI devices without extra configuration, read from
  ``containerRuntimeVersion`` (``<runtime>://<version>``, reported by the kubelet):

  - ``containerd`` 2.0.0 or later: CDI is on by default from 2.0 (containerd pull request
    9621, "Enable CDI by default"); 1.7 has it only with ``enable_cdi = true`` and 1.6
    not at all, so 1.x picks the lock (set ``--allocate-mode=cdi`` explicitly on a 1.7
    node with CDI enabled);
  - ``cri-o`` 1.28.0 or later: CRI-O injects CDI devices by default from 1.23.2
    (Kubernetes issue 121350) and reads them from the CRI ``ContainerConfig.CDIDevices``
    field, the one the kubelet fills from a device plugin's answer, since cri-o pull
    request 6944 (merged May 2023, after the 1.27 branch; 1.28 is the first release
    sure to have it);
  - anything else (``docker``, an unknown runtime, a version that does not parse) picks
    the lock;

* a kubelet that passes a device plugin's CDI devices to the runtime, read from
  ``kubeletVersion``: the ``DevicePluginCDIDevices`` feature is on by default from
  Kubernetes 1.29 (beta; GA in 1.31), so an older kubelet picks the lock;

* not ``operatingmode: mig`` (mode ``cdi`` does not serve MIG instances).

Versions are ``[v]MAJOR.MINOR[.PATCH]`` with an optional ``-suffix`` / ``+build``; a
pre-release of the threshold itself (``2.0.0-rc.1``) is below it, as in semantic
versioning; other suffixes (``1.7.20-0ubuntu1``, ``2.0.4-k3s2``) count as the version
before them. The choice is made once: a runtime upgrade restarts the node's pods,
the plugin's among them, which then choose again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hami.api import names

#: The flag value; never written on a Node (the Node says what was chosen).
ALLOCATE_MODE_AUTO = "auto"
#: Versions from which a runtime applies CDI devices by default (see the module doc).
CDI_RUNTIMES: dict[str, tuple[int, int, int]] = {
    "containerd": (2, 0, 0),
    "cri-o": (1, 28, 0),
}
#: First kubelet minor with ``DevicePluginCDIDevices`` on by default.
CDI_KUBELET = (1, 29)
#: Longest version string looked at (the kubelet's are far shorter).
_MAX_LEN = 256
_VERSION = re.compile(r"v?(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?(?:([-+])[0-9A-Za-z.+~_-]*)?")


@dataclass(frozen=True, slots=True)
class Version:
    """A parsed version: ``release`` is ``(major, minor, patch)``; ``prerelease`` is True
    when a ``-suffix`` follows it (``2.0.0-rc.1``)."""

    release: tuple[int, int, int]
    prerelease: bool

    def at_least(self, floor: tuple[int, int, int]) -> bool:
        """True when this version is ``floor`` or later; a pre-release of ``floor`` itself
        is before it."""
        if self.release != floor:
            return self.release > floor
        return not self.prerelease


@dataclass(frozen=True, slots=True)
class AutoChoice:
    """What ``auto`` picked (``cdi`` or ``node-lock``) and why, in words for the log."""

    mode: str
    reason: str


def parse_version(text: str) -> Version | None:
    """``"v2.0.0-rc.1"`` -> ``Version((2, 0, 0), True)``; None for anything that is not
    ``[v]MAJOR.MINOR[.PATCH][-suffix|+build]`` (or longer than 256 characters)."""
    if not isinstance(text, str) or len(text) > _MAX_LEN:
        return None
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        return None
    major, minor, patch, sep = m.group(1), m.group(2), m.group(3), m.group(4)
    return Version((int(major), int(minor), int(patch or 0)), sep == "-")


def parse_runtime(runtime_version: str) -> tuple[str, Version | None] | None:
    """``"containerd://2.4.2"`` -> ``("containerd", Version((2, 4, 2), False))``; the
    name lower-cased, the version None when it does not parse; None when the text is not
    ``<name>://<version>``."""
    if not isinstance(runtime_version, str) or len(runtime_version) > _MAX_LEN:
        return None
    name, sep, version = runtime_version.strip().partition("://")
    if not sep or not name:
        return None
    return name.lower(), parse_version(version)


def choose_allocate_mode(runtime_version: str | None, kubelet_version: str | None,
                         operating_mode: str) -> AutoChoice:
    """The mode ``auto`` serves in on a node whose kubelet reports ``runtime_version``
    (``status.nodeInfo.containerRuntimeVersion``) and ``kubelet_version``
    (``status.nodeInfo.kubeletVersion``); None or empty for either: the Node could not be
    read or says nothing. ``operating_mode`` is the device config's (``hami-core``,
    ``mps``, ``mig``). Never raises: every odd input picks ``node-lock`` with a reason.
    """
    lock = names.ALLOCATE_MODE_NODE_LOCK
    if operating_mode == "mig":
        return AutoChoice(lock, "operatingmode mig: allocate mode cdi does not serve MIG")
    if not runtime_version:
        return AutoChoice(lock, "the Node reports no container runtime version")
    parsed = parse_runtime(runtime_version)
    shown = repr(runtime_version[:80])
    if parsed is None:
        return AutoChoice(lock, f"container runtime version {shown} is not <runtime>://<version>")
    runtime, version = parsed
    floor = CDI_RUNTIMES.get(runtime)
    if floor is None:
        return AutoChoice(lock, f"container runtime {shown} is not known to apply CDI "
                                "devices by default")
    if version is None:
        return AutoChoice(lock, f"container runtime version {shown} does not parse")
    if not version.at_least(floor):
        need = ".".join(map(str, floor))
        return AutoChoice(lock, f"{shown}: {runtime} applies CDI devices by default from "
                                f"{need} on")
    kv = repr((kubelet_version or "")[:80])
    kubelet = parse_version(kubelet_version or "")
    if kubelet is None:
        return AutoChoice(lock, f"kubelet version {kv} does not parse")
    if kubelet.release[:2] < CDI_KUBELET:
        return AutoChoice(lock, f"kubelet {kv} passes a device plugin's CDI devices to the "
                                "runtime by default from 1.29 on")
    return AutoChoice(names.ALLOCATE_MODE_CDI,
                      f"{shown} applies CDI devices by default and kubelet {kv} passes "
                      "them on")
