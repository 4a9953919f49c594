"""Node pair-score and device-scoring-weights annotation values (HAMi v2.10).

Pure; part of :mod:`hami.core.codec`, which re-exports everything public here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

from hami.api.names import DEVICE_SCORING_WEIGHTS
from hami.core.gowire import (
    INT64,
    CodecError,
    as_int_map,
    as_string,
    decode_entry,
    go_quote,
    go_trim_space,
    load_go_json,
    parse_go_int,
    top_list,
)

__all__ = [
    "ScoringWeights",
    "decode_node_scores",
    "parse_scoring_weights",
]

# --- node pair scores (HAMi v2.10) ------------------------------------------------------

_PAIR_SCORE: Final = {"uuid": as_string, "score": as_int_map(INT64)}


def decode_node_scores(value: str) -> dict[str, dict[str, int]]:
    """Decode ``hami.io/node-nvidia-score`` (``[{"uuid":"GPU-a","score":{"GPU-b":200}}]``).

    Returns ``{uuid: {peer uuid: score}}``; when a uuid appears twice the first entry wins
    (HAMi takes the first match). Scores are Go ``int`` (int64). ``null`` is ``{}``.
    Raises :class:`CodecError` for bad JSON or types.
    """
    items = top_list(
        load_go_json(value, "node score annotation"),
        "node score annotation",
        "device.DevicePairScores",
    )
    scores: dict[str, dict[str, int]] = {}
    for i, item in enumerate(items):
        fields = (
            {}
            if item is None
            else decode_entry(item, _PAIR_SCORE, "DevicePairScore", f"node score entry {i}")
        )
        scores.setdefault(
            cast(str, fields.get("uuid", "")), cast(dict[str, int], fields.get("score", {}))
        )
    return scores


# --- device scoring weights (HAMi v2.10) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Weights of the slot, core and memory terms of the device score (HAMi v2.10), int64 >= 0."""

    slot: int = 1
    core: int = 1
    memory: int = 1


def parse_scoring_weights(value: str) -> ScoringWeights:
    """Parse ``hami.io/device-scoring-weights`` (``slot=1,core=1,memory=3``, HAMi v2.10).

    Exactly three ``,`` entries of ``key=value`` (blanks trimmed, any order), keys
    ``slot``/``core``/``memory``, int64 values >= 0, not all zero. An absent annotation
    means :class:`ScoringWeights` ``()`` (1, 1, 1); a present empty one is an error.

    Raises :class:`CodecError` with HAMi's text, ``invalid hami.io/device-scoring-weights
    annotation "<value>": `` followed by ``expected slot, core, and memory weights``,
    ``expected key=value entries``, ``duplicate "<k>" weight``, ``"<k>" weight must be an
    integer``, ``"<k>" weight must not be negative``, ``unknown weight "<k>"`` or ``at
    least one weight must be positive`` (checked in that order per entry).
    """
    prefix = f"invalid {DEVICE_SCORING_WEIGHTS} annotation {go_quote(value)}: "
    parts = value.split(",")
    if len(parts) != 3:
        raise CodecError(prefix + "expected slot, core, and memory weights")
    weights: dict[str, int] = {}
    for part in parts:
        key, eq, text = go_trim_space(part).partition("=")
        if not eq:
            raise CodecError(prefix + "expected key=value entries")
        key = go_trim_space(key)
        if key in weights:
            raise CodecError(prefix + f"duplicate {go_quote(key)} weight")
        try:
            weight = parse_go_int(go_trim_space(text))
        except CodecError:
            raise CodecError(prefix + f"{go_quote(key)} weight must be an integer") from None
        if weight < 0:
            raise CodecError(prefix + f"{go_quote(key)} weight must not be negative")
        if key not in ("slot", "core", "memory"):
            raise CodecError(prefix + f"unknown weight {go_quote(key)}")
        weights[key] = weight
    if not any(weights.values()):
        raise CodecError(prefix + "at least one weight must be positive")
    return ScoringWeights(**weights)
