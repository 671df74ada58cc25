"""Done means for opd (issue 33): on the tiny CPU model, the teacher is the run's sft stage, trained until its
held-out loss is clearly below the base model's; the student starts from the base model; after the opd stage
(configs/tiny-cpu-opd.yaml) the generalized JSD at the configured beta, per answer token, on the held-out SFT
conversations' reference answers, is at least 30 % lower than before. The JSD is measured here, one conversation at a
time (no padding), with TRL's own generalized_jsd_loss."""

from __future__ import annotations

import time

from medgpt_ray import models, templates
from medgpt_ray.config import load_config
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.shards import read_records
from medgpt_ray.kinds.opd.data import encode_prompt_answer
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs


def held_out_measures(student_dir, teacher_dir, rows, beta: float) -> tuple[float, float]:
    """(the student's cross-entropy per answer token, the generalized JSD(beta) to the teacher per answer token)."""
    import torch
    from trl.experimental.gkd import GKDTrainer

    student = models.load_causal_lm(student_dir, "fp32", "full").eval()
    teacher = models.load_causal_lm(teacher_dir, "fp32", "full").eval()
    ce = jsd = 0.0
    tokens = 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            labels = ids.clone()
            labels[:, :row["prompt_len"]] = -100
            s, t = student(input_ids=ids).logits[:, :-1], teacher(input_ids=ids).logits[:, :-1]
            target = labels[:, 1:]
            n = int((target != -100).sum())
            ce += float(torch.nn.functional.cross_entropy(s[0], target[0], ignore_index=-100, reduction="sum"))
            jsd += float(GKDTrainer.generalized_jsd_loss(s, t, target, beta=beta, reduction="sum"))
            tokens += n
    return ce / tokens, jsd / tokens


def test_opd_distils_the_sft_teacher_into_the_base_model(repo, tiny_model, tmp_path, one_torch_thread):
    cfg = load_config(repo / "configs/tiny-cpu-opd.yaml")
    assert cfg.stages.get("opd").needs == ["sft"] and cfg.start_of("opd") is None  # teacher sft, student the base
    t0 = time.monotonic()
    data = prepare_kind("sft", [str(repo / p) for p in cfg.data.paths("sft")], tmp_path / "sft",
                        cfg.data.eval_fraction)
    outputs: dict[str, str] = {}
    results: dict[str, dict] = {}
    for stage in ("sft", "opd"):
        c = cfg.stages.get(stage)
        inp = StageInputs(stage, c, plan_stage(stage, c, 1, False), str(tiny_model), "chatml", data.train_file,
                          data.eval_file, str(tmp_path / stage), seed=cfg.seed,
                          needs={n: outputs[n] for n in c.needs})
        results[stage] = run_stage(inp)
        outputs[stage] = results[stage]["output_model"]

    tok = models.load_tokenizer(tiny_model)
    opd = cfg.stages.get("opd")
    rows, _ = encode_prompt_answer(read_records(data.eval_file), tok, templates.get_template("chatml"), opd.seq_len,
                                   opd.max_new_tokens)
    base_ce, before = held_out_measures(tiny_model, outputs["sft"], rows, opd.beta)
    teacher_ce, _ = held_out_measures(outputs["sft"], outputs["sft"], rows, opd.beta)
    student_ce, after = held_out_measures(outputs["opd"], outputs["sft"], rows, opd.beta)
    print(f"{len(rows)} held-out answers: loss base {base_ce:.3f}, teacher {teacher_ce:.3f}, student {student_ce:.3f}; "
          f"JSD({opd.beta}) to the teacher {before:.4f} -> {after:.4f} ({time.monotonic() - t0:.0f} s)")
    assert len(rows) >= 16
    assert teacher_ce < 0.5 * base_ce  # the teacher knows clearly more than the base model
    assert after <= 0.7 * before  # the distillation moved the student >= 30 % towards the teacher
    ev = results["opd"]["eval"]  # the stage's own held-out JSD (GKDTrainer's loss on the reference answers)
    assert ev["eval_jsd"] <= 0.7 * ev["eval_jsd_before"]
    assert results["opd"]["teacher"] == "sft" and results["opd"]["steps"] == opd.max_steps

