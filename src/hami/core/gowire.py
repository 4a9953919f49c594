"""Go's text conventions that HAMi's wire formats inherit, reproduced exactly.

HAMi writes and reads its annotations with Go's ``strconv`` and ``encoding/json``; a value
is only byte-compatible if those libraries' rules are followed (HAMi v2.10). This
module holds them: integer and bool parsing with Go's error texts, ``strconv.Quote``,
``strings.TrimSpace``, ``json.Marshal`` string escaping, and a ``json.Unmarshal`` into a
declared struct shape (unknown keys ignored, keys matched case-insensitively, ``null``
leaves the zero value, integer fields take only integer literals within the Go type).
Every failure raises :class:`CodecError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Final, NoReturn, cast

__all__ = [
    "INT32",
    "INT64",
    "UINT32",
    "UINT64",
    "CodecError",
    "FieldDecoder",
    "as_bool",
    "as_int",
    "as_int_map",
    "as_list",
    "as_object",
    "as_string",
    "as_struct",
    "json_kind",
    "type_error",
    "check_range",
    "check_text",
    "top_list",
    "GoObject",
    "Shape",
    "decode_entry",
    "decode_struct",
    "go_json_string",
    "go_quote",
    "go_trim_space",
    "load_go_json",
    "parse_go_bool",
    "parse_go_int",
]

#: (name, lowest, highest) of the Go integer types on the wire.
INT32: Final = ("int32", -(2**31), 2**31 - 1)
INT64: Final = ("int", -(2**63), 2**63 - 1)
UINT32: Final = ("uint32", 0, 2**32 - 1)
UINT64: Final = ("uint", 0, 2**64 - 1)

#: Characters Go's ``unicode.IsSpace`` accepts (Python's ``str.isspace`` adds \x1c-\x1f).
_GO_SPACE: Final = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_DECIMAL: Final = re.compile(r"[+-]?[0-9]+")
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_JSON_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}
_HTML_UNSAFE: Final = frozenset("<>&\u2028\u2029")
_QUOTE_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


class CodecError(ValueError):
    """A malformed or unrepresentable annotation value; the message says what is wrong."""


class GoObject(tuple[tuple[str, object], ...]):
    """A decoded JSON object: its (key, value) pairs in document order, duplicates kept."""


#: A field decoder: (JSON value that is not null, field path for messages) -> Python value.
FieldDecoder = Callable[[object, str], object]
#: A struct shape: JSON field name (as in the Go tag) -> decoder.
Shape = Mapping[str, FieldDecoder]


def go_trim_space(text: str) -> str:
    """``strings.TrimSpace``: strip Go's Unicode white space from both ends."""
    return text.strip(_GO_SPACE)


def go_quote(text: str) -> str:
    """``strconv.Quote`` (as in Go's ``%q``): double-quoted, escapes for the unprintable."""
    return '"' + "".join(_quote_char(c) for c in text) + '"'


def _quote_char(char: str) -> str:
    if char in _QUOTE_ESCAPES:
        return _QUOTE_ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x80:
        return f"\\x{code:02x}"
    if _SURROGATE.match(char):
        return "\\ufffd"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def parse_go_int(text: str, kind: tuple[str, int, int] = INT64, func: str = "ParseInt") -> int:
    """``strconv.ParseInt(text, 10, bits)``: optional sign, ASCII digits, range of ``kind``.

    Raises :class:`CodecError` with Go's text, e.g.
    ``strconv.ParseInt: parsing "x": invalid syntax`` or ``...: value out of range``.
    """
    if not _DECIMAL.fullmatch(text):
        raise CodecError(f"strconv.{func}: parsing {go_quote(text)}: invalid syntax")
    digits = text.lstrip("+-").lstrip("0")
    value = int(digits) if 0 < len(digits) <= 30 else (0 if not digits else 2**128)
    value = -value if text.startswith("-") else value
    if not kind[1] <= value <= kind[2]:
        raise CodecError(f"strconv.{func}: parsing {go_quote(text)}: value out of range")
    return value


def parse_go_bool(text: str) -> bool:
    """``strconv.ParseBool``: ``1 t T TRUE true True`` / ``0 f F FALSE false False``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise CodecError(f"strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


def go_json_string(text: str) -> str:
    """A JSON string literal exactly as Go's ``json.Marshal`` writes it.

    Non-ASCII stays raw UTF-8; ``<``, ``>``, ``&``, U+2028 and U+2029 are ``\\u`` escaped
    (HTML-safe default); ``\\b`` and ``\\f`` use short escapes (Go >= 1.22); other control
    characters are ``\\u00xx``; lone surrogates become ``\\ufffd``.
    """
    return '"' + "".join(_json_char(c) for c in text) + '"'


def _json_char(char: str) -> str:
    if char in _JSON_ESCAPES:
        return _JSON_ESCAPES[char]
    if char < " " or char in _HTML_UNSAFE:
        return f"\\u{ord(char):04x}"
    if _SURROGATE.match(char):
        return "\\ufffd"
    return char


def load_go_json(text: str, what: str) -> object:
    """Parse JSON text; objects become :class:`GoObject`, non-integer numbers ``Decimal``.

    ``NaN``/``Infinity`` (which Go rejects) and every syntax error raise
    :class:`CodecError` naming ``what``. Lone surrogate escapes become U+FFFD as in Go.
    """
    try:
        if not _SURROGATE_ESCAPE.search(text):
            return json.loads(
                text, object_pairs_hook=GoObject, parse_float=Decimal, parse_constant=_no_constant
            )
        return _fix_surrogates(
            json.loads(
                text, object_pairs_hook=GoObject, parse_float=Decimal, parse_constant=_no_constant
            )
        )
    except CodecError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"{what}: invalid JSON: {exc}") from None


def _no_constant(name: str) -> NoReturn:
    raise CodecError(f"invalid JSON: {name} is not a JSON value")


def decode_entry(value: object, shape: Shape, go_type: str, where: str) -> dict[str, object]:
    """:func:`decode_struct` for one top-level array entry; errors are prefixed by ``where``."""
    try:
        return decode_struct(value, shape, "", go_type)
    except CodecError as exc:
        raise CodecError(f"{where}: {exc}") from None


def _fix_surrogates(value: object) -> object:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, GoObject):
        return GoObject((_SURROGATE.sub("\ufffd", k), _fix_surrogates(v)) for k, v in value)
    if isinstance(value, list):
        return [_fix_surrogates(v) for v in value]
    return value


def check_range(value: int, kind: tuple[str, int, int], what: str) -> int:
    """``value`` if it fits the Go integer ``kind`` (an encoder check), else :class:`CodecError`."""
    if not kind[1] <= value <= kind[2]:
        raise CodecError(f"{what} {value} does not fit Go {kind[0]}")
    return value


def check_text(value: str, separators: str, what: str) -> str:
    """``value`` if it holds none of ``separators`` (an encoder check), else :class:`CodecError`."""
    bad = [s for s in separators if s in value]
    if bad:
        raise CodecError(f"{what} {go_quote(value)} contains separator {bad[0]!r}")
    return value


def top_list(value: object, what: str, go_type: str) -> list[object]:
    """A decoded top-level JSON value as a Go slice: ``null`` is empty, non-arrays fail."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise CodecError(
            f"{what}: json: cannot unmarshal {json_kind(value)} into Go value of type {go_type}"
        )
    return value


def json_kind(value: object) -> str:
    """The JSON kind Go names in ``cannot unmarshal <kind> into ...`` errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | Decimal):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def type_error(value: object, path: str, go_type: str) -> CodecError:
    """Go's ``UnmarshalTypeError`` text for ``value`` landing in field ``path`` ("" = top)."""
    into = f"Go struct field {path}" if path else "Go value"
    return CodecError(f"json: cannot unmarshal {json_kind(value)} into {into} of type {go_type}")


def as_string(value: object, path: str) -> str:
    """Decoder for a Go ``string`` field."""
    if not isinstance(value, str):
        raise type_error(value, path, "string")
    return value


def as_bool(value: object, path: str) -> bool:
    """Decoder for a Go ``bool`` field."""
    if not isinstance(value, bool):
        raise type_error(value, path, "bool")
    return value


def as_int(kind: tuple[str, int, int]) -> FieldDecoder:
    """Decoder for a Go integer field of ``kind`` (integer literal within range only)."""

    def decode(value: object, path: str) -> int:
        if type(value) is not int or not kind[1] <= value <= kind[2]:
            raise type_error(value, path, kind[0])
        return value

    return decode


def as_list(element: FieldDecoder, go_type: str, *, null_element: object = None) -> FieldDecoder:
    """Decoder for a Go slice; a ``null`` element becomes ``null_element`` or is an error."""

    def decode(value: object, path: str) -> list[object]:
        if not isinstance(value, list):
            raise type_error(value, path, go_type)
        out: list[object] = []
        for i, item in enumerate(value):
            if item is None:
                if null_element is None:
                    raise CodecError(f"json: {path}[{i}] is null")
                out.append(null_element)
            else:
                out.append(element(item, f"{path}[{i}]"))
        return out

    return decode


def as_struct(shape: Shape, go_type: str) -> FieldDecoder:
    """Decoder for a nested Go struct of the given shape."""

    def decode(value: object, path: str) -> dict[str, object]:
        return decode_struct(value, shape, path, go_type)

    return decode


def as_int_map(kind: tuple[str, int, int]) -> FieldDecoder:
    """Decoder for a Go ``map[string]<int kind>``: exact keys, ``null`` values read as 0."""

    def decode(value: object, path: str) -> dict[str, int]:
        if not isinstance(value, GoObject):
            raise type_error(value, path, f"map[string]{kind[0]}")
        check = as_int(kind)
        return {k: 0 if v is None else cast(int, check(v, f"{path}[{k}]")) for k, v in value}

    return decode


def as_object(value: object, path: str) -> GoObject:
    """Decoder for a Go ``map[string]any`` field (any object is accepted)."""
    if not isinstance(value, GoObject):
        raise type_error(value, path, "map[string]interface {}")
    return value


def decode_struct(value: object, shape: Shape, path: str, go_type: str) -> dict[str, object]:
    """``json.Unmarshal`` of one object into a struct: the fields present, decoded.

    Keys match field names exactly or else case-insensitively (Go's fold, which also
    equates ``ſ`` with ``s`` and the Kelvin sign with ``k``); unknown keys are ignored; a
    ``null`` value leaves the field unset; a repeated key overwrites (maps merge).
    """
    if not isinstance(value, GoObject):
        raise type_error(value, path, go_type)
    folded = {_fold(name): name for name in shape}
    fields: dict[str, object] = {}
    for key, item in value:
        name = key if key in shape else folded.get(_fold(key))
        if name is None or item is None:
            continue
        decoded = shape[name](item, f"{go_type}.{name}")
        previous = fields.get(name)
        if isinstance(decoded, dict) and isinstance(previous, dict):
            decoded = {**previous, **decoded}
        fields[name] = decoded
    return fields


def _fold(key: str) -> str:
    return key.replace("\u017f", "s").replace("\u212a", "k").lower()
