"""The house rules of ARCHITECTURE.md, read from the import graph (every import in medgpt_ray/, also the ones
inside functions): Ray only at the edges, imports only down the layers, no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "medgpt_ray"

# Lower layers first. A module may import its own layer or a lower one; within a layer, a package may import only
# the packages listed before it in the same layer (no sideways cycles).
# generation/ (the Ray-free engine) sits below memory (which plans its decode path: generation/decode_path.py),
# trainer_kit, stages and the kinds' stage modules, which may generate with it; infer/ puts it on Ray from above.
LAYERS: list[list[str]] = [
    ["config", "templates", "tiny", "hybrid", "models", "metrics", "progress"],
    ["data", "placement", "generation", "memory", "trainer_kit", "stages", "kinds", "report"],
    ["infer", "run"],
    ["tune"],
    ["cli"],
]
# Where `import ray` may appear, and why.
RAY_ALLOWED = {
    "run": "the only package that drives Ray Train",
    "tune": "the Tune driver",
    "infer": "the generation engine on a Ray Data actor pool and Ray Serve (generation/ itself is Ray-free)",
    "data.clean": "the Ray Data cleaning pipeline (the other modules of data/ are pure)",
    "metrics": "its ray.util.metrics backend",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    p = PKG.parent / dotted.replace(".", "/")
    return p.with_suffix(".py").is_file() or p.is_dir()


def _imports(path: Path) -> set[str]:
    """Absolute names imported by the module, also inside functions (the package uses no relative imports)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            base = node.module or ""
            # `from medgpt_ray.stages import sft` imports the module medgpt_ray.stages.sft (not the package's code).
            subs = {f"{base}.{a.name}" for a in node.names
                    if base.startswith("medgpt_ray") and _is_module(f"{base}.{a.name}")}
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(base)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PKG.rglob("*.py")):
        imported = _imports(path)
        deps = {i.removeprefix("medgpt_ray.") for i in imported if i.startswith("medgpt_ray.")}
        if any(i == "ray" or i.startswith("ray.") for i in imported):
            deps.add("ray")
        graph[_module_name(path)] = deps
    return _with_kind_memory_edges(graph)


# memory/profiles.py imports each kind's memory module by the kind's registered name (importlib, no import
# statement): model those edges, so that an upward import or a cycle through them fails here too.
KIND_MEMORY_LOADER = "memory.profiles"


def _with_kind_memory_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    loaded = {m for m in graph if m.startswith("kinds.") and m.endswith(".memory") and m.count(".") == 2}
    return {m: deps | loaded if m == KIND_MEMORY_LOADER else deps for m, deps in graph.items()}


# A stage kind's files keep the layers of what they are (docs/ARCHITECTURE.md): kinds/<kind>/config.py sits with
# config/ (config/__init__ imports it to register the kind), memory.py with memory/, stage.py and the modules it is
# built from (encoding, collators) with stages/.
KIND_FILE_LAYERS = {"config": "config", "memory": "memory"}


def _top(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "kinds" and len(parts) == 3:
        return KIND_FILE_LAYERS.get(parts[2], "stages")
    return parts[0]


def _rank(module: str) -> tuple[int, int]:
    for layer_no, layer in enumerate(LAYERS):
        if _top(module) in layer:
            return layer_no, layer.index(_top(module))
    raise AssertionError(f"medgpt_ray.{module} is in no layer of ARCHITECTURE.md: add it to LAYERS")


def _ray_outside_edges(graph: dict[str, set[str]]) -> list[str]:
    return [m for m, deps in graph.items() if "ray" in deps
            and not any(m == a or m.startswith(a + ".") for a in RAY_ALLOWED)]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in graph.items():
        for dep in deps - {"ray"}:
            if _top(dep) != _top(module) and _rank(dep) > _rank(module):
                out.append(f"{module} -> {dep}")
    return sorted(out)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                found.append([*path[path.index(d):], d])
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def _kind_of(module: str) -> str | None:
    """`sft` for kinds.sft.stage; None outside a kind's package (kinds/ itself, or another package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "kinds" and len(parts) >= 2 else None


def _kind_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one kind into another, and from stages/ into any kind: what they share belongs below them."""
    out = []
    for module, deps in graph.items():
        own = _kind_of(module)
        for dep in deps:
            theirs = _kind_of(dep)
            if theirs is None or module == KIND_MEMORY_LOADER:  # the loader's edges are lookups by name
                continue
            if (own is not None and theirs != own) or module.split(".")[0] == "stages":
                out.append(f"{module} -> {dep}")
    return sorted(out)


def test_ray_is_imported_only_at_the_edges():
    assert _ray_outside_edges(_graph()) == [], f"Ray imported outside {sorted(RAY_ALLOWED)}"


def test_imports_go_down_the_layers():
    assert _upward(_graph()) == []


def test_no_kind_imports_another_and_stages_import_none():
    assert _kind_crossings(_graph()) == []


def test_no_import_cycles():
    graph = {m: deps - {"ray"} for m, deps in _graph().items()}
    assert _cycles(graph) == []


def _bench_imports(paths: list[Path]) -> list[str]:
    """Benchmarks (bench/, its peers' scripts among them) are run, never imported: a module that imports one."""
    names = {p.stem for p in (PKG.parent / "bench").rglob("*.py")} | {"bench"}
    return sorted(f"{p.relative_to(p.parents[1])}: {i}" for p in paths for i in _imports(p)
                  if i.split(".")[0] in names and not i.startswith("medgpt_ray"))


def test_the_package_imports_no_benchmark(tmp_path):
    assert _bench_imports(sorted(PKG.rglob("*.py"))) == []
    bad = tmp_path / "pkg" / "m.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from bench.peers import common\n    import ours\n")
    assert _bench_imports([bad]) == ["pkg/m.py: bench.peers", "pkg/m.py: ours"]


def test_the_rules_can_fail(tmp_path):
    """The checks see what they must: nested imports, a Ray import in stages/ or generation/, an upward import (also
    from the engine to its Ray front-ends or to the stages that use it), a cycle."""
    bad = tmp_path / "m.py"
    bad.write_text("import ray.train\nfrom medgpt_ray.run.pipeline import Pipeline\n\ndef f():\n"
                   "    from medgpt_ray.cli import main\n")
    assert {"ray.train", "medgpt_ray.run.pipeline", "medgpt_ray.cli"} <= _imports(bad)
    graph = {"stages.sft": {"ray", "run.pipeline", "memory.planner"}, "memory.planner": {"config"},
             "run.pipeline": {"stages.sft"}, "config": set(), "metrics": {"ray"}}
    assert _ray_outside_edges(graph) == ["stages.sft"]
    assert _upward(graph) == ["stages.sft -> run.pipeline"]
    assert _cycles(graph) == [["run.pipeline", "stages.sft", "run.pipeline"]]
    kinds = {"config": {"kinds.x.config"}, "kinds.x.config": {"config.registry"}, "config.registry": set(),
             "kinds.x.memory": {"kinds.x.stage"}, "kinds.x.stage": {"memory.planner"}, "memory.planner": set()}
    assert _upward(kinds) == ["kinds.x.memory -> kinds.x.stage"]  # a kind's memory terms may not build its trainer
    # The loader's edges: a kind's memory module that imports what looks the kinds up (the estimator) is a cycle.
    loader = _with_kind_memory_edges({"memory.profiles": {"config"}, "kinds.x.memory": {"memory.estimator"},
                                      "memory.estimator": {"memory.profiles"}, "config": set()})
    assert loader["memory.profiles"] == {"config", "kinds.x.memory"}
    assert _cycles(loader) == [["kinds.x.memory", "memory.estimator", "memory.profiles", "kinds.x.memory"]]
    engine = {"generation.engine": {"ray", "infer.batch", "stages.inputs", "models"}, "infer.batch": {"ray"},
              "kinds.x.stage": {"generation.engine"}, "stages.inputs": set(), "models": set()}
    assert _ray_outside_edges(engine) == ["generation.engine"]  # the engine runs in any process
    assert _upward(engine) == ["generation.engine -> infer.batch", "generation.engine -> stages.inputs"]
    # A kind importing another kind's stage, and stages/ importing a kind (even inside a function), both fail; a
    # kind's own modules, the kinds/ root and the memory loader's lookups by name do not.
    crossings = {"kinds.kto.stage": {"kinds.dpo.stage", "kinds.kto.config", "stages.inputs"},
                 "stages.length_profile": {"kinds.sft.stage"}, "kinds.eval.stage": {"kinds.eval.scores"},
                 "memory.profiles": {"kinds.grpo.memory"}, "kinds.rloo.memory": {"memory.online_rl"}}
    assert _kind_crossings(crossings) == ["kinds.kto.stage -> kinds.dpo.stage",
                                          "stages.length_profile -> kinds.sft.stage"]


def test_the_clean_command_does_not_import_torch():
    """`medgpt-ray clean` runs on data nodes without the training stack loaded (it used to, through pipeline.py)."""
    import subprocess
    import sys

    code = ("import sys, medgpt_ray.cli, medgpt_ray.cli.clean, medgpt_ray.data.clean, medgpt_ray.run.ray_env; "
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent, env={**__import__("os").environ, "PYTHONPATH": str(PKG.parent)})
    assert out.stdout.strip() == "[]"
