"""The monitor against two hostile containers (issue 25 items 2 and 3), through the
monitor's own loop body (``ContainerLister.update`` + ``feedback_tick``) on real files.

* **priority**: a priority-0 container (pod spec ``CUDA_TASK_PRIORITY=0``) writes
  ``recent_kernel=2`` into its region before every tick; a priority-1 neighbour on the same
  GPU launches whenever it is not blocked (libvgpu writes 2 at a launch, and waits while
  the field is negative). Counts the ticks of one simulated hour (720 ticks of 5 s) after
  which the neighbour is blocked (``recent_kernel < 0``).
* **flood**: one container's cache directory holds ``--names`` entries ending in
  ``.cache`` (the container made them); an honest container sits beside it. Reports the
  mean wall time of one loop tick (update + feedback) and the longest log message the
  monitor built, and whether the honest container still got its feedback.

Usage: ``PYTHONPATH=src python bench/bench_monitor_hostile.py [--names 200000]``
"""

from __future__ import annotations

import argparse
import json
import logging
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.node.regionfile import RegionSpec, allocated, build, read_feedback  # noqa: E402

from hami.deviceplugin.allocate import ContainerView, PodView  # noqa: E402
from hami.monitor.command import feedback_tick  # noqa: E402
from hami.monitor.lister import ContainerLister  # noqa: E402

GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
RK_OFFSET = 2_008_904


class Longest(logging.Handler):
    """Keeps the length of the longest formatted log message."""

    def __init__(self) -> None:
        super().__init__()
        self.longest = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.longest = max(self.longest, len(record.getMessage()))


def pod(uid: str, priority: int) -> PodView:
    return PodView("ns", uid, uid, "node-a", "Running", allocated((GPU,)),
                   (ContainerView("main", {"CUDA_TASK_PRIORITY": str(priority)}),))


def put(root: Path, key: str, priority: int) -> Path:
    d = root / key
    d.mkdir(parents=True)
    path = d / "3f1c.cache"
    path.write_bytes(bytes(build(RegionSpec(uuids=(GPU,), priority=priority, recent_kernel=2))))
    return path


def write_rk(path: Path, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(RK_OFFSET)
        f.write(struct.pack("<i", value))


def priority_hour(tmp: Path, ticks: int = 720) -> dict[str, int]:
    root = tmp / "prio"
    attacker, victim = put(root, "a_main", 0), put(root, "v_main", 1)
    pods = [pod("a", 0), pod("v", 1)]
    lister = ContainerLister(root)
    blocked = 0
    for _ in range(ticks):
        write_rk(attacker, 2)                      # the hostile writer, every tick
        if read_feedback(victim.read_bytes())[1] >= 0:
            write_rk(victim, 2)                    # the neighbour launches when it may
        lister.update({"a", "v"})
        feedback_tick(lister, pods)
        blocked += read_feedback(victim.read_bytes())[1] < 0
    lister.close()
    return {"ticks": ticks, "victim_blocked_ticks": blocked}


def flood(tmp: Path, names: int, ticks: int = 20) -> dict[str, object]:
    root = tmp / "flood"
    honest = put(root, "h_main", 1)
    flooded = root / "f_main"
    flooded.mkdir()
    for i in range(names):
        (flooded / f"x{i:06d}.cache").touch()
    pods = [pod("h", 1), pod("f", 1)]
    handler = Longest()
    logging.getLogger("hami").addHandler(handler)
    lister = ContainerLister(root)
    times = []
    honest_fed = 0
    for _ in range(ticks):
        write_rk(honest, 2)
        t0 = time.perf_counter()
        lister.update({"h", "f"})
        out = feedback_tick(lister, pods)
        times.append(time.perf_counter() - t0)
        honest_fed += any(c.key == "h_main" and c.recent_kernel == 1 for c in out)
    lister.close()
    logging.getLogger("hami").removeHandler(handler)
    return {"names": names, "ticks": ticks, "ms_per_tick": round(1000 * sum(times) / ticks, 2),
            "largest_log_message_bytes": handler.longest, "honest_fed_ticks": honest_fed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", type=int, default=200_000)
    ap.add_argument("--ticks", type=int, default=720)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps({"priority": priority_hour(Path(tmp), args.ticks),
                          "flood": flood(Path(tmp), args.names)}))


if __name__ == "__main__":
    main()
