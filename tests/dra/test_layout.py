"""DRA mode's modules stay small (the project's ~400-line rule, docs/architecture.md), the
names other modules and tests import from the modules that were split stay importable,
and the modules share one reader of possibly malformed object fields
(:func:`hami.core.podobjects.mapping_or_empty`) instead of private copies."""

from __future__ import annotations

import ast
from pathlib import Path

import hami.dra

MAX_LINES = 400
PACKAGE = Path(hami.dra.__file__).parent


def test_no_dra_module_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(PACKAGE.glob("*.py"))}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"split these along the domain (docs/architecture.md): {over}"


def test_split_modules_keep_what_their_callers_use() -> None:
    """The webhook still reads the cluster through the methods its checks call
    (:mod:`hami.dra.claimquota`, :mod:`hami.dra.namedclaims`), and ``booking`` still
    counts with hami's shape (each the defining module's object, not a copy)."""
    from hami.dra import booking, quotaview, specshape, webhook

    for name in ("published", "published_devices", "namespace_ledger"):
        assert getattr(webhook.DraWebhook, name) is getattr(quotaview.QuotaView, name)
    assert booking.hami_shaped is specshape.hami_shaped
    assert webhook.claim_booking is booking.claim_booking


def test_no_dra_module_defines_its_own_field_reader() -> None:
    """A function whose whole body is ``return x if isinstance(x, Mapping|list) else
    {}|[]`` is :func:`~hami.core.podobjects.mapping_or_empty` or
    :func:`~hami.core.podobjects.list_or_empty` again."""
    copies = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or len(node.body) != 1:
                continue
            ret = node.body[0]
            if (isinstance(ret, ast.Return) and isinstance(ret.value, ast.IfExp)
                    and isinstance(ret.value.test, ast.Call)
                    and getattr(ret.value.test.func, "id", "") == "isinstance"
                    and isinstance(ret.value.orelse, ast.Dict | ast.List)
                    and not (ret.value.orelse.keys if isinstance(ret.value.orelse, ast.Dict)
                             else ret.value.orelse.elts)):
                copies.append(f"hami.dra.{path.stem}.{node.name}")
    assert not copies, f"use hami.core.podobjects' readers: {copies}"
