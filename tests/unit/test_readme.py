"""README.md is the front door (issue 48): at most 300 lines, and every relative link in it resolves, to a file or
directory of the checkout and, where it names one, to a heading of the Markdown file it points at."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, `-`, `_` and spaces kept),
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside fenced code), a repeated one numbered as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(md: Path) -> list[str]:
    """Every link target of a Markdown file outside fenced code, in order."""
    out: list[str] = []
    fenced = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.extend(LINK.findall(line))
    return out


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `md` whose file is missing, or whose #anchor is no heading of the Markdown file
    (named relative to `root`)."""
    broken = []
    for target in links(md):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading in {dest.relative_to(root)})")
    return broken


def test_readme_is_at_most_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move detail into docs/"


def test_readme_relative_links_resolve():
    assert links(README), "no links found: the link pattern is wrong"
    assert broken_links(README) == []


def test_slug_follows_github():
    assert slug("Explicit values, the budget, `medgpt-ray plan` and `medgpt-ray estimate`") == \
        "explicit-values-the-budget-medgpt-ray-plan-and-medgpt-ray-estimate"
    assert slug("Records longer than seq_len: truncated or skipped, never silently") == \
        "records-longer-than-seq_len-truncated-or-skipped-never-silently"


def test_broken_links_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n```\n# not a heading\n```\n", encoding="utf-8")
    md = tmp_path / "b.md"
    md.write_text("[ok](a.md#title) [gone](nope.md) [bad](a.md#not-a-heading) [web](https://x.org/y)\n",
                  encoding="utf-8")
    assert broken_links(md, tmp_path.resolve()) == ["nope.md (no such file)",
                                                    "a.md#not-a-heading (no such heading in a.md)"]
