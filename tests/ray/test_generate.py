"""`medgpt-ray generate` on the shared local Ray cluster with the tiny model: every prompt answered with its id,
bad rows quarantined with their line, a stopped run resumed with only the missing prompts, settings that changed
refused, greedy answers as the model's own generate gives them, and a finished stage of a run as the model."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.batch import GenerateOptions, done_ids, generate
from medgpt_ray.infer.source import ModelSourceError, resolve_model

pytestmark = pytest.mark.ray

QUESTIONS = ["头痛怎么办？", "阿司匹林有什么作用？", "高血压患者饮食要注意什么？", "发烧38度要吃药吗？",
             "咳嗽一周了怎么办？", "糖尿病能吃水果吗？", "失眠怎么调理？", "胃痛挂什么科？"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [json.dumps({"question": q, "answer": "x"}, ensure_ascii=False) for q in QUESTIONS[:4]]
    rows.append("{broken")  # line 5
    rows += [json.dumps({"conversations": [{"from": "human", "value": q}]}, ensure_ascii=False) for q in QUESTIONS[4:]]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def rows_of(out):
    return [r for f in sorted((out / "generations").glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_every_prompt_gets_its_samples_and_a_stopped_run_resumes(ray_cluster, tiny_model, prompts, tmp_path):
    params = GenerationParams(max_new_tokens=6, temperature=0.9, num_samples=2, seed=1)
    opts = GenerateOptions(str(tiny_model), [str(prompts)], tmp_path, params, template="chatml", batch_size=3)
    lines: list[str] = []
    summary = generate(opts, lines.append)
    rows = rows_of(tmp_path)
    ids = {r["prompt_id"] for r in rows}
    assert len(ids) == 8 and len(rows) == 16 and summary["samples"] == 16 and summary["quarantined"] == 1
    assert all(sorted(r["sample"] for r in rows if r["prompt_id"] == i) == [0, 1] for i in ids)
    assert all(0 < r["new_tokens"] <= 6 and r["prompt_tokens"] > 0 for r in rows)
    bad = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(b["line"], b["reason"].startswith("invalid JSON")) for b in bad] == [(5, True)]
    assert not any(q in "\n".join(lines) for q in QUESTIONS)  # progress lines count, they never quote
    assert any("8/8 prompts" in line for line in lines)
    cpu = "dynamic (auto: on the CPU a compiled decode step saves nothing)"  # the path each actor decoded on, and why
    assert summary["decode_path"] == cpu and f"[generate] decode path: {cpu}" in lines
    assert json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))["decode_path"] == cpu
    assert "decode_path" not in rows[0]  # the parts hold answers only

    # A run stopped after some parts: only the prompts of the lost part are generated again.
    parts = sorted((tmp_path / "generations").glob("part-*.parquet"))
    lost = set(pq.read_table(parts[0]).column("prompt_id").to_pylist())
    parts[0].unlink()
    again = generate(opts, lines.append)
    assert again["already_done"] == 8 - len(lost) and again["generated"] == len(lost)
    assert done_ids(tmp_path) == ids
    assert generate(opts, lines.append)["generated"] == 0

    other = GenerateOptions(str(tiny_model), [str(prompts)], tmp_path, GenerationParams(max_new_tokens=7,
                            temperature=0.9, num_samples=2, seed=1), template="chatml")
    with pytest.raises(ModelSourceError, match="params.max_new_tokens"):
        generate(other, lines.append)


def test_greedy_answers_are_the_models_own_generate(ray_cluster, tiny_model, prompts, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from medgpt_ray import models, templates
    from medgpt_ray.generation.prompts import stop_token_ids

    generate(GenerateOptions(str(tiny_model), [str(prompts)], tmp_path, GenerationParams(max_new_tokens=12),
                             template="chatml", batch_size=1), lambda _: None)
    got = {r["prompt_id"]: r for r in rows_of(tmp_path)}
    tok = models.load_tokenizer(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True).eval()
    template = templates.get_template("chatml")
    text = templates.render_prompt(template, tok, [{"role": "user", "content": QUESTIONS[0]}])
    enc = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=stop_token_ids(tok, template),
                             pad_token_id=tok.pad_token_id)[0, enc["input_ids"].shape[1]:].tolist()
    stops = stop_token_ids(tok, template)
    answer = out[:next((n for n, t in enumerate(out) if t in stops), len(out))]
    first = got["00000-0000000001-000"]
    assert first["new_tokens"] == len(answer) and first["finished"] == (len(answer) < len(out))
    assert first["response"] == tok.decode(answer, skip_special_tokens=True)


def test_the_static_paths_warm_up_is_counted_apart(ray_cluster, tiny_model, prompts, tmp_path):
    opts = GenerateOptions(str(tiny_model), [str(prompts)], tmp_path, GenerationParams(max_new_tokens=6),
                           template="chatml", batch_size=3, generation_path="static")
    summary = generate(opts, lambda _: None)
    assert summary["decode_path"].startswith("static")
    # Three batches on one static cache: the first built it (on a GPU: the compile and the graphs' capture).
    assert summary["warmup_seconds"] > 0 and 0 < summary["warmup_new_tokens"] <= 6 * 3  # one batch of 3 prompts
    assert summary["warmup_new_tokens"] < summary["new_tokens"] and summary["warm_new_tokens_per_s_per_actor"] > 0


def test_a_finished_stage_is_a_model_with_the_runs_template(tiny_run, tmp_path):
    source = resolve_model(str(tiny_run.run_dir / "sft"))
    assert source.path == tiny_run.run_dir / "sft" / "model" and source.template == tiny_run.cfg.template_for("sft")
    failed = tmp_path / "run" / "rm"  # a stage that planned and never finished
    failed.mkdir(parents=True)
    (failed / "plan.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelSourceError, match="no merged model"):
        resolve_model(str(failed))
    with pytest.raises(ModelSourceError, match="neither a model directory"):
        resolve_model(str(tmp_path / "run"))
