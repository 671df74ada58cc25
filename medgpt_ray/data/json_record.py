"""A JSON record parsed with its nesting bounded: a line (or array element) of a data file is one JSON object,
and a value nested deeper than any of our formats is refused as an attack, not recursed into."""

from __future__ import annotations

import json

from medgpt_ray.data.readers import RecordError

MAX_JSON_DEPTH = 64  # our formats nest < 10 levels (tools schemas included); a 1,000-deep line is an attack


def too_deep(obj: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `obj` nests deeper than `limit` (iterative: a deep value must not blow the stack here either)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def parse_json_line(text: str) -> dict | RecordError:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:  # e.msg is the parser's reason; str(e) would be the same, never the text
        return RecordError(f"invalid JSON: {e.msg} (column {e.colno})", raw=text)
    except RecursionError:
        return RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", raw=text)
    if not isinstance(obj, dict):
        return RecordError(f"JSON value is a {type(obj).__name__}, not an object", raw=text)
    if too_deep(obj):
        return RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", raw=text)
    return obj
