"""Hostile values for every field of an OpenAPI operation (``test_hostile_inputs``).

``slots(openapi, operation)`` walks an operation's request body schema (``$ref``, ``anyOf``,
arrays, mappings) and its parameters, and yields one ``Slot`` per field: where it is (``body``,
``query``, ``path``), its path, and its schema. ``hostile(slot)`` gives the values of each kind that
the field's schema refuses: a lone surrogate and bytes that are not UTF-8 in a string (and a
mapping's key), one character more than ``maxLength``, an integer past ``maximum`` / ``minimum``
and past int64, one item more than ``maxItems`` / ``maxProperties``, NaN and Infinity.
``put(body, path, value)`` writes a value at a path, creating what is missing on the way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

INT64 = 2**63 - 1
BYTES = "\x01not-utf8\x01"  # replaced by b"\xff\xfe" in the encoded body (``encode``)
TOO_MANY = 200_000  # a list or mapping bound above this is left to the request size (64 MiB)
TOO_LONG = 10_000_000  # likewise for a string


@dataclass(frozen=True)
class Slot:
    """A field: ``where`` (``body``, ``query``, ``path``), ``path`` (keys and indices inside the
    body, or the parameter's name), its resolved ``schema``, and ``owner``: the component and the
    path inside it, which names the field once across operations."""

    where: str
    path: tuple[Any, ...]
    schema: dict[str, Any]
    owner: tuple[Any, ...]
    pins: tuple[tuple[tuple[Any, ...], Any], ...] = ()  # (path, value): a union branch's tag

    @property
    def loc(self) -> tuple[Any, ...]:
        return (self.where, *self.path)


@dataclass(frozen=True)
class Value:
    """One hostile value of ``kind``; ``key``: it replaces a mapping's key, not a value."""

    kind: str
    value: Any
    key: bool = False


def _resolve(openapi: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    name = None
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = openapi["components"]["schemas"][name]
    return schema, name


def _walk(openapi: dict[str, Any], schema: dict[str, Any], path: tuple[Any, ...], owner: tuple[Any, ...],
          stack: frozenset[str], pins: tuple[Any, ...] = ()) -> Iterator[Slot]:  # fmt: skip
    schema, name = _resolve(openapi, schema)
    if name is not None:
        if name in stack:
            return
        stack, owner = stack | {name}, (name,)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = [b for b in schema.get(key, []) if b.get("type") != "null"]
        for branch in branches:
            shape = _resolve(openapi, branch)[0].get("type")
            # a union of containers: the base's value (of another branch) is replaced by an empty one
            fresh = {"object": {}, "array": []}.get(str(shape)) if len(branches) > 1 else None
            branch_pins = pins if fresh is None else (*pins, (path, fresh))
            yield from _walk(openapi, branch, path, owner, stack, branch_pins)
    kind = schema.get("type")
    if kind is None:
        return
    yield Slot("body", path, schema, owner, pins)
    if kind == "object":
        props = schema.get("properties", {})
        pins = (*pins, *(((*path, p), sub["const"]) for p, sub in props.items() if "const" in sub))
        for prop, sub in props.items():
            yield from _walk(openapi, sub, (*path, prop), (*owner, prop), stack, pins)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            key = schema.get("propertyNames", {}).get("enum", ["k"])[0]  # a key the mapping allows
            yield from _walk(openapi, extra, (*path, key), (*owner, "{}"), stack, pins)
    elif kind == "array" and isinstance(schema.get("items"), dict):
        yield from _walk(openapi, schema["items"], (*path, 0), (*owner, "[]"), stack, pins)


def slots(openapi: dict[str, Any], method: str, route: str) -> list[Slot]:
    """Every field of operation ``method route``: its parameters, then its body's."""
    operation = openapi["paths"][route][method]
    out = []
    for param in operation.get("parameters", []):
        schema, _ = _resolve(openapi, param["schema"])
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") not in (None, "null"):
                out.append(Slot(param["in"], (param["name"],), branch, (route, param["name"])))
    for content in operation.get("requestBody", {}).get("content", {}).values():
        out.extend(_walk(openapi, content["schema"], (), (route,), frozenset()))
    return out


def hostile(slot: Slot) -> list[Value]:
    """The values of every kind ``slot``'s schema must refuse (empty for a kind it does not have)."""
    s = slot.schema
    kind = s.get("type")
    out: list[Value] = []
    if kind == "string":
        if s.get("format") in ("date-time", "binary"):
            return out
        out += [Value("surrogate", "\ud800"), Value("bytes", BYTES)]
        if "enum" not in s and "const" not in s:
            limit = s["maxLength"]
            if limit < TOO_LONG:
                out.append(Value("too-long", "a" * (limit + 1)))
    elif kind == "integer":
        if float(s["maximum"]) < float(INT64):
            out.append(Value("over-maximum", int(s["maximum"]) + 1))
        out.append(Value("over-int64", INT64 + 1))
        if float(s["minimum"]) > float(-INT64):
            out.append(Value("under-minimum", int(s["minimum"]) - 1))
        out.append(Value("under-int64", -INT64 - 2))
    elif kind == "number":
        out += [Value("nan", float("nan")), Value("infinity", float("inf"))]
    elif kind == "array" and s["maxItems"] <= TOO_MANY:
        out.append(Value("too-many-items", [_item(s.get("items", {}))] * (s["maxItems"] + 1)))
    elif kind == "object" and isinstance(s.get("additionalProperties"), dict):
        if s["maxProperties"] <= TOO_MANY:
            out.append(Value("too-many-keys", {f"k{i}": None for i in range(s["maxProperties"] + 1)}))
        out.append(Value("surrogate-key", "\ud800", key=True))
        key_limit = s.get("propertyNames", {}).get("maxLength")
        if key_limit is not None:
            out.append(Value("too-long-key", "k" * (key_limit + 1), key=True))
    return out


def missing_bound(slot: Slot) -> str | None:
    """What bound ``slot``'s schema lacks (None: bounded): a string's ``maxLength``, an integer's
    ``minimum`` and ``maximum`` within int64, a list's ``maxItems``, a mapping's ``maxProperties``
    and its keys' ``maxLength``."""
    s = slot.schema
    kind = s.get("type")
    if kind == "string" and not ({"enum", "const"} & s.keys()) and s.get("format") != "date-time":
        return None if "maxLength" in s else "maxLength"
    if kind == "integer":  # FastAPI's OpenAPI model holds bounds as floats: int64's shows as 2.0**63
        ok = float(-INT64) <= float(s.get("minimum", -math.inf)) and float(
            s.get("maximum", math.inf)
        ) <= float(INT64)
        return None if ok else f"minimum/maximum within int64 (has {s.get('minimum')}, {s.get('maximum')})"
    if kind == "array":
        return None if "maxItems" in s else "maxItems"
    if kind == "object" and isinstance(s.get("additionalProperties"), dict):
        keys = s.get("propertyNames", {})
        if "maxProperties" not in s:
            return "maxProperties"
        return None if "maxLength" in keys or "enum" in keys else "propertyNames.maxLength"
    return None


def _item(schema: dict[str, Any]) -> Any:
    return {"integer": 0, "number": 0.0, "string": "x", "boolean": False}.get(schema.get("type", ""), {})


def put(body: Any, path: tuple[Any, ...], value: Any, *, key: bool = False) -> Any:
    """``body`` with ``value`` at ``path``, ``body`` left as it is (containers made on the way: a
    list for an int step, whose item 0 is written, a dict for a str step). ``key``: the mapping at
    ``path`` becomes ``{value: <its first value, or {}>}``."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    if isinstance(step, int):
        items = list(body) if isinstance(body, list) and body else [None]
        items[0] = put(items[0], rest, value, key=key)
        return items
    obj = dict(body) if isinstance(body, dict) else {}
    if not rest and key:
        inner = obj.get(step)
        obj[step] = {value: next(iter(inner.values())) if isinstance(inner, dict) and inner else {}}
    else:
        obj[step] = put(obj.get(step), rest, value, key=key)
    return obj


def encode(body: Any) -> bytes:
    """``body`` as the bytes of a JSON request (``ensure_ascii``: a lone surrogate is a ``\\ud800``
    escape; NaN and Infinity as Python's json writes them), with ``BYTES`` as raw ``\\xff\\xfe``."""
    text = json.dumps(body)
    return text.encode().replace(json.dumps(BYTES).encode(), b'"\xff\xfe"')


def naming_errors(detail: Any, slot: Slot, *, up_to: int = 0) -> list[dict[str, Any]]:
    """The errors of a 422's ``detail`` whose ``loc`` holds ``slot.loc`` in order (a union
    branch's tag may stand between its parts); ``up_to``: or ``slot.loc`` less its last ``up_to``
    parts (a bound checked on the whole that holds the field)."""
    if not isinstance(detail, list):
        return []
    out = []
    for error in detail:
        for cut in range(up_to + 1):
            want = [str(p) for p in slot.loc[: len(slot.loc) - cut]]
            have = iter(str(p) for p in error.get("loc", []))
            if len(want) > 1 and all(any(part == got for got in have) for part in want):
                out.append(error)
                break
    return out
