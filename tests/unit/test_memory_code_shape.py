"""memory/ meets issue 33's tightened house rules already (ARCHITECTURE.md): no module over 300 lines, no function
over 60, by a unit per job (profiles, setup, activations, estimator; options, candidates, no_fit, plan_build)."""

from __future__ import annotations

import ast
from pathlib import Path

import medgpt_ray.memory as memory_pkg

MEMORY_DIR = Path(memory_pkg.__file__).parent


def test_memory_modules_and_functions_are_within_300_and_60_lines():
    long = {}
    for p in sorted(MEMORY_DIR.glob("*.py")):
        text = p.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > 300:
            long[p.name] = n
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long[f"{p.name}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert not long, f"split these: {long}"
