"""The house rules on size (docs/ARCHITECTURE.md): small modules with one job each, functions that fit on a screen
(300 and 60 lines since issue 33, met by a unit per job, never by joining lines: ruff's line length is unchanged)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "medgpt_ray"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60


def test_no_module_over_300_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not long, f"split these modules: {long}"


def test_no_function_over_60_lines():
    long = {}
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = n
    assert not long, f"split these functions: {long}"
