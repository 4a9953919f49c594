"""Are two ``hami simulate --json`` documents the same decisions? Equal apart from the
times (every ``seconds`` key), policy by policy.

Usage (e.g. before and after a change that must not change a decision)::

    PYTHONPATH=old/src hami simulate --trace T --workload W --seeds 42 --json > a.json
    PYTHONPATH=new/src hami simulate --trace T --workload W --seeds 42 --json > b.json
    python bench/compare_simulate.py a.json b.json [more pairs ...]

Prints one line per pair and policy; exits 1 when any differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def without_times(doc: Any) -> Any:
    """``doc`` with every ``seconds`` key removed, at any depth."""
    if isinstance(doc, dict):
        return {k: without_times(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [without_times(v) for v in doc]
    return doc


def compare(a: Path, b: Path) -> bool:
    """Print whether each policy of ``a`` and ``b`` is identical; True if all are."""
    left, right = (without_times(json.loads(p.read_text())) for p in (a, b))
    same = True
    for policy in sorted(set(left["policies"]) | set(right["policies"])):
        equal = left["policies"].get(policy) == right["policies"].get(policy)
        same &= equal
        print(f"{a.name} vs {b.name}  {policy:24s} {'identical' if equal else 'DIFFERENT'}")
    rest = {k: v for k, v in left.items() if k != "policies"}
    if rest != {k: v for k, v in right.items() if k != "policies"}:
        print(f"{a.name} vs {b.name}  settings or reference DIFFERENT")
        same = False
    return same


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    pairs = zip(argv[::2], argv[1::2], strict=True)
    results = [compare(Path(a), Path(b)) for a, b in pairs]
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
