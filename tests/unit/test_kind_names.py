"""No module outside kinds/ mentions a stage kind by name (docs/ARCHITECTURE.md, "The stage-kind contract"): memory/,
run/, tune/, stages/, report/ and cli/ ask the kind's registry entry (config.StageKind) what the kind does instead of
comparing its name. Read from the source: every string constant in medgpt_ray/ equal to a registered kind's name is
a finding, outside kinds/ and the registry itself, except these uses of the same words that are no kind's name:

- the `return_tensors` keyword ("pt": PyTorch tensors),
- the train/eval mode of a conditional expression (`"train" if training else "eval"`),
- the one definition of the stage result's held-out metrics key (stages/outputs.HELD_OUT = "eval"),
- a tuple of TRL's own `loss_type` values, assigned to a name ending in `_LOSS_TYPES` (CPO's "simpo"),
- in data/, the data layer's own vocabulary declared in data/kinds.py: data kinds (sft) and source formats (grpo).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from medgpt_ray.config import STAGE_KINDS
from medgpt_ray.data.kinds import KIND_FORMATS

PKG = Path(__file__).resolve().parents[2] / "medgpt_ray"

# Where kind names belong: the kinds' own folders and the registry.
OWNERS = ("kinds/", "config/registry.py")
# Paths still naming kinds while they move into kinds/ (none left since issue 33). Each must still hold a name while
# it is listed here (a test below).
PENDING: tuple[str, ...] = ()

HELD_OUT_MODULE, HELD_OUT_NAME = "stages.outputs", "HELD_OUT"  # where the result's held-out metrics key is defined
MODES = {"train", "eval"}
DATA_VOCABULARY = set(KIND_FORMATS) | {fmt for formats in KIND_FORMATS.values() for fmt in formats}


def _module(rel: str) -> str:
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _allowed(node: ast.Constant, parent: ast.AST, grandparent: ast.AST | None, module: str) -> bool:
    if isinstance(parent, ast.keyword) and parent.arg == "return_tensors":
        return True
    if (isinstance(parent, ast.IfExp) and node is not parent.test
            and all(isinstance(arm, ast.Constant) and arm.value in MODES for arm in (parent.body, parent.orelse))):
        return True
    if (isinstance(parent, ast.Tuple) and isinstance(grandparent, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id.endswith("_LOSS_TYPES") for t in grandparent.targets)):
        return True
    if isinstance(parent, ast.Assign) and isinstance(grandparent, ast.Module):
        targets = [t.id for t in parent.targets if isinstance(t, ast.Name)]
        if (module, targets) == (HELD_OUT_MODULE, [HELD_OUT_NAME]):
            return True
    return module.split(".")[0] == "data" and node.value in DATA_VOCABULARY


def kind_names_in(source: str, module: str, kinds: set[str] | None = None) -> list[str]:
    """`line: 'name'` for each string constant of `source` (module `module`, dotted, under medgpt_ray) that names a
    stage kind and is none of the allowed uses."""
    kinds = set(STAGE_KINDS) if kinds is None else kinds
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds:
            parent = parents[node]
            if not _allowed(node, parent, parents.get(parent), module):
                found.append((node.lineno, node.value))
    return [f"{line}: {name!r}" for line, name in sorted(found)]


def _files(prefixes: tuple[str, ...]) -> list[str]:
    rels = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py"))
    return [r for r in rels if r.startswith(prefixes)]


def _findings(rel: str) -> list[str]:
    return kind_names_in((PKG / rel).read_text(encoding="utf-8"), _module(rel))


def test_no_module_outside_kinds_names_a_kind():
    checked = [r for r in _files(("",)) if not r.startswith(OWNERS + PENDING)]
    assert len(checked) > 100  # the walk found the package
    found = {rel: hits for rel in checked if (hits := _findings(rel))}
    assert not found, ("stage kinds named outside kinds/ (ask the kind's StageKind entry instead, "
                       f"docs/ARCHITECTURE.md): {found}")


def test_pending_exemptions_are_still_needed():
    """A PENDING path that no longer names a kind (or is gone: moved into kinds/) is dropped from PENDING, so that
    the test covers it from then on."""
    for prefix in PENDING:
        files = _files((prefix,))
        assert any(_findings(r) for r in files), f"{prefix} names no stage kind any more: drop it from PENDING"


@pytest.mark.parametrize("source", [
    'if stage == "sft":\n    pass\n',
    'x = needs["rm"]\n',
    'p.add_argument("--stage", choices=["pt", "sft"])\n',
    'f(stage="grpo")\n',
    'HELD_OUT = "eval"\n',  # the held-out key's definition is allowed only where it is defined
    'mode = "train" if training else "dpo"\n',
    'AVERAGED = ("ipo", "simpo")\n',  # TRL's loss types only under a *_LOSS_TYPES name
    'if loss_type in ("ipo", "simpo"):\n    pass\n',
])
def test_the_check_flags_a_kind_named(source):
    assert kind_names_in(source, "run.example")


@pytest.mark.parametrize(("source", "module"), [
    ('batch = tok(texts, return_tensors="pt")\n', "stages.example"),
    ('mode = "train" if model.training else "eval"\n', "trainer_kit.example"),
    ('HELD_OUT = "eval"\n', "stages.outputs"),
    ('if kind == "sft":\n    pass\n', "data.example"),  # the data kind sft
    ('READERS = {"grpo": read}\n', "data.readers"),  # the source format grpo
    ('text = "sft and rm stages"\n', "run.example"),  # prose naming kinds is no comparison with a name
    ('AVERAGED_LOSS_TYPES = ("ipo", "simpo")\n', "trainer_kit.example"),  # TRL's CPO loss types
])
def test_the_check_allows_the_non_kind_uses(source, module):
    assert kind_names_in(source, module) == []


def test_the_data_layer_may_not_name_a_stage_kind_of_its_own():
    assert kind_names_in('if kind == "rm":\n    pass\n', "data.example") == ["1: 'rm'"]


def config_probes_in(source: str) -> list[str]:
    """getattr/hasattr on a stage config (`cfg`, `c`, `config`, `….cfg`, `….stages.get(…)`): a kind's key read by
    probing the base class instead of through the kind's own config class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            if ((isinstance(target, ast.Name) and target.id in ("cfg", "c", "config", "stage_cfg"))
                    or (isinstance(target, ast.Attribute) and target.attr == "cfg")
                    or (isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute)
                        and target.func.attr == "get")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_a_stage_config_for_a_key():
    """StagesConfig.get() returns the base class; a kind's own keys are read through its class (isinstance, or the
    kind's own module, e.g. kinds/<kind>/memory.py), never by getattr (issue 33)."""
    found = {r: hits for r in _files(("",)) if (hits := config_probes_in((PKG / r).read_text(encoding="utf-8")))}
    assert not found, f"config probed with getattr/hasattr: {found}"


@pytest.mark.parametrize("source", ['x = getattr(cfg, "packing", False)', 'hasattr(c, "num_generations")',
                                    'getattr(inp.cfg, "kl_batch", False)',
                                    'getattr(cfg.stages.get(s), "reward_model_gpu", False)'])
def test_the_probe_check_flags_a_probe(source):
    assert config_probes_in(source)
