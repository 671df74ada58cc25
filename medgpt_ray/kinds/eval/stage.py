"""The eval stage (stages.eval, kinds/eval/config.py): the run's models compared on the held-out split, in one process.

The eval kind's stage module, so the runner calls run(inputs) like any stage's (in one Ray task: the kind trains
nothing, config/registry.py's `trains`); no Ray here. It generates with the engine's Generator (medgpt_ray/generation/,
in-process: no actor pool for a few dozen prompts). Per model, loaded once: (a) the response-only loss and
perplexity of the held-out SFT conversations (and of held-out pretraining text when the run has some), (b) greedy
answers to the held-out prompts (every model but the pretraining one), (c) each exam question's options by
log-likelihood and the letter it generates (kinds/eval/scores.py). Then the rm stage's model scores every answer, and
each model's answers are compared with the reference model's (the stage's `from`, SFT by default) prompt by prompt:
wins, ties, losses, the win rate (ties half) with a bootstrap 95 % interval (kinds/eval/stats.py).

runs/<name>/eval/: results.json (the numbers, no record text; per model its decode path and why, and the exam's
accuracy per subject by the subjects' names where the questions name them), generations.jsonl and exam.jsonl (per
item: the answers and their scores; owner-only, they hold medical text), result.json (the stage's receipt)."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medgpt_ray import models, templates
from medgpt_ray.config import STAGE_KINDS, reward_model_kind, stage_kind
from medgpt_ray.data.exam import exam_prompt, parse_letters
from medgpt_ray.data.private import open_private
from medgpt_ray.data.prompt_rows import as_prompt
from medgpt_ray.data.shards import read_table
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.kinds.eval import scores, stats
from medgpt_ray.stages.inputs import Sink, StageInputs
from medgpt_ray.stages.outputs import HELD_OUT, worker_placement, write_result
from medgpt_ray.stages.score_head import fp32_score_head

BASE = "base"  # the name of the reference model when the stage starts from the base model


@dataclass
class EvalData:
    conversations: list[dict]  # held-out SFT conversations (loss)
    texts: list[str]  # held-out pretraining text (loss)
    prompts: list[tuple[str, dict]]  # (id, canonical prompt record) to answer
    exam: list[tuple[str, dict]]  # (id, canonical exam record)


@dataclass
class ModelEval:
    loss: dict[str, Any]
    text_loss: dict[str, Any] | None
    answers: list[dict[str, Any]] = field(default_factory=list)  # per prompt: id, response, new_tokens, finished
    exam: list[dict[str, Any]] = field(default_factory=list)  # per question: id, subject?, picks, generated
    generate_seconds: float = 0.0
    decode_path: str | None = None  # how its answers decoded and why (DecodePath.describe); None: it generated none


def _keyed(path: str | None, prefix: str) -> list[tuple[str, dict]]:
    """(stable id, record) of a split file: the id is the record's hash key (data/shards.py), in file order."""
    if not path:
        return []
    t = read_table(path)
    return [(f"{prefix}-{k:016x}", json.loads(r)) for k, r in zip(t.column("key").to_pylist(),
                                                                  t.column("record").to_pylist(), strict=True)]


def load_data(inp: StageInputs) -> EvalData:
    cfg, files = inp.cfg, inp.data_files
    held_out = _keyed(inp.eval_file, "sft")
    limit = cfg.max_examples
    extra = _keyed(files.get("prompt", [None, None])[1], "prompt")  # data.prompt's: up to half of max_prompts
    extra = extra[:min(len(extra), cfg.max_prompts // 2)]
    prompts = [(i, as_prompt(r)) for i, r in held_out][:cfg.max_prompts - len(extra)] + extra
    exam = sorted(_keyed(files.get("exam", [None])[0], "exam") + _keyed(files.get("exam", [None, None])[1], "exam"))
    texts = [r["text"] for _, r in _keyed(files.get("pretrain", [None, None])[1], "pt")]
    return EvalData([r for _, r in held_out][:limit], texts[:limit], prompts[:cfg.max_prompts], exam)


def compared_models(inp: StageInputs) -> tuple[str, dict[str, str]]:
    """The reference model's name and every policy compared, {name: model dir} in the registry's order (the
    reference first when it is the base model); the reward-model stage is the judge, not a policy."""
    start = Path(inp.model_path)
    ref = start.parent.name if start.name == "model" and start.parent.name in STAGE_KINDS else BASE
    found = {ref: str(start), **{s: p for s, p in inp.needs.items() if s != reward_model_kind()}}
    order = [BASE, *STAGE_KINDS]
    return ref, {s: found[s] for s in sorted(found, key=order.index)}


def _answers(gen: Generator, items: Sequence[tuple[str, dict]], batch_size: int) -> tuple[list[dict], float]:
    rows: list[dict] = []
    seconds = 0.0
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        batch = {"prompt_id": [i for i, _ in chunk],
                 "conversations": [json.dumps(r["conversations"], ensure_ascii=False) for _, r in chunk],
                 "tools": [json.dumps(r.get("tools") or [], ensure_ascii=False) for _, r in chunk]}
        out = gen(batch)
        seconds += sum(out["batch_seconds"])
        rows += [{"id": out["prompt_id"][k], "response": out["response"][k], "new_tokens": out["new_tokens"][k],
                  "finished": out["finished"][k]} for k in range(len(out["prompt_id"]))]
    return rows, seconds


def _exam(gen: Generator, template: Any, data: EvalData, cfg: Any) -> list[dict]:
    records = [r for _, r in data.exam]
    option_scores = scores.exam_option_scores(gen.model, gen.tok, template, records, cfg.seq_len, cfg.batch_size)
    gen.params = GenerationParams(max_new_tokens=cfg.exam_max_new_tokens)
    asked = [(i, {"conversations": [{"role": "user", "content": exam_prompt(r)}]}) for i, r in data.exam]
    generated, _ = _answers(gen, asked, cfg.batch_size)
    out = []
    for (qid, r), s, g in zip(data.exam, option_scores, generated, strict=True):
        out.append({"id": qid, **({"subject": r["subject"]} if "subject" in r else {}), "answer": r["answer"],
                    "loglik": scores.loglik_choice(s), "loglik_sum": scores.loglik_choice(s, normalised=False),
                    "generated": parse_letters(g["response"], r["options"]), "response": g["response"]})
    return out


def evaluate_model(name: str, path: str, inp: StageInputs, data: EvalData) -> ModelEval:
    """Everything measured on one model, loaded once (the engine's Generator: its model and tokenizer serve all)."""
    cfg = inp.cfg
    gen = Generator(path, inp.template, GenerationParams(max_new_tokens=cfg.max_new_tokens).as_dict(),
                    cfg.generation_path)
    template = templates.get_template(inp.template)
    response_only = cfg.loss_model == "response"
    res = ModelEval(scores.conversation_loss(gen.model, gen.tok, template, data.conversations, cfg.seq_len,
                                                  cfg.batch_size, response_only),
                    scores.text_loss(gen.model, gen.tok, data.texts, cfg.seq_len, cfg.batch_size)
                    if data.texts else None)
    if generates(name):
        res.answers, res.generate_seconds = _answers(gen, data.prompts, cfg.batch_size)
    if data.exam:
        res.exam = _exam(gen, template, data, cfg)
    if res.answers or res.exam:
        res.decode_path = gen.path.describe()
    compiled = gen.path.compiled
    del gen
    _free(compiled)
    return res


def generates(name: str) -> bool:
    """Every model answers the prompts but a pretraining stage's (a text model, no assistant)."""
    return name == BASE or stage_kind(name).data_kind != "pretrain"


def _free(compiled: bool = False) -> None:
    """The last model's memory back; after a compiled decode step also dynamo's compiled code and its CUDA graphs,
    which hold on to that model (the next model compiles its own)."""
    import torch

    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def judge(inp: StageInputs, data: EvalData, answers: dict[str, list[dict]]) -> dict[str, list[float]]:
    """The reward-model stage's score of every model's answer to every prompt."""
    rm_dir = Path(inp.needs[reward_model_kind()])
    tok = models.load_tokenizer(rm_dir)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rm = models.load_reward_model(rm_dir, "bf16" if device == "cuda" else "fp32", "full", tok.pad_token_id)
    # Scores in fp32 on the bf16 network (stages/score_head.py): bf16 scores would tie answers a win rate tells apart.
    rm = fp32_score_head(rm).to(device).eval()
    template = templates.get_template(inp.template)
    prompts = [r for _, r in data.prompts]
    out = {name: scores.reward_scores(rm, tok, template, prompts, [a["response"] for a in rows],
                                           inp.cfg.seq_len, inp.cfg.batch_size)
           for name, rows in answers.items()}
    del rm
    _free()
    return out


def summarise(ref: str, evals: dict[str, ModelEval], rewards: dict[str, list[float]], data: EvalData,
              inp: StageInputs) -> dict[str, Any]:
    """results.json: per model its loss, answers' mean reward and length, exam accuracies (per subject too); win rates
    over ref."""
    per_model: dict[str, Any] = {}
    for name, e in evals.items():
        m: dict[str, Any] = {"heldout": e.loss, **({"pretrain_heldout": e.text_loss} if e.text_loss else {}),
                             **({"decode_path": e.decode_path} if e.decode_path else {})}
        if e.answers:
            lengths = [a["new_tokens"] for a in e.answers]
            m["answers"] = {"prompts": len(lengths), "mean_new_tokens": round(sum(lengths) / len(lengths), 2),
                            "stopped_at_limit": sum(not a["finished"] for a in e.answers),
                            "generate_seconds": round(e.generate_seconds, 2)}
            if name in rewards:
                m["answers"]["mean_reward"] = round(sum(rewards[name]) / len(rewards[name]), 4)
        if e.exam:  # accuracies, and per subject where the questions name theirs
            m["exam"] = stats.exam_summary(e.exam)
        per_model[name] = m
    wins = {name: stats.win_rate(rewards[name], rewards[ref], inp.cfg.bootstrap, inp.seed)
            for name in rewards if name != ref and ref in rewards}  # a pretraining reference answers nothing
    return {"reference": ref, "judge": reward_model_kind() if rewards else None, "models": per_model, "win_rates": wins,
            "data": {"heldout_conversations": len(data.conversations), "pretrain_texts": len(data.texts),
                     "prompts": len(data.prompts), "exam_questions": len(data.exam)}}


def _write_items(out: Path, evals: dict[str, ModelEval], rewards: dict[str, list[float]]) -> None:
    with open_private(out / "generations.jsonl") as f:
        for name, e in evals.items():
            for k, a in enumerate(e.answers):
                reward = rewards[name][k] if name in rewards else None
                f.write(json.dumps({"model": name, **a, "reward": reward}, ensure_ascii=False) + "\n")
    with open_private(out / "exam.jsonl") as f:
        for name, e in evals.items():
            f.writelines(json.dumps({"model": name, **x}, ensure_ascii=False) + "\n" for x in e.exam)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    t0 = time.monotonic()
    data = load_data(inp)
    ref, policies = compared_models(inp)
    evals = {name: evaluate_model(name, path, inp, data) for name, path in policies.items()}
    answers = {name: e.answers for name, e in evals.items() if generates(name) and data.prompts}
    rewards = judge(inp, data, answers) if reward_model_kind() in inp.needs and answers else {}
    results = summarise(ref, evals, rewards, data, inp)
    inp.out.mkdir(parents=True, exist_ok=True)
    _write_items(inp.out, evals, rewards)
    (inp.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    result = {"stage": inp.stage, "steps": None, "wall_s": round(time.monotonic() - t0, 3), HELD_OUT: {},
              "evaluation": results, "workers": worker_placement(), "output_model": str(inp.out)}
    write_result(inp, result)
    return result
