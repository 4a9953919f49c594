"""Loading the Alibaba GPU trace ``cluster-trace-gpu-v2023`` ("openb") into typed records.

The CSV layout is the trace's (github.com/alibaba/clusterdata): node lists have the header
``sn,cpu_milli,memory_mib,gpu,model`` (a node list of the user's own may add a sixth column
``mode``: ``hami-core``, the default when empty, or ``mig``); pod lists have either 11 columns
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``) or 5 (``name,cpu_milli,memory_mib,num_gpu,gpu_milli``, the
``multigpu*`` files). The files are read from a directory given by the user and never
shipped with the package (research-only terms, see that README).

Every malformed row raises :class:`TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.sim.mig import MigModelError, require_mig_model

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
#: A node list with the GPUs' operating mode (ours, not in the trace).
NODE_COLUMNS_MODE = (*NODE_COLUMNS, "mode")
#: Values of the ``mode`` column (HAMi v2.10 ``operatingmode``; mps is not simulated).
NODE_MODES = ("hami-core", "mig")
POD_COLUMNS_5 = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_COLUMNS_11 = (*POD_COLUMNS_5, "gpu_spec", "qos", "pod_phase", "creation_time",
                  "deletion_time", "scheduled_time")

#: Default GPU node list of the paper's replay protocol.
GPU_NODE_FILE = "openb_node_list_gpu_node.csv"
#: Workload names with a file, e.g. ``default`` -> ``openb_pod_list_default.csv``.
POD_FILE_PATTERN = "openb_pod_list_{workload}.csv"


class TraceError(ValueError):
    """A trace file is missing, has an unexpected header, or holds a malformed row."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One machine of the trace (a row of a node list). ``mode`` is the GPUs' operating
    mode, ``hami-core`` (shared by HAMi-core) or ``mig`` (split into MIG instances)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str
    mode: str = "hami-core"


@dataclass(frozen=True, slots=True)
class TracePod:
    """One task of the trace. ``gpu_milli`` is per GPU (1000 = a whole GPU);
    ``gpu_spec`` lists allowed models (empty = any). ``creation_time``,
    ``deletion_time`` and ``scheduled_time`` are seconds from the trace's start (None
    when the file has no such column or the cell is empty: ``scheduled_time`` is empty
    for a pod the trace never scheduled)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None

    @property
    def gpu_demand_milli(self) -> int:
        """GPU requested in milli-GPU: ``num_gpu * gpu_milli``."""
        return self.num_gpu * self.gpu_milli


def _int(text: str, path: Path, line: int, column: str, *, low: int = 0,
         high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceError(f"{path.name} line {line}: column {column} must be an integer, "
                         f"got {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise TraceError(f"{path.name} line {line}: column {column} must be {bound}, "
                         f"got {value}")
    return value


def _rows(path: Path, accepted: Sequence[Sequence[str]]) -> tuple[tuple[str, ...],
                                                                   Iterable[tuple[int, list[str]]]]:
    if not path.is_file():
        raise TraceError(f"file not found: {path}")
    handle = path.open(newline="", encoding="utf-8")
    reader = csv.reader(handle)
    try:
        header = tuple(h.strip() for h in next(reader))
    except StopIteration:
        handle.close()
        raise TraceError(f"{path.name}: empty file, expected a header") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        handle.close()
        raise TraceError(f"{path.name}: not a UTF-8 CSV file ({exc})") from None
    if header not in [tuple(a) for a in accepted]:
        handle.close()
        raise TraceError(f"{path.name}: unexpected header {','.join(header)!r}; expected "
                         + " or ".join(repr(",".join(a)) for a in accepted))

    def gen() -> Iterable[tuple[int, list[str]]]:
        with handle:
            try:
                yield from rows()
            except (UnicodeDecodeError, csv.Error) as exc:
                raise TraceError(f"{path.name} line {reader.line_num + 1}: not UTF-8 CSV "
                                 f"({exc})") from None

    def rows() -> Iterable[tuple[int, list[str]]]:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise TraceError(f"{path.name} line {reader.line_num}: expected "
                                 f"{len(header)} columns, got {len(row)}")
            yield reader.line_num, row

    return header, gen()


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Read a node list (``openb_node_list_*.csv``, or the same with a ``mode`` column).

    Raises:
        TraceError: missing file, wrong header, malformed or duplicate row, a ``mode``
            other than ``hami-core``/``mig``, or ``mig`` on a node without GPUs or with a
            GPU model that has no MIG profiles (:mod:`hami.sim.mig`).
    """
    path = Path(path)
    header, rows = _rows(path, [NODE_COLUMNS, NODE_COLUMNS_MODE])
    with_mode = len(header) == len(NODE_COLUMNS_MODE)
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in rows:
        name = row[0].strip()
        if not name:
            raise TraceError(f"{path.name} line {line}: empty node name")
        if name in seen:
            raise TraceError(f"{path.name} line {line}: duplicate node {name!r}")
        seen.add(name)
        gpu = _int(row[3], path, line, "gpu", high=64)
        model = row[4].strip()
        if gpu > 0 and not model:
            raise TraceError(f"{path.name} line {line}: node {name} has {gpu} GPUs but no model")
        mode = (row[5].strip() or NODE_MODES[0]) if with_mode else NODE_MODES[0]
        if mode not in NODE_MODES:
            raise TraceError(f"{path.name} line {line}: column mode must be "
                             f"{' or '.join(NODE_MODES)}, got {row[5].strip()!r}")
        if mode == "mig" and gpu == 0:
            raise TraceError(f"{path.name} line {line}: node {name} is in mig mode but "
                             "has no GPU")
        if mode == "mig":
            try:
                require_mig_model(model, name)
            except MigModelError as exc:
                raise TraceError(f"{path.name} line {line}: {exc}") from None
        nodes.append(TraceNode(name, _int(row[1], path, line, "cpu_milli"),
                               _int(row[2], path, line, "memory_mib"), gpu, model, mode))
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """Read a pod list with 11 or 5 columns (``openb_pod_list_*.csv``).

    Raises:
        TraceError: missing file, wrong header, malformed row, or a ``gpu_milli`` outside
            0..1000 / inconsistent with ``num_gpu`` (a share below 1000 needs one GPU).
    """
    path = Path(path)
    header, rows = _rows(path, [POD_COLUMNS_11, POD_COLUMNS_5])
    full = len(header) == len(POD_COLUMNS_11)
    pods: list[TracePod] = []
    for line, row in rows:
        name = row[0].strip()
        if not name:
            raise TraceError(f"{path.name} line {line}: empty pod name")
        num_gpu = _int(row[3], path, line, "num_gpu", high=64)
        gpu_milli = _int(row[4], path, line, "gpu_milli", high=1000)
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceError(f"{path.name} line {line}: gpu_milli {gpu_milli} without a GPU")
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceError(f"{path.name} line {line}: num_gpu {num_gpu} with gpu_milli 0")
        if num_gpu > 1 and gpu_milli != 1000:
            raise TraceError(f"{path.name} line {line}: a GPU share ({gpu_milli} milli) is "
                             f"only valid with num_gpu 1, got {num_gpu}")
        spec: tuple[str, ...] = ()
        qos = ""
        created: int | None = None
        deleted: int | None = None
        scheduled: int | None = None
        if full:
            spec = tuple(s.strip() for s in row[5].split("|") if s.strip())
            qos = row[6].strip()
            if row[8].strip():
                created = _int(row[8], path, line, "creation_time")
            if row[9].strip():
                deleted = _int(row[9], path, line, "deletion_time")
            if row[10].strip():
                scheduled = _int(row[10], path, line, "scheduled_time")
        pods.append(TracePod(name, _int(row[1], path, line, "cpu_milli"),
                             _int(row[2], path, line, "memory_mib"), num_gpu, gpu_milli,
                             spec, qos, created, deleted, scheduled))
    return pods


def pod_file(trace_dir: str | Path, workload: str) -> Path:
    """Path of the pod list of ``workload`` (``default``, ``gpushare100``, ...).

    Raises:
        TraceError: the file does not exist; the message lists the workloads present.
    """
    base = Path(trace_dir)
    path = base / POD_FILE_PATTERN.format(workload=workload)
    if not path.is_file():
        present = sorted(p.name[len("openb_pod_list_"):-4]
                         for p in base.glob("openb_pod_list_*.csv"))
        hint = ", ".join(present) if present else "none"
        raise TraceError(f"no pod list for workload {workload!r} in {base} "
                         f"(workloads there: {hint})")
    return path


def load_trace(trace_dir: str | Path, workload: str = "default",
               node_file: str = GPU_NODE_FILE) -> tuple[list[TraceNode], list[TracePod]]:
    """Nodes (the paper's GPU node list by default) and the pods of ``workload``."""
    base = Path(trace_dir)
    if not base.is_dir():
        raise TraceError(f"trace directory not found: {base}")
    return load_nodes(base / node_file), load_pods(pod_file(base, workload))


#: The paper's cached results, relative to the trace directory (optional).
REFERENCE_FILE = "fgd_expected_results/analysis_allo_discrete.csv"


def load_reference(trace_dir: str | Path, workload: str) -> dict[str, dict[int, float]]:
    """The paper's median unallocated GPU % per policy and arrived-demand point.

    Reads ``fgd_expected_results/analysis_allo_discrete.csv`` (allocation ratio per
    workload, policy, seed and point 0..130) and returns ``100 - median`` over seeds,
    empty cells skipped; ``{}`` when the file or the workload is absent.
    """
    path = Path(trace_dir) / REFERENCE_FILE
    if not path.is_file():
        return {}
    wanted = f"openb_pod_list_{workload}"
    values: dict[str, dict[int, list[float]]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        points = [(i, int(h)) for i, h in enumerate(header) if h.strip().isdigit()]
        for row in reader:
            if not row or row[0] != wanted:
                continue
            curve = values.setdefault(row[1], {})
            for i, point in points:
                cell = row[i].strip() if i < len(row) else ""
                if cell:
                    try:
                        curve.setdefault(point, []).append(float(cell))
                    except ValueError:
                        continue
    out: dict[str, dict[int, float]] = {}
    for policy, curve in values.items():
        out[policy] = {}
        for point, vals in sorted(curve.items()):
            vals.sort()
            mid = len(vals) // 2
            median = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
            out[policy][point] = 100.0 - median
    return out
