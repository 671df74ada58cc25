"""HTML building blocks of the report: escaped tables, figures and notes, and the page around the sections.
Every value is escaped; nothing here reads files or draws."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1180px;
       padding: 0 24px 48px; color: #212121; }
h1 { margin: 24px 0 4px; } h2 { border-bottom: 2px solid #e0e0e0; padding-bottom: 4px; margin-top: 36px; }
h3 { margin: 20px 0 8px; color: #37474f; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid #e0e0e0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 6px 0; }
.note { color: #616161; font-style: italic; margin: 6px 0; }
.status { padding: 1px 8px; border-radius: 8px; font-size: 12px; background: #eeeeee; }
.status-done { background: #c8e6c9; } .status-failed { background: #ffcdd2; } .status-skipped { background: #dcedc8; }
nav a { margin-right: 12px; } .meta { color: #616161; font-size: 13px; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A cell's text: numbers rounded for people, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list | tuple):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{esc(fmt(v))}</td>' if isinstance(v, int | float) and
                        not isinstance(v, bool) else f"<td>{esc(fmt(v))}</td>" for v in row)
        body.append(f"<tr>{cells}</tr>")
    if not body:
        return ""
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of names and values, the names as row headers."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(fmt(v))}</td></tr>" for k, v in pairs)
    return f'<table class="kv"><tbody>{rows}</tbody></table>' if rows else ""


def figure(uri: str | None, alt: str, missing: str) -> str:
    """The image, or a note saying why there is none."""
    if uri is None:
        return note(missing)
    return f'<img src="{uri}" alt="{esc(alt)}">'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def status_badge(status: str) -> str:
    return f'<span class="status status-{esc(status)}">{esc(status)}</span>'


def section(sid: str, title: str, body: str, level: int = 2) -> str:
    return f'<section id="{esc(sid)}"><h{level}>{esc(title)}</h{level}>{body}</section>'


def page(title: str, meta: str, nav: Sequence[tuple[str, str]], sections: Sequence[str]) -> str:
    links = "".join(f'<a href="#{esc(sid)}">{esc(label)}</a>' for sid, label in nav)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f'<h1>{esc(title)}</h1><p class="meta">{meta}</p><nav>{links}</nav>'
            f'{"".join(sections)}</body></html>\n')
