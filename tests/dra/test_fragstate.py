"""Per-claim incremental state of DRA ``fragmentation-aware`` (:mod:`hami.dra.fragstate`):
after every change of a watch-cache-like store (an object's dict replaced on each event),
its cards and running tasks equal the full recomputation from every slice and claim."""

from __future__ import annotations

import random
from typing import Any

from hami.dra import fragscore
from hami.dra.fragstate import FragState
from tests.dra.test_fragscore import _claim, _slice


def _full(slices: list[dict[str, Any]], claims: list[dict[str, Any]]
          ) -> tuple[list[Any], dict[str, Any]]:
    cards = fragscore.cards(slices, claims)
    ref = max((c.memory_mib for c in cards), default=0)
    per_pod: dict[str, list[Any]] = {}
    for c in claims:
        if fragscore._allocated(c):
            per_pod.setdefault(fragscore._owner_uid(c), []).extend(fragscore.claim_requests(c))
    return cards, {uid: fragscore.task_of(r, ref) for uid, r in per_pod.items()}


def test_incremental_state_equals_the_full_recomputation() -> None:
    rng = random.Random(7)
    nodes = [f"n{i}" for i in range(6)]
    slices = {n: _slice(n, cards=rng.choice((1, 2, 4))) for n in nodes}
    claims: dict[str, dict[str, Any]] = {}
    state = FragState()
    for step in range(400):
        roll = rng.random()
        if roll < 0.5 or not claims:
            name = f"c{step}"
            node = rng.choice([*nodes, None])
            claims[name] = _claim(name, node, f"gpu-{rng.randint(0, 1)}",
                                  mib=rng.choice((0, 1000, 2500, 5000)),
                                  cores=rng.choice((0, 10, 30)),
                                  owner=rng.choice(("", "p1", "p2", "p3")))
        elif roll < 0.8:
            del claims[rng.choice(sorted(claims))]
        elif roll < 0.95:  # a claim allocated later: a new dict under the same name
            name = rng.choice(sorted(claims))
            claims[name] = _claim(name, rng.choice(nodes), mib=rng.choice((500, 3000)))
        else:  # a node republishes (cordons a card, or has fewer cards)
            n = rng.choice(nodes)
            slices[n] = _slice(n, cards=rng.choice((1, 2)),
                               cordon=frozenset({f"GPU-{n}-0"}) if rng.random() < 0.5
                               else frozenset())
        state.refresh(list(slices.values()), list(claims.values()))
        cards, running = _full(list(slices.values()), list(claims.values()))
        assert state.cards() == cards, step
        assert state.running == running, step


def test_an_unchanged_store_is_not_recomputed() -> None:
    slices = [_slice("n1")]
    claims = [_claim("a", "n1", mib=1000)]
    state = FragState()
    state.refresh(slices, claims)
    before = state.cards()
    state.refresh(slices, claims)
    assert state.cards() == before
    assert state.cards()[0].free_milli == 900
