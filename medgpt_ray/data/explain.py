"""`medgpt-ray clean --explain N`: up to N quarantined records per reason, to see what a filter drops.

Reads the cleaner's quarantine files (DIR/quarantine/part-*.jsonl, in record order). What they hold decides
what may be shown: records that parsed are stored PII-redacted (canonical, or the source row when it could
not be converted) and are shown, shortened; lines that did not parse are kept raw in the 0600 quarantine
and are shown only as file:line and reason, never their text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

MAX_FIELD_CHARS = 160


def reason_group(dropped_by: str, reason: str) -> str:
    """"<operator>:<reason>" as the report counts it: dedup reasons lose the id they point at, reader reasons
    their positions ("column 17", "turn 3: ...") so that messages of one kind group together."""
    if dropped_by == "dedup":
        return f"dedup:{reason.split(':', 1)[0]}"
    if dropped_by == "reader":
        return f"reader:{reason.split(' (', 1)[0].split(':', 1)[0]}"
    return f"{dropped_by}:{reason}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + "…"


def _record_lines(record: object) -> list[str]:
    """A canonical record as a few readable lines (role: text); anything else as shortened JSON."""
    if isinstance(record, dict) and isinstance(record.get("conversations"), list):
        # Canonical turns, or a source row's ShareGPT turns (a record the reader could not convert).
        lines = [f"{t.get('role', t.get('from', '?'))}: {_short(str(t.get('content', t.get('value', ''))))}"
                 for t in record["conversations"] if isinstance(t, dict)]
        lines += [f"{key}: {_short(str(record[key]))}" for key in ("chosen", "rejected", "answer")
                  if record.get(key) is not None]
        if record.get("tools"):
            lines.append(f"tools: {_short(json.dumps(record['tools'], ensure_ascii=False))}")
        return lines
    if isinstance(record, dict) and set(record) == {"text"}:
        return [f"text: {_short(str(record['text']))}"]
    return [_short(json.dumps(record, ensure_ascii=False))]


def _quarantined(quarantine_dir: Path) -> Iterator[dict]:
    for part in sorted(quarantine_dir.glob("part-*.jsonl")):
        with part.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def explain(quarantine_dir: Path, per_reason: int) -> list[str]:
    """Lines to print: for each reason (in order of first appearance), up to `per_reason` examples."""
    shown: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for row in _quarantined(Path(quarantine_dir)):
        group = reason_group(row["dropped_by"], row["reason"])
        counts[group] = counts.get(group, 0) + 1
        examples = shown.setdefault(group, [])
        if len(examples) >= per_reason:
            continue
        where = f"{row['source_file']}:{row['source_line']}"
        if row.get("record") is None:  # never parsed: its raw text stays in the quarantine file only
            examples.append(f"  {where}  (unparseable line; reason: {row['reason']})")
            continue
        body = "\n".join(f"      {line}" for line in _record_lines(json.loads(row["record"])))
        examples.append(f"  {where}  ({row['reason']})\n{body}")
    out: list[str] = []
    for group, examples in shown.items():
        out.append(f"[explain] {group}: {counts[group]} quarantined, showing {len(examples)}")
        out.extend(examples)
    return out or ["[explain] nothing was quarantined"]
