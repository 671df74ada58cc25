"""The GPU's measured peaks of the kinds issue 49 moved onto chunked losses (orpo, simpo, opd), re-scored by today's
estimator from each committed run's own plan: never below the measured peak and within max(10 %, 0.5 GiB) of it.
The runs (bench/results/, their commands inside): orpo and simpo on TRL's chunked head, every micro-batch 32 rows
of 1,024 tokens; opd on the chunked JSD with the run's sft as teacher, on real-length data and on the 64 widest
conversations (every micro-batch as wide as the plan prices it); opd with a 7B teacher in NF4. A change to a term
these plans read (the kinds' activation scales, opd's teacher and divergence moments) that moves a prediction out of
that band fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import load_config
from medgpt_ray.memory import generation
from medgpt_ray.memory.shapes import load_shape
from medgpt_ray.memory.stage_plan import StagePlan
from tests.unit.test_opd_kind import write_teacher

RUNS = [  # (result file, its stage, the teacher's preset where it is a directory of random weights)
    ("orpo_simpo_chunked_h100/real_length_throughput.json", "orpo", None),
    ("orpo_simpo_chunked_h100/real_length_throughput.json", "simpo", None),
    ("orpo_simpo_16steps_h100/real_length_throughput.json", "orpo", None),
    ("orpo_simpo_16steps_h100/real_length_throughput.json", "simpo", None),
    ("simpo_compiled_h100/real_length_throughput.json", "simpo", None),  # compiled layers
    ("orpo_compiled_h100/real_length_throughput.json", "orpo", None),
    ("opd_peaks_h100/rl_stage_run.json", "opd", None),
    ("opd_chunked_h100/rl_stage_run.json", "opd", None),
    ("opd_7b_nf4_teacher_h100/rl_stage_run.json", "opd", "qwen2.5-7b"),
    ("opd_7b_nf4_teacher_h100/rl_stage_run_12steps.json", "opd", "qwen2.5-7b"),
]


def measured_and_rescored(repo: Path, tmp_path: Path, name: str, stage: str, teacher: str | None
                          ) -> tuple[float, float]:
    doc = json.loads((repo / "bench" / "results" / name).read_text())
    if "runs" in doc:  # real_length_throughput.py: one run per stage
        run = next(r for r in doc["runs"] if r["stage"] == stage)
        sets, plan_doc, measured = run["sets"], run["plan"], run["measured_peak_gib"]
    else:  # rl_stage_run.py
        sets, plan_doc, measured = doc["sets"], doc["stages"][stage]["plan"], doc["stages"][stage]["measured_peak_gib"]
    kept = [s for s in sets if not s.startswith(("model.path=", "data.", "output_dir=", "stages.opd.teacher="))]
    if stage == "opd":
        kept.append(f"stages.opd.teacher={write_teacher(tmp_path / 'teacher', teacher) if teacher else 'sft'}")
    cfg = load_config(str(repo / "configs" / Path(doc["config"]).name), kept)
    fields = {k: v for k, v in plan_doc.items() if k in StagePlan.__dataclass_fields__}
    plan = StagePlan(**{**fields, "reasons": [], "alternatives": []})
    setup = plan.train_setup(cfg.stages.get(stage))
    return measured, generation.peak(load_shape("qwen2.5-1.5b"), setup).peak_gib


@pytest.mark.parametrize(("name", "stage", "teacher"), RUNS, ids=[f"{n.split('/')[0]}:{s}" for n, s, _ in RUNS])
def test_the_measured_peak_is_within_todays_plan(repo, tmp_path, name, stage, teacher):
    measured, predicted = measured_and_rescored(repo, tmp_path, name, stage, teacher)
    assert measured <= predicted <= measured + max(0.1 * measured, 0.5), (measured, predicted)
