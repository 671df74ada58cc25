"""Packing on a hybrid model (issue 34 item 3): tiny random Qwen3.5 text models, in both layer orders (the real one,
linear attention first; and full attention first, the layout the old layer-0 probe would have packed). Linear
attention takes no mask: packing is refused with the reason unless the boundaries and their kernels are there,
`packing: auto` trains padded and says why, `packing: true` is a config error; the leak the refusal prevents is
shown on transformers' PyTorch fallback, and where the kernels can run, packed equals unpacked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.config import ConfigError, LoraConfig, SFTStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.lengths import LengthProfile
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import load_shape
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.trainer_kit import linear_attention, packed_attention

SEQ_LEN = 512
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_conv_kernel_dim=3)
LAYOUTS = {"linear-first": None,  # Qwen3_5TextConfig's own pattern: 3 linear, then full attention
           "full-first": ["full_attention"] + ["linear_attention"] * 3}
KERNELS_RUN = torch.cuda.is_available() and not linear_attention.missing_kernels()
NO_KERNELS = "boundary-aware linear-attention kernels need CUDA: fla + causal-conv1d"


@pytest.fixture(scope="module", params=list(LAYOUTS))
def hybrid(request, tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen3.5 text model with the tiny tokenizer, saved as a checkpoint directory."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tok = models.load_tokenizer(tiny_model)
    kw = {"layer_types": LAYOUTS[request.param]} if LAYOUTS[request.param] else {}
    cfg = Qwen3_5TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **LINEAR, **kw)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(request.param)
    Qwen3_5ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def load(path: Path, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, attn_implementation=attn).eval()


def test_the_layouts_are_the_ones_meant(hybrid):
    types = packed_attention.layer_types(load(hybrid))
    assert types.count("linear_attention") == 3 and len(types) == 4
    assert types[0] == ("linear_attention" if hybrid.name.startswith("linear-first") else "full_attention")


def test_packing_is_refused_on_a_hybrid_with_the_reason(hybrid):
    """Whatever layer 0 is: the full-attention layers do get a block-diagonal mask (the old probe, which looked at
    layer 0 only, would have packed the full-first layout), the linear-attention layers get no boundaries."""
    model = load(hybrid)
    positions = torch.tensor(packed_attention.PROBE_POSITIONS)
    mask = packed_attention.allowed_pairs(packed_attention.mask_the_model_builds(model, positions))
    assert torch.equal(mask, packed_attention.block_diagonal(positions))
    mode, why = packed_attention.resolve("auto", model, "sft")
    assert mode is None
    assert why.startswith("3 of its 4 layers are linear attention") and "no sequence boundaries" in why
    if linear_attention.missing_kernels():  # the one sentence naming the packages
        assert "kernels are missing here: flash-linear-attention" in why and "causal-conv1d" in why
    with pytest.raises(ConfigError, match=r"stages\.sft\.packing: true, but 3 of its 4 layers are linear attention"):
        packed_attention.resolve(True, model, "sft")


def test_only_trl_padding_free_batches_carry_the_boundaries_to_a_linear_layer(hybrid):
    """What transformers hands the first linear-attention layer: nothing about boundaries in our rows (SDPA/eager
    path), cu_seq_lens_q and seq_idx in TRL's flattened batches; there the kernels decide."""
    model = load(hybrid)
    first = packed_attention.layer_types(model).index("linear_attention")
    mixer = linear_attention.token_mixer(packed_attention._layers(model)[first])
    rows = packed_attention.layer_inputs(model, packed_attention.probe_batch(packed_attention.ROWS), mixer)
    assert rows.get("attention_mask") is None and not set(linear_attention.BOUNDARIES) & set(rows)
    flat = packed_attention.layer_inputs(model, packed_attention.probe_batch(packed_attention.FLAT), mixer)
    assert flat["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 8, 12]
    assert flat["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 3, 3, 4, 4, 4, 4]]
    refused = packed_attention.layers_refusal(model, packed_attention.FLAT, "flash_attention_2")
    if linear_attention.missing_kernels():
        assert refused is not None and "kernels are missing here" in refused
    else:
        assert refused is None


def _conversations(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(5, vocab, (11,), generator=g), torch.randint(5, vocab, (9,), generator=g)


def _b_packed_and_alone(model, a: torch.Tensor, b: torch.Tensor, batch: dict | None = None):
    """(loss, logits) of conversation b in one row after a, and alone. The row is as collate_rows makes it
    (position ids restarting at b, b's first token no target) unless `batch` gives another layout of a then b."""
    ids = torch.cat([a, b])[None]
    batch = batch or {"input_ids": ids, "position_ids": torch.cat([torch.arange(len(a)), torch.arange(len(b))])[None],
                      "labels": torch.cat([torch.full_like(a, -100), torch.tensor([-100]), b[1:]])[None]}
    with torch.no_grad():
        packed = model(**batch, use_cache=False)
        alone = model(input_ids=b[None], labels=b[None], use_cache=False)
    return (packed.loss.item(), packed.logits[0, len(a):]), (alone.loss.item(), alone.logits[0])


def _leaks(packed, alone) -> bool:
    """b's loss off by more than the 1e-4 packing may change it, and its logits visibly moved."""
    return abs(packed[0] - alone[0]) > 1e-4 and (packed[1] - alone[1]).abs().max().item() > 1e-2


@pytest.mark.skipif(KERNELS_RUN, reason="the kernels are here: the equality test below covers this process")
def test_on_the_torch_fallback_a_packed_conversation_sees_the_one_before_it(hybrid, tiny_model):
    """The leak the refusal prevents. The dense tiny model is the control: the same construction gives the same
    loss and logits there (its attention is block-diagonal); the hybrid's linear layers carry a's state into b."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    dense, model = load(tiny_model), load(hybrid)
    a, b = _conversations(model.config.vocab_size)
    packed, alone = _b_packed_and_alone(dense, a, b)
    assert packed[0] == pytest.approx(alone[0], abs=1e-5)
    torch.testing.assert_close(packed[1], alone[1], atol=1e-5, rtol=1e-5)
    assert _leaks(*_b_packed_and_alone(model, a, b))  # our rows: silently wrong
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": a.tolist(), "labels": [-100] * len(a)}, {"input_ids": b.tolist()}])
    try:  # TRL's flattened batch: transformers 5.24's fallback refuses the boundaries; 5.17's drops them silently
        assert _leaks(*_b_packed_and_alone(model, a, b, flat))
    except ValueError as e:
        assert "can't keep packed sequences apart" in str(e)


@pytest.mark.skipif(not KERNELS_RUN, reason=NO_KERNELS)
def test_with_the_kernels_a_flat_packed_batch_equals_each_conversation_alone(hybrid):
    """The boundary-aware path: TRL's padding-free batch, the boundaries reaching flash-linear-attention and
    causal-conv1d; each conversation's loss and the gradients equal those of the conversations alone."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = load(hybrid).cuda()
    assert packed_attention.layers_refusal(model, packed_attention.FLAT, "flash_attention_2") is None
    a, b = _conversations(model.config.vocab_size)
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": a.tolist()}, {"input_ids": b.tolist()}])
    model.zero_grad()
    packed = model(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in flat.items()}, use_cache=False)
    packed.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    targets = (len(a) - 1, len(b) - 1)  # the packed loss is the mean over both conversations' targets
    alone = sum(model(input_ids=x[None].cuda(), labels=x[None].cuda(), use_cache=False).loss * n
                for x, n in zip((a, b), targets, strict=True)) / sum(targets)
    alone.backward()
    assert packed.loss.item() == pytest.approx(alone.item(), abs=1e-4)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, atol=1e-4, rtol=1e-3, msg=n)


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    files = [str(repo / "data/sample/sft_alpaca.jsonl")]
    return prepare_kind("sft", files, tmp_path_factory.mktemp("data"), 0.1, max_records=12)


def stage_inputs(data, model: Path, out: Path, packing, lengths: LengthProfile | None = None) -> StageInputs:
    """`lengths`: the plan the driver makes from the split's lengths (packed rows, as it plans any SFT stage)."""
    cfg = SFTStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, seq_len=SEQ_LEN,
                         logging_steps=1, save_steps=100, warmup_ratio=0.0, max_steps=1, effective_batch=4,
                         packing=packing)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_stage("sft", cfg, 1, False, load_shape(str(model)), lengths=lengths)
    return StageInputs("sft", cfg, plan, str(model), "chatml", data.train_file, data.eval_file, str(out))


def test_packing_auto_trains_a_hybrid_in_padded_batches_and_says_why(data, hybrid, tmp_path, capsys):
    built = build_stage(stage_inputs(data, hybrid, tmp_path / "auto", "auto"))
    report = built.extras["packing"]
    assert report["mode"] is None and report["why"].startswith("3 of its 4 layers are linear attention")
    line = next(x for x in capsys.readouterr().out.splitlines() if "packing: auto" in x)
    assert re.match(r"\[sft\] packing: auto -> padded micro-batches of \d+.*, not packed: 3 of its 4 layers", line)
    assert built.trainer.train_collate is None  # TRL's own padded collator
    built.trainer.train()
    losses = [h["loss"] for h in built.trainer.state.log_history if "loss" in h]
    assert len(losses) == 1 and losses[0] == losses[0]  # a real, finite step
    with pytest.raises(ConfigError, match=r"stages\.sft\.packing: true, but 3 of its 4 layers are linear"):
        build_stage(stage_inputs(data, hybrid, tmp_path / "true", True))


def test_the_driver_plans_a_hybrid_padded_from_packed_lengths_and_the_worker_trains_that_plan(data, hybrid, tmp_path):
    """The driver plans from the data's lengths before any model is loaded: on `packing: auto` a hybrid shape is
    planned padded (memory/planner.py), so the worker trains the plan's own micro-batches, not the one-conversation
    fallback a packed plan refused on the worker would get (memory/stage_plan.unpacked)."""
    inp = stage_inputs(data, hybrid, tmp_path, "auto", LengthProfile.of([90] * 10, 10, SEQ_LEN, 4.0))
    assert inp.plan.packing is None and any("planned padded" in r for r in inp.plan.reasons)
    built = build_stage(inp)
    assert built.extras["packing"]["mode"] is None and "planned_packed" not in built.extras["packing"]
    args = built.trainer.args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == \
        (inp.plan.micro_batch, inp.plan.grad_accum)


def test_a_packed_plan_the_worker_refuses_recomputes_every_layer_as_its_fallback_says(data, hybrid, tmp_path):
    """A packed plan reaching a worker whose model cannot pack (a plan made for another model, `packing: auto`) trains
    one conversation a micro-batch with every layer recomputing (memory/stage_plan.unpacked); the checkpointing
    trained is that plan's, not the packed plan's fraction (which trained the H200's Qwen3.5 runs at 8 GiB where the
    fallback's plan holds 2: bench/README.md, "fake_trace.py")."""
    from dataclasses import replace

    from medgpt_ray.memory.stage_plan import packed_rows
    from medgpt_ray.trainer_kit.checkpointing import SelectiveCheckpointing

    inp = stage_inputs(data, hybrid, tmp_path, "auto")
    inp = replace(inp, plan=packed_rows(replace(inp.plan, ckpt_fraction=0.5), inp.cfg, 2, 2.0))
    built = build_stage(inp)
    assert built.extras["packing"]["planned_packed"]
    selective = [cb.fraction for cb in built.trainer.callback_handler.callbacks
                 if isinstance(cb, SelectiveCheckpointing)]
    assert selective == [] and built.trainer.args.gradient_checkpointing
    assert built.trainer.args.per_device_train_batch_size == 1
