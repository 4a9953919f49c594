"""``hami top``'s text tables: the view of :func:`hami.top.cluster_view` as nodes, GPUs
with their pods, what is not counted, allocation signing and quotas (rich tables, no
colour)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from hami.api import names


def _pct(used: int, total: int) -> float:
    return round(100.0 * used / total, 1) if total > 0 else 0.0


def _frac(used: int, total: int, unit: str = "") -> str:
    return f"{used}{unit}/{total}{unit} ({_pct(used, total):.0f}%)"


#: Most node names one part of the signing line lists (the count says how many more).
MAX_NAMED_NODES = 10


def _named(nodes: list[str]) -> str:
    shown = ", ".join(nodes[:MAX_NAMED_NODES])
    more = len(nodes) - MAX_NAMED_NODES
    return f"{shown}, and {more} more" if more > 0 else shown


def _count(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _strict_by_mode(view: Mapping[str, Any]) -> dict[str, list[str]]:
    """Node names by ``strict_signing`` (on, off, unknown) over the view's nodes that
    hami's device plugin registered (DRA nodes have no such mode)."""
    modes: dict[str, list[str]] = {"on": [], "off": [], "unknown": []}
    for n in view.get("nodes") or []:
        mode = n.get("strict_signing")
        if mode is not None:
            modes.get(mode, modes["unknown"]).append(str(n["name"]))
    return modes


def signing_line(view: Mapping[str, Any]) -> str:
    """The lines on allocation signing: how many counted pods carry hami's signature and
    which do not (HAMi's scheduler placed them, or their annotations were forged), and
    per node whether strict signing is on, from each device plugin's
    ``hami.io/node-trust-unsigned-allocations`` (:func:`hami.top.strict_signing`).

    With no unsigned allocation left: ``strict signing is on for all nodes``, or which
    nodes still trust unsigned allocations (safe to switch on there:
    ``allocationSigning.trustUnsignedAllocations=false``), and which do not say
    (``unknown``: an older hami plugin, or HAMi's)."""
    signing = view.get("signing") or {"signed": 0, "unsigned": []}
    unsigned = signing["unsigned"]
    modes = _strict_by_mode(view)
    off, unknown = modes["off"], modes["unknown"]
    if not unsigned:
        head = f"signing: {signing['signed']} signed allocation(s), no unsigned allocation left"
        parts = []
        if off:
            parts.append(f"{_count(len(off))} ({_named(off)}) still "
                         f"{'trusts' if len(off) == 1 else 'trust'} unsigned allocations; "
                         "nothing unsigned is left, so strict signing is safe to switch on "
                         "there (allocationSigning.trustUnsignedAllocations=false)")
        if unknown:
            parts.append(f"strict signing unknown on {_count(len(unknown))} "
                         f"({_named(unknown)}): the device plugin does not say (an older "
                         "hami, or HAMi's)")
        if not parts and modes["on"]:
            parts.append("strict signing is on for all nodes")
        return head + "".join(f"; {p}" if i else f": {p}" for i, p in enumerate(parts))
    pods = ", ".join(f"{p['namespace']}/{p['name']}" for p in unsigned)
    parts = [f"on for {_count(len(modes['on']))}"] if modes["on"] else []
    if off:
        parts.append(f"off on {_named(off)} (unsigned allocations served)")
    if unknown:
        parts.append(f"unknown on {_named(unknown)}")
    strict = ("strict signing: " + "; ".join(parts)) if parts else ""
    return (f"signing: {signing['signed']} signed, {len(unsigned)} unsigned allocation(s): "
            f"{pods}\n  (unsigned: placed by HAMi's scheduler, or forged; a device plugin in "
            "strict mode refuses them)" + (f"\n  {strict}" if strict else ""))


def render_table(view: Mapping[str, Any], *, width: int | None = None) -> str:
    """The view as text tables (nodes, GPUs with their pods, problems, quotas)."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(width=width or 160, file=buf, force_terminal=False, color_system=None)
    nodes = Table(title="nodes", title_justify="left")
    for col in ("NODE", "GPUS", "MEMORY (MiB)", "CORES (%)", "TASKS", "PODS", "STRICT SIGNING",
                "LOCK"):
        nodes.add_column(col, overflow="fold")
    for n in view["nodes"]:
        nodes.add_row(n["name"], str(n["gpus"]),
                      _frac(n["memory_mib"]["used"], n["memory_mib"]["total"]),
                      _frac(n["cores"]["used"], n["cores"]["total"]),
                      f"{n['tasks']['used']}/{n['tasks']['total']}", str(n["pods"]),
                      n.get("strict_signing") or "-", n["lock"] or "-")
    console.print(nodes)
    gpus = Table(title="gpus", title_justify="left")
    for col in ("NODE", "IDX", "UUID", "TYPE", "MEMORY (MiB)", "CORES (%)", "TASKS",
                "STATE", "PODS (MiB, %cores)"):
        gpus.add_column(col, overflow="fold")
    for n in view["nodes"]:
        for d in n["devices"]:
            state = "ok" if d["health"] else "unhealthy"
            if d["cordoned"]:
                state += ",cordoned"
            if d["mode"] != names.MODE_HAMI_CORE:
                state += f",{d['mode']}"
            pods = " ".join(f"{p['namespace']}/{p['name']}"
                            + (f"[{p['profile']}]" if p.get("profile") else "")
                            + f"({p['memory_mib']},{p['cores']}"
                            + ("" if p.get("signed", True) else ",unsigned") + ")"
                            for p in d["pods"]) or "-"
            gpus.add_row(n["name"], str(d["index"]), d["uuid"], d["type"],
                         _frac(d["memory_mib"]["used"], d["memory_mib"]["total"]),
                         _frac(d["cores"]["used"], d["cores"]["total"]),
                         f"{d['tasks']['used']}/{d['tasks']['total']}", state, pods)
    console.print(gpus)
    if view["unregistered"] or view["unplaced"]:
        problems = Table(title="not counted", title_justify="left")
        for col in ("OBJECT", "NODE", "REASON"):
            problems.add_column(col, overflow="fold")
        for n in view["unregistered"]:
            problems.add_row(f"node/{n['name']}", n["name"], n["reason"])
        for p in view["unplaced"]:
            problems.add_row(f"pod/{p['namespace']}/{p['name']}", p["node"], p["reason"])
        console.print(problems)
    console.print(signing_line(view), soft_wrap=True, markup=False)
    if view["quotas"]:
        quotas = Table(title="quotas", title_justify="left")
        for col in ("NAMESPACE", "MEMORY (MiB) used/limit", "CORES (%) used/limit"):
            quotas.add_column(col)
        for q in view["quotas"]:
            def lim(v: int | None) -> str:
                return "-" if v is None else str(v)
            quotas.add_row(q["namespace"],
                           f"{q['memory_mib']['used']}/{lim(q['memory_mib']['limit'])}",
                           f"{q['cores']['used']}/{lim(q['cores']['limit'])}")
        console.print(quotas)
    return buf.getvalue()
