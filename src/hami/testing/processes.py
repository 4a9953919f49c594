"""The processes of the test control plane (:mod:`hami.testing.controlplane`): where the
Kubernetes binaries are, free ports, waiting, and one running component with its log.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The Kubernetes release hack/k8s/go.mod pins (a unit test checks that they agree).
PINNED_KUBERNETES_VERSION = "v1.37.2"
_RELEASE = re.compile(r"v?(1\.\d{1,3}\.\d{1,3})")


def selected_kubernetes_version(environ: Mapping[str, str] | None = None) -> str:
    """The release the tests run: ``$HAMI_K8S_VERSION`` (``v1.31.14`` or ``1.31.14``;
    ``make e2e K8S_VERSION=...`` sets it) when set and not empty, else
    :data:`PINNED_KUBERNETES_VERSION`. ``hack/k8s/build.sh`` builds any release pinned by
    ``hack/k8s/pin.sh`` (``K8S_VERSION=...``).

    Raises:
        ValueError: the variable is set to something that is not ``[v]1.<minor>.<patch>``.
    """
    return selected_release("HAMI_K8S_VERSION", PINNED_KUBERNETES_VERSION, _RELEASE,
                            "v1.31.14", environ)


def selected_release(variable: str, pinned: str, release: re.Pattern[str], example: str,
                     environ: Mapping[str, str] | None = None) -> str:
    """``v<version>`` from the environment variable ``variable`` (``release`` fullmatches
    it, group 1 the version without ``v``), or ``pinned`` when it is unset or empty.

    Raises:
        ValueError: the variable is set to something ``release`` does not match (the
        message quotes at most 40 characters of it and names ``example``).
    """
    raw = (os.environ if environ is None else environ).get(variable, "").strip()
    if not raw:
        return pinned
    m = release.fullmatch(raw)
    if m is None:
        raise ValueError(f"{variable}={raw[:40]!r} is not a release like {example}")
    return "v" + m.group(1)


#: The Kubernetes release of this run (:func:`selected_kubernetes_version`): its binaries
#: (hack/k8s/build.sh), the kubelet's and kube-scheduler's image tags follow it.
KUBERNETES_VERSION = selected_kubernetes_version()

#: Loopback address every component listens on.
HOST = "127.0.0.1"

#: Names of the binaries this module runs.
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")

#: Default seconds to wait for one component to become healthy.
DEFAULT_TIMEOUT_S = 90.0

POLL_S = 0.1


class ControlPlaneError(RuntimeError):
    """A component failed to start, died, or did not become healthy in time."""


class BinariesMissing(ControlPlaneError, FileNotFoundError):
    """The Kubernetes binaries are not built; the message says how to build them."""


def default_bin_dir() -> Path:
    """Directory holding etcd, kube-apiserver and kube-scheduler.

    ``$HAMI_K8S_BIN_DIR`` when set, else
    ``${HAMI_CACHE_DIR:-~/.cache/hami}/k8s-<KUBERNETES_VERSION>/bin`` (build.sh's output).
    """
    explicit = os.environ.get("HAMI_K8S_BIN_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("HAMI_CACHE_DIR") or str(Path.home() / ".cache" / "hami")
    return Path(cache) / f"k8s-{KUBERNETES_VERSION}" / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Paths of the three binaries in ``bin_dir`` (default :func:`default_bin_dir`).

    Raises:
        BinariesMissing: one of them is absent or not executable.
    """
    bin_dir = bin_dir or default_bin_dir()
    found = {name: bin_dir / name for name in BINARIES}
    missing = [n for n, p in found.items() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"{', '.join(missing)} not found in {bin_dir}; build them with hack/k8s/build.sh "
            "(or point HAMI_K8S_BIN_DIR at a directory that has them)"
        )
    return found


#: Where :func:`free_port` picks from: below Linux's default ephemeral range (32768 and
#: up, ``ip_local_port_range``) and the NodePort range (30000-32767), above the
#: well-known Kubernetes ports (6443, 10250-10259, 2379-2380).
FREE_PORT_RANGE = range(20000, 30000)
_handed_out: set[int] = set()
_port_rng = random.Random()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago, for a process started later.

    Picked at random from :data:`FREE_PORT_RANGE`, never twice in this process. A port
    the kernel picks (``bind(host, 0)``) lies in its ephemeral range, which every
    outgoing connection on the host draws from too: between this call and the child's
    ``listen`` a client connection (the apiserver's, the kubelet's, a test's) may take
    it, and the child fails with "address already in use". When the ephemeral range
    overlaps :data:`FREE_PORT_RANGE` the kernel picks, as before.

    Raises:
        OSError: no port of the range could be bound.
    """
    if _ephemeral_low() < FREE_PORT_RANGE.stop:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    for _ in range(500):
        port = _port_rng.randrange(FREE_PORT_RANGE.start, FREE_PORT_RANGE.stop)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} in {FREE_PORT_RANGE}")


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    alive: Callable[[], None] | None = None,
) -> float:
    """Poll ``check`` every 0.1 s until it returns true; return the seconds waited.

    ``alive`` is called before each poll and should raise if the thing waited for died.

    Raises:
        ControlPlaneError: ``timeout_s`` passed first.
    """
    start = time.monotonic()
    while True:
        if alive is not None:
            alive()
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise ControlPlaneError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(POLL_S)


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the parent thread dies.

    So a test run killed with SIGKILL leaves no etcd/apiserver behind. Elsewhere a no-op.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class Component:
    """A running child process with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stopped: bool = False  # set by stop(): its exit was asked for

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the component's log (stdout and stderr)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise :class:`ControlPlaneError` with the log tail if the process has exited
        without :meth:`stop` having been called."""
        code = self.process.poll()
        if code is not None and not self.stopped:
            raise ControlPlaneError(
                f"{self.name} exited with code {code}; log {self.log_path}:\n{self.log_tail()}"
            )

    def wait_healthy(self, check: Callable[[], bool], what: str, timeout_s: float) -> float:
        """Poll ``check`` (see :func:`wait_until`) while the process lives; return seconds.

        Raises:
            ControlPlaneError: the process exited, or ``timeout_s`` passed; the message
                has the log tail either way.
        """
        try:
            return wait_until(
                check, timeout_s=timeout_s, what=f"{self.name} {what}", alive=self.check_alive
            )
        except ControlPlaneError as err:
            if self.process.poll() is not None:
                raise  # check_alive's message has the tail already
            raise ControlPlaneError(f"{err}; log {self.log_path}:\n{self.log_tail()}") from None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; safe to call twice."""
        self.stopped = True
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def spawn(name: str, argv: Sequence[str], log_dir: Path, cwd: Path) -> Component:
    """Start ``argv`` as component ``name`` in its own session (a Ctrl-C in the terminal
    reaches only the test process), stdout and stderr appended to ``log_dir/<name>.log``,
    stdin closed, SIGTERMed when this process dies (:func:`die_with_parent`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # a Ctrl-C in the terminal reaches only us
            preexec_fn=die_with_parent,
        )
    return Component(name, proc, log_path)


@dataclass
class SchedulerHandle:
    """A kube-scheduler started by :meth:`ControlPlane.start_scheduler`.

    Attributes:
        scheduler_name: the profile's ``schedulerName``.
        config_path: the KubeSchedulerConfiguration file it runs with.
        port: its HTTPS serving port on 127.0.0.1 (``/healthz``, ``/readyz``, ``/metrics``).
        component: the process and its log.
    """

    scheduler_name: str
    config_path: Path
    port: int
    component: Component

    def stop(self) -> None:
        """Stop this kube-scheduler (the control plane keeps running)."""
        self.component.stop()
