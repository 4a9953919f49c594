"""Start and stop NVIDIA's MPS control daemon for a node (ours, opt-in: ``mps.startDaemon``).

The interface is NVIDIA's command line (MPS documentation, "Tools and Interface
Reference"): ``nvidia-cuda-mps-control -d`` starts the daemon in the background; it
writes ``nvidia-cuda-mps-control.pid`` into ``$CUDA_MPS_PIPE_DIRECTORY``; writing
``quit`` to the standard input of ``nvidia-cuda-mps-control`` (same environment) stops
it. Tests drive a fake executable that speaks the same protocol; no test here has run the
real daemon (``docs/mps.md``).

One daemon serves every registered GPU of the node, so a container holding several GPUs
talks to one pipe directory.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hami.deviceplugin.mps import CONTROL_PID_FILE, MpsSettings, daemon_env

log = logging.getLogger(__name__)


class MpsDaemonError(RuntimeError):
    """The control daemon could not be started or stopped (message says why)."""


class MpsControlDaemon:
    """The node's MPS control daemon, driven through its executable.

    ``settings`` gives the executable, pipe and log directories; ``gpu_uuids`` become
    the daemon's ``CUDA_VISIBLE_DEVICES``; ``base_env`` (default ``os.environ``) is
    extended with :func:`hami.deviceplugin.mps.daemon_env`.
    """

    def __init__(self, settings: MpsSettings, gpu_uuids: Sequence[str],
                 base_env: Mapping[str, str] | None = None, timeout_s: float = 15.0) -> None:
        self.settings = settings
        self.env = {**(os.environ if base_env is None else base_env),
                    **daemon_env(settings, gpu_uuids)}
        self.timeout_s = timeout_s
        self.pid_file = Path(settings.pipe_directory) / CONTROL_PID_FILE
        self.started = False

    def pid(self) -> int | None:
        """PID of a live daemon from its pid file, else None (absent, garbage, dead)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid <= 0:
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid  # alive, owned by another user
        return pid

    def _run(self, args: list[str], stdin: str | None) -> tuple[int, str]:
        """Run the control executable; ``(exit status, stderr or stdout text)``.

        Output goes to a temporary file, not a pipe: a daemon that keeps the inherited
        descriptors open would otherwise hold the pipe and block this call."""
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.run([self.settings.control_command, *args],
                                      input=stdin.encode() if stdin is not None else None,
                                      stdin=None if stdin is not None else subprocess.DEVNULL,
                                      stdout=out, stderr=out, env=self.env,
                                      timeout=self.timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsDaemonError(f"{self.settings.control_command} {' '.join(args)}: "
                                     f"{exc}") from None
            out.seek(0)
            return proc.returncode, out.read().decode(errors="replace").strip()

    def _wait(self, alive: bool) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if (self.pid() is not None) == alive:
                return True
            time.sleep(0.05)
        return (self.pid() is not None) == alive

    def start(self) -> bool:
        """Create the pipe and log directories and run ``<control> -d`` unless a daemon
        already answers in the pipe directory. Returns True when this call started it.
        Raises :class:`MpsDaemonError` (non-zero exit, no pid file within the timeout,
        executable missing, directories not creatable)."""
        try:
            os.makedirs(self.settings.pipe_directory, exist_ok=True)
            os.makedirs(self.settings.log_directory, exist_ok=True)
        except OSError as exc:
            raise MpsDaemonError(f"cannot create MPS directories: {exc}") from None
        if self.pid() is not None:
            log.info("MPS control daemon already running (pid %s) in %s", self.pid(),
                     self.settings.pipe_directory)
            return False
        status, output = self._run(["-d"], None)
        if status != 0:
            raise MpsDaemonError(f"{self.settings.control_command} -d exited {status}: "
                                 f"{output}")
        if not self._wait(alive=True):
            raise MpsDaemonError(f"MPS control daemon wrote no live pid to {self.pid_file} "
                                 f"within {self.timeout_s:g} s")
        self.started = True
        log.info("MPS control daemon started (pid %s), pipes in %s, GPUs %s", self.pid(),
                 self.settings.pipe_directory, self.env["CUDA_VISIBLE_DEVICES"])
        return True

    def stop(self) -> None:
        """Send ``quit`` and wait for the daemon to exit; a no-op when none runs.
        Raises :class:`MpsDaemonError` when it is still alive after the timeout."""
        if self.pid() is None:
            return
        status, output = self._run([], "quit\n")
        if status != 0:
            log.warning("MPS quit exited %d: %s", status, output)
        if not self._wait(alive=False):
            raise MpsDaemonError(f"MPS control daemon (pid {self.pid()}) still running "
                                 f"{self.timeout_s:g} s after quit")
        self.started = False
        log.info("MPS control daemon stopped")
