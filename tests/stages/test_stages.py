"""Each stage for a few optimizer steps on the tiny model, in a plain process (no Ray)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from medgpt_ray.config import DPOStageConfig, LoraConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

KIND = {"pt": "pretrain", "sft": "sft", "rm": "preference", "dpo": "preference"}
# Easy pairs (the chosen answer is the longer, specific one): a few steps learn them, so a wrong sign or a pair
# scored the wrong way round shows here. The shipped sample pairs (data/sample/reward.jsonl) are hard on purpose and
# take hundreds of steps to learn.
EASY_PAIRS = "tests/data/easy_reward_pairs.jsonl"
SOURCES = {
    "pretrain": ["data/sample/pretrain.jsonl"],
    "sft": ["data/sample/sft_sharegpt.jsonl"],
    "preference": [EASY_PAIRS],
}


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    return {k: prepare_kind(k, [str(repo / p) for p in v], out, 0.1, max_records=32) for k, v in SOURCES.items()}


def make_inputs(stage: str, data, model: Path, out: Path, **overrides) -> StageInputs:
    cls = DPOStageConfig if stage == "dpo" else StageConfig
    kw = dict(method="full" if stage == "pt" else "lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0),
              lr=5e-3, max_steps=6, seq_len=128, effective_batch=4, logging_steps=1, save_steps=100)
    kw.update(overrides)
    cfg = cls(**kw)
    d = data[KIND[stage]]
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs(stage, cfg, plan_stage(stage, cfg, 1, False), str(model), "chatml",
                       d.train_file, d.eval_file, str(out))


def weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k in b)


@pytest.fixture(scope="module")
def sft_model(data, tiny_model, tmp_path_factory) -> Path:
    r = run_stage(make_inputs("sft", data, tiny_model, tmp_path_factory.mktemp("sft")))
    return Path(r["output_model"])


def test_pt_loss_goes_down_and_model_reloads(data, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    r = run_stage(make_inputs("pt", data, tiny_model, tmp_path, max_steps=8))
    assert r["steps"] == 8
    assert r["train_loss_last"] < r["train_loss_first"]
    assert r["eval"]["eval_perplexity"] > 1
    AutoModelForCausalLM.from_pretrained(r["output_model"], local_files_only=True)
    assert (tmp_path / "metrics.jsonl").read_text().count('"loss"') >= 8


def test_sft_trains_lora_and_merges_into_a_plain_model(data, tiny_model, tmp_path):
    r = run_stage(make_inputs("sft", data, tiny_model, tmp_path, max_steps=8))
    assert r["train_loss_last"] < r["train_loss_first"]
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    merged = weights(r["output_model"])
    assert not any("lora" in k for k in merged)
    assert changed(weights(tiny_model), merged)


def test_rm_learns_a_reward_head(data, sft_model, tmp_path):
    r = run_stage(make_inputs("rm", data, sft_model, tmp_path))
    assert r["train_loss_last"] < r["train_loss_first"]
    assert 0.0 <= r["eval"]["eval_accuracy"] <= 1.0
    assert "score.weight" in weights(r["output_model"])


def test_the_reward_models_new_score_head_is_the_same_in_every_run(data, tiny_model, tmp_path):
    """The score head is created when the model loads, before the Trainer seeds: the stage seeds first, so two runs
    of the same config start from the same head (the demo's rm first loss was 0.743 in one run, 0.650 in the next)."""
    from medgpt_ray.stages import build_stage

    heads = []
    for k in range(2):
        built = build_stage(make_inputs("rm", data, tiny_model, tmp_path / str(k)))
        heads.append({n: p.detach().clone() for n, p in built.trainer.model.named_parameters() if "score" in n})
    assert heads[0] and heads[0].keys() == heads[1].keys()
    assert all(torch.equal(heads[0][n], heads[1][n]) for n in heads[0])


def test_dpo_moves_the_policy_off_its_reference(data, sft_model, tmp_path):
    r = run_stage(make_inputs("dpo", data, sft_model, tmp_path, beta=0.1))
    # Loss starts at ln 2 (policy == reference) and must drop below it.
    assert r["train_loss_first"] == pytest.approx(0.6931, abs=1e-3)
    assert r["train_loss_last"] < r["train_loss_first"]
    assert r["eval"]["eval_reward_margin"] > 0
    assert changed(weights(sft_model), weights(r["output_model"]))


def test_interrupted_stage_resumes_from_its_checkpoint(data, tiny_model, tmp_path):
    first = run_stage(make_inputs("sft", data, tiny_model, tmp_path, max_steps=2, save_steps=2))
    assert first["resumed_from"] is None
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    second = run_stage(make_inputs("sft", data, tiny_model, tmp_path, max_steps=4, save_steps=2))
    assert second["resumed_from"].endswith("checkpoint-2")
    assert second["steps"] == 4


def test_qlora_without_a_gpu_says_so(tiny_model):
    from medgpt_ray.models import QLoRAUnavailable, load_causal_lm

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(QLoRAUnavailable, match="needs a CUDA GPU"):
        load_causal_lm(tiny_model, "bf16", "qlora")


def test_conversations_longer_than_seq_len_are_counted_not_trained_blind(data, tiny_model, tmp_path):
    r = run_stage(make_inputs("sft", data, tiny_model, tmp_path, seq_len=64, max_steps=2))
    assert r["skipped_too_long"] > 0
    assert r["train_records"] + r["skipped_too_long"] == 32
    over = r["overlong"]  # the rule's counts in result.json: every train record kept whole, truncated or skipped
    assert over["records"] == 32 and over["skipped"] == r["skipped_too_long"] and over["truncated"] > 0
    assert over["keep_99_seq_len"] > 64 and over["policy"] == "truncate"
    # the model's context from its config, and how many records are longer than even that (the tiny model's)
    context = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    assert over["model_context"] == context and 0 <= over["over_context"] <= over["skipped"] + over["truncated"]


@pytest.mark.parametrize("stage,fraction", [("sft", 0.5), ("dpo", 0.5), ("sft", 0.0), ("pt", 1.0)])
def test_the_planned_checkpointing_is_what_trains(stage, fraction, data, tiny_model, tmp_path):
    """Selective checkpointing keeps the first layers checkpointed and the rest not, also through TRL's DPO
    (which switches checkpointing off and on around its reference pass), and `false` is honoured although
    TRL's configs default to on."""
    import torch

    from medgpt_ray.stages import build_stage
    from medgpt_ray.trainer_kit.checkpointing import decoder_layers

    inp = make_inputs(stage, data, tiny_model, tmp_path, max_steps=2, grad_ckpt=fraction if 0 < fraction < 1
                      else bool(fraction))
    built = build_stage(inp)
    seen: list[tuple[int, bool]] = []  # (layer, checkpointing) of every training forward with gradients

    def record(module, args, index):
        if module.training and torch.is_grad_enabled():  # not DPO's reference pass (no_grad), not evaluation
            seen.append((index, module.gradient_checkpointing))

    for index, layer in enumerate(decoder_layers(built.trainer.model)):
        layer.register_forward_pre_hook(lambda module, args, index=index: record(module, args, index))
    built.trainer.train()
    expected = {0.0: [False, False], 0.5: [True, False], 1.0: [True, True]}[fraction]
    assert {index for index, _ in seen} == {0, 1}
    assert all(flag == expected[index] for index, flag in seen), seen


def test_a_stage_without_ray_serves_the_same_metrics_on_its_port(data, tiny_model, tmp_path, repo):
    """prometheus_client path: the names a dashboard queries are served by a plain process too. The stage runs in a
    fresh process, where Ray was never started (in this one the test session's cluster may be up, and a process with
    Ray up reports through Ray instead); that process reads its own port once the stage is done."""
    import os
    import pickle
    import subprocess
    import sys

    from medgpt_ray.metrics import PORT_ENV
    from tests.promserver import free_port

    port = free_port()
    inputs = tmp_path / "inputs.pkl"
    inputs.write_bytes(pickle.dumps(make_inputs("sft", data, tiny_model, tmp_path / "plainrun" / "sft", max_steps=3)))
    script = ("import pickle, sys, urllib.request\n"
              "from medgpt_ray.stages import run_stage\n"
              "run_stage(pickle.loads(open(sys.argv[1], 'rb').read()))\n"
              "print(urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[2]}/metrics', timeout=10).read().decode())\n")
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, PORT_ENV: str(port), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script, str(inputs), str(port)], env=env, cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    loss = [line for line in text.splitlines() if line.startswith("ray_medgpt_train_loss{")]
    assert loss and 'run="plainrun"' in loss[0] and 'stage="sft"' in loss[0] and 'gpu="cpu"' in loss[0]
    tps = [line for line in text.splitlines() if line.startswith("ray_medgpt_train_tokens_per_second{")]
    assert tps and float(tps[0].rsplit(" ", 1)[1]) > 0


def _train_logs(built) -> list[dict]:
    built.trainer.train()
    keys = ("loss", "entropy", "mean_token_accuracy", "num_tokens", "grad_norm")
    return [{k: h[k] for k in keys if k in h} for h in built.trainer.state.log_history if "loss" in h]


def test_sync_free_sft_loss_logs_what_trl_logs(data, tiny_model, tmp_path):
    """The SFT stage's loss without per-micro-batch host syncs trains and logs exactly as TRL's own."""
    from medgpt_ray.stages import build_stage
    from medgpt_ray.trainer_kit.sync_free import SyncFreeLoss

    ours = build_stage(make_inputs("sft", data, tiny_model, tmp_path / "a", max_steps=3, effective_batch=8))
    assert isinstance(ours.trainer, SyncFreeLoss) and ours.trainer.sync_free
    assert ours.trainer.args.logging_nan_inf_filter is False
    trl = build_stage(make_inputs("sft", data, tiny_model, tmp_path / "b", max_steps=3, effective_batch=8))
    trl.trainer.sync_free = False  # every micro-batch to SFTTrainer's compute_loss
    a, b = _train_logs(ours), _train_logs(trl)
    assert len(a) == len(b) == 3 and all(set(x) == set(y) for x, y in zip(a, b, strict=True))
    for x, y in zip(a, b, strict=True):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-5), k


def test_compiled_decoder_layers_train_like_eager_ones(data, tiny_model, tmp_path):
    from medgpt_ray.stages import build_stage
    from medgpt_ray.stages.speed import CompileDecoderLayers, decoder_layers

    inp = make_inputs("sft", data, tiny_model, tmp_path / "c", max_steps=2)
    inp = replace(inp, plan=replace(inp.plan, compile=True))
    compiled = build_stage(inp)
    cb = next(c for c in compiled.trainer.callback_handler.callbacks if isinstance(c, CompileDecoderLayers))
    eager = build_stage(make_inputs("sft", data, tiny_model, tmp_path / "e", max_steps=2))
    a, b = _train_logs(compiled), _train_logs(eager)
    layers = decoder_layers(compiled.trainer.model)
    assert cb.compiled == len(layers) == 2 and all(m._compiled_call_impl is not None for m in layers)
    assert [x["loss"] for x in a] == pytest.approx([x["loss"] for x in b], rel=1e-4)
    # Compiled, every micro-batch is padded to the one bucket seq_len 128 allows: nothing recompiles after step 1,
    # and metrics.jsonl says so; the eager stage's records carry no such field.
    logged = [json.loads(x) for x in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert [r["recompiles"] for r in logged if "loss" in r] == [0, 0]
    assert not any("recompiles" in x for x in (tmp_path / "e" / "metrics.jsonl").read_text().splitlines())


def test_lora_inputs_stay_bf16_under_autocast_only(data, tiny_model, tmp_path):
    """peft's fp32 cast of adapted inputs is off while the Trainer trains under bf16 autocast, back after."""
    from transformers import TrainerCallback

    from medgpt_ray.stages import build_stage
    from medgpt_ray.stages.speed import Bf16LoraInputs

    def lora_casts(model) -> list[bool]:
        return [m.cast_input_dtype_enabled for m in model.modules() if hasattr(m, "cast_input_dtype_enabled")]

    class Spy(TrainerCallback):
        def __init__(self):
            self.seen: list[list[bool]] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.seen.append(lora_casts(model))

    for precision, expect_during in (("bf16", False), ("fp32", True)):
        inp = make_inputs("sft", data, tiny_model, tmp_path / precision, max_steps=2)
        # bf16 on CPU: the Trainer's CPU autocast, as on a GPU
        inp = replace(inp, plan=replace(inp.plan, precision=precision))
        built = build_stage(inp)
        spy = Spy()
        built.trainer.add_callback(spy)
        logs = _train_logs(built)
        assert any(isinstance(c, Bf16LoraInputs) for c in built.trainer.callback_handler.callbacks)
        assert spy.seen and all(len(flags) == 14 and set(flags) == {expect_during} for flags in spy.seen)
        assert set(lora_casts(built.trainer.model)) == {True}
        assert all(math.isfinite(x["loss"]) for x in logs)


def test_tool_calls_are_trained_and_tool_results_are_not(repo, tiny_model, tmp_path):
    """MedicalGPT's tool-calling ShareGPT, read and prepared as the pipeline does: function_call turns and
    answers are the loss, observations and the tool schemas (in the system turn) are context only."""
    from medgpt_ray import models, templates
    from medgpt_ray.data.shards import read_records
    from medgpt_ray.stages.conversation_rows import encode_conversations

    d = prepare_kind("sft", [str(repo / "data/sample/formats/sft_sharegpt_tools.jsonl")], tmp_path, 0.1)
    records = [r for r in read_records(d.train_file) + read_records(d.eval_file) if r.get("tools")]
    assert any(t["role"] == "tool" for r in records for t in r["conversations"])
    tok = models.load_tokenizer(tiny_model)
    ds, skipped = encode_conversations(records, tok, templates.get_template("chatml"), 8192)
    assert (skipped["too_long"], skipped["tools_unsupported"], skipped["overlong"].truncated) == (0, 0, 0)
    for row, record in zip(ds, records, strict=True):
        ids, labels = row["input_ids"], row["labels"]
        full = tok.decode(ids)
        trained = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != templates.IGNORE_INDEX])
        system_turn = full.split("<|im_end|>", 1)[0]
        assert all(json.dumps(tool, ensure_ascii=False) in system_turn for tool in record["tools"])
        for turn in record["conversations"]:
            if turn["role"] == "tool":
                assert turn["content"] in full and turn["content"] not in trained
            elif turn["role"] == "assistant":
                assert turn["content"] in trained
            elif turn["role"] == "tool_call":
                calls = json.loads(turn["content"])
                for call in calls if isinstance(calls, list) else [calls]:
                    assert f'<tool_call>\n{{"name": "{call["name"]}"' in trained
        assert "<tool_response>" not in trained and "# Tools" not in trained


def test_preference_pairs_with_tools_render_their_schemas(repo, tiny_model, tmp_path):
    from medgpt_ray import models, templates
    from medgpt_ray.data.shards import read_records
    from medgpt_ray.stages.overlong import ANSWER_FLOOR
    from medgpt_ray.stages.pair_rows import encode_pairs
    from medgpt_ray.stages.preference_rows import preference_texts

    d = prepare_kind("preference", [str(repo / "data/sample/formats/preference_sharegpt.jsonl")], tmp_path, 0.1)
    records = read_records(d.train_file) + read_records(d.eval_file)
    with_tools = [r for r in records if r.get("tools")]
    assert with_tools and len(with_tools) < len(records)
    tok, chatml = models.load_tokenizer(tiny_model), templates.get_template("chatml")
    texts, skipped = preference_texts(with_tools, tok, chatml)
    assert (skipped["tools_unsupported"], skipped["too_long"], skipped["overlong"].truncated) == (0, 0, 0)
    for prompt, record in zip(texts["prompt"], with_tools, strict=True):
        assert all(tool["name"] in prompt for tool in record["tools"]) and "# Tools" in prompt
    pairs, rm_skipped = encode_pairs(records, tok, chatml, 8192)
    assert len(pairs) == len(records) and rm_skipped["tools_unsupported"] == 0
    # A template with no tool format leaves such pairs out and counts them.
    _, vicuna_skipped = preference_texts(records, tok, templates.get_template("vicuna"))
    assert vicuna_skipped["tools_unsupported"] == len(with_tools)
    # A prompt that leaves fewer than 16 tokens of seq_len (stages/overlong.py's ANSWER_FLOOR) for a response: left
    # out and counted (nothing or a stub to train on; ORPO/CPO would give NaN on an empty answer).
    shortest = min(len(tok(p, add_special_tokens=False)["input_ids"]) for p in texts["prompt"])
    kept, cut = preference_texts(with_tools, tok, chatml, seq_len=shortest + ANSWER_FLOOR)
    assert cut["too_long"] == len(with_tools) - len(kept) >= 1
