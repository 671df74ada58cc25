"""Packing on a hybrid model (issues 34 and 47): tiny random Qwen3.5 text models, in both layer orders (the real one,
linear attention first; and full attention first). Linear attention takes no mask and transformers hands it no
boundaries; the layer models.load_causal_lm installs (hybrid/layers.py) takes them from the position ids, so a packed
row trains exactly as its conversations alone (loss within 1e-4, gradients atol 1e-4 / rtol 1e-3) on whichever
kernels the process chooses: the PyTorch reference here, flash-linear-attention's on a GPU whose probe passed.
transformers' own layer leaks, and a model loaded without ours is refused packing, with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.config import ConfigError, LoraConfig, SFTStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.hybrid import layers as hybrid_layers
from medgpt_ray.memory.lengths import LengthProfile
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import load_shape
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.trainer_kit import linear_attention, packed_attention
from tests.stages.hybrid_models import save_tiny_hybrid

SEQ_LEN = 512
LAYOUTS = {"linear-first": None,  # Qwen3_5TextConfig's own pattern: 3 linear, then full attention
           "full-first": ["full_attention"] + ["linear_attention"] * 3}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def hybrid(request, tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen3.5 text model with the tiny tokenizer, saved as a checkpoint directory."""
    return save_tiny_hybrid(tiny_model, tmp_path_factory.mktemp(request.param), LAYOUTS[request.param])


def load(path: Path, attn: str = "sdpa", ours: bool = True):
    """The checkpoint as the stages load it (models.load_causal_lm: our linear-attention layer installed), or as
    transformers alone builds it (`ours` False). fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, attn_implementation=attn)
    if ours:
        assert hybrid_layers.install(model) == 3
    return model.float().eval()


def test_the_layouts_are_the_ones_meant(hybrid):
    types = packed_attention.layer_types(load(hybrid))
    assert types.count("linear_attention") == 3 and len(types) == 4
    assert types[0] == ("linear_attention" if hybrid.name.startswith("linear-first") else "full_attention")


def test_the_stages_loader_installs_the_layer_that_keeps_conversations_apart(hybrid):
    model = models.load_causal_lm(hybrid, "amp-bf16", "lora")
    mixers = [m for m in model.modules() if type(m).__name__ == "Qwen3_5GatedDeltaNet"]
    assert len(mixers) == 3 and all(hybrid_layers.is_installed(m) for m in mixers)


def test_packing_is_accepted_with_our_layer_and_refused_without_it(hybrid):
    """Whatever layer 0 is: the full-attention layers get a block-diagonal mask, and our linear-attention layers get
    the boundaries. transformers' own layer (a model loaded without models.load_causal_lm) is refused, with why."""
    model = load(hybrid)
    positions = torch.tensor(packed_attention.PROBE_POSITIONS)
    mask = packed_attention.allowed_pairs(packed_attention.mask_the_model_builds(model, positions))
    assert torch.equal(mask, packed_attention.block_diagonal(positions))
    mode, why = packed_attention.resolve("auto", model, "sft")
    assert mode == packed_attention.ROWS
    assert why.endswith(f"linear-attention layers start every conversation from a zero state, "
                        f"{linear_attention.kernels_sentence()}")
    mode, why = packed_attention.resolve("auto", load(hybrid, ours=False), "sft")
    assert mode is None and why.startswith("3 of its 4 layers are linear attention, loaded without medgpt-ray's")
    with pytest.raises(ConfigError, match=r"stages\.sft\.packing: true, but 3 of its 4 layers are linear"):
        packed_attention.resolve(True, load(hybrid, ours=False), "sft")


def test_our_rows_and_trl_padding_free_batches_carry_the_boundaries_to_a_linear_layer(hybrid):
    """What the first linear-attention layer receives: the position ids in our rows (transformers alone hands it
    none), cu_seq_lens_q and the position ids in TRL's flattened batches."""
    model = load(hybrid)
    first = packed_attention.layer_types(model).index("linear_attention")
    mixer = linear_attention.token_mixer(packed_attention._layers(model)[first])
    rows = packed_attention.layer_inputs(model, packed_attention.probe_batch(packed_attention.ROWS), mixer)
    assert rows.get("attention_mask") is None
    assert rows[hybrid_layers.POSITIONS].tolist() == packed_attention.PROBE_POSITIONS
    flat = packed_attention.layer_inputs(model, packed_attention.probe_batch(packed_attention.FLAT), mixer)
    assert flat["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 8, 12]
    assert packed_attention.layers_refusal(model, packed_attention.FLAT, "flash_attention_2") is None
    stock = load(hybrid, ours=False)
    mixer = linear_attention.token_mixer(packed_attention._layers(stock)[first])
    rows = packed_attention.layer_inputs(stock, packed_attention.probe_batch(packed_attention.ROWS), mixer)
    assert hybrid_layers.POSITIONS not in rows


def _conversations(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three conversations, the second longer than a delta-rule chunk (64 tokens) so the chunked path is crossed."""
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randint(5, vocab, (n,), generator=g) for n in (11, 70, 9))


def _packed_row(convs, width: int) -> dict[str, torch.Tensor]:
    """One row as collate_rows makes it: the conversations back to back, position ids restarting at each, the first
    token of each no target, tail padding of its own."""
    from medgpt_ray.trainer_kit.packed_rows import collate_rows

    example = {"input_ids": torch.cat(convs).tolist(), "labels": torch.cat(convs).tolist(),
               "seq_lengths": [len(c) for c in convs]}
    return collate_rows([example], pad_id=0, width=width)


def _loss_and_grads(model, batches: list[dict]) -> tuple[float, dict[str, torch.Tensor]]:
    """The token-weighted mean loss over `batches` (each a forward), and every parameter's gradient of it."""
    model.zero_grad()
    targets = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    total = sum(model(**b, use_cache=False).loss * n for b, n in zip(batches, targets, strict=True)) / sum(targets)
    total.backward()
    return total.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _alone(convs) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": c[None], "labels": torch.cat([torch.tensor([-100]), c[1:]])[None]} for c in convs]


def test_a_packed_row_trains_exactly_as_its_conversations_alone(hybrid):
    """Loss within 1e-4 and every gradient within atol 1e-4 / rtol 1e-3 of the conversations run one by one: on the
    kernels this process chooses (the PyTorch reference on CPU; fla's with their backward where the probe passed)."""
    model = load(hybrid)
    if torch.cuda.is_available():
        model = model.cuda()
    convs = _conversations(model.config.vocab_size)
    dev = next(model.parameters()).device
    packed = {k: v.to(dev) for k, v in _packed_row(convs, 96).items()}
    alone = [{k: v.to(dev) for k, v in b.items()} for b in _alone(convs)]
    loss_p, grads_p = _loss_and_grads(model, [packed])
    loss_a, grads_a = _loss_and_grads(model, alone)
    assert loss_p == pytest.approx(loss_a, abs=1e-4)
    assert grads_p.keys() == grads_a.keys() and len(grads_p) > 10
    for n in grads_a:
        torch.testing.assert_close(grads_p[n], grads_a[n], atol=1e-4, rtol=1e-3, msg=n)


def test_compiled_decoder_layers_train_a_packed_row_as_the_eager_ones(hybrid, monkeypatch):
    """stages/speed.py compiles each decoder layer in place; a linear-attention layer's token mixing stays eager
    inside it (a graph break: fla's Triton wrappers, the data-dependent segment count, the reference's chunk loop).
    The compiled layers give the eager loss and gradients, and the row's segments are found once a pass, by the
    first linear-attention layer, for all three (and again for the next batch)."""
    from medgpt_ray.hybrid import segments
    from medgpt_ray.trainer_kit.checkpointing import decoder_layers

    found = []
    monkeypatch.setattr(segments, "cu_seqlens", lambda p, real=segments.cu_seqlens: found.append(1) or real(p))
    convs = _conversations(load(hybrid).config.vocab_size)
    row = _packed_row(convs, 96)
    eager_loss, eager_grads = _loss_and_grads(load(hybrid), [row])
    assert len(found) == 1  # three linear-attention layers, one pass: the segments once
    model = load(hybrid)
    torch._dynamo.reset()
    for layer in decoder_layers(model):
        layer.compile()
    loss, grads = _loss_and_grads(model, [row])
    assert loss == pytest.approx(eager_loss, abs=1e-5)
    for n in eager_grads:
        torch.testing.assert_close(grads[n], eager_grads[n], atol=1e-5, rtol=1e-4, msg=n)
    from medgpt_ray.stages.speed import compiled_graphs

    assert compiled_graphs() > 0
    second = _packed_row(convs[::-1], 96)  # another batch: its own segments
    before = len(found)
    _loss_and_grads(model, [second])
    assert len(found) == before + 1
    torch._dynamo.reset()


def test_transformers_own_layer_leaks_a_conversation_into_the_next(hybrid, tiny_model):
    """The leak our layer prevents, shown on transformers' layer; the dense tiny model is the control (its attention
    is block-diagonal, so the same construction changes nothing there)."""
    for model, leaks in ((load(tiny_model, ours=False), False), (load(hybrid, ours=False), True),
                         (load(hybrid), False)):
        convs = _conversations(model.config.vocab_size)
        with torch.no_grad():
            packed = model(**_packed_row(convs, 96), use_cache=False).logits[0, 11:81]
            alone = model(input_ids=convs[1][None], use_cache=False).logits[0]
        assert ((packed - alone).abs().max().item() > 1e-2) is leaks


def test_generation_on_our_layer_equals_transformers_own(hybrid):
    """With a cache (generate's prefill, then a token a step; hybrid/cached.py) our layer decodes as transformers'
    own: the same greedy tokens, for a left-padded batch too."""
    ours, stock = load(hybrid), load(hybrid, ours=False)
    a, b, _ = _conversations(ours.config.vocab_size)
    prompts = torch.stack([b[:40], torch.cat([torch.zeros(29, dtype=torch.long), a])])
    mask = torch.stack([torch.ones(40, dtype=torch.long), (torch.arange(40) >= 29).long()])
    kw = {"attention_mask": mask, "max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    got = ours.generate(prompts, **kw)
    assert got.shape == (2, 52) and torch.equal(got, stock.generate(prompts, **kw))


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


def test_packing_auto_packs_a_hybrid_and_trains_it(data, hybrid, tmp_path):
    built = build_stage(stage_inputs(data, hybrid, tmp_path / "auto", "auto"))
    report = built.extras["packing"]
    assert report["mode"] == packed_attention.ROWS and report["conversations"] > report["rows"]
    assert built.trainer.train_collate is not None
    built.trainer.train()
    losses = [h["loss"] for h in built.trainer.state.log_history if "loss" in h]
    assert len(losses) == 1 and losses[0] == losses[0]  # a real, finite step


def test_the_driver_plans_a_hybrid_packed_and_names_the_linear_attention_path(data, hybrid, tmp_path):
    """The driver plans from the data's lengths before any model is loaded: a hybrid is planned in packed rows like a
    dense model, and plan.json (and the plan line) say what its linear attention trains on."""
    from medgpt_ray.memory.format import plan_line

    inp = stage_inputs(data, hybrid, tmp_path, "auto", LengthProfile.of([90] * 10, 10, SEQ_LEN, 4.0))
    assert inp.plan.packing is not None
    assert inp.plan.linear_attention == "the PyTorch reference (a CPU run)"
    assert plan_line(inp.plan).endswith("; linear attention on the PyTorch reference (a CPU run)")
    built = build_stage(inp)
    assert built.extras["packing"]["mode"] == packed_attention.ROWS
    assert (built.trainer.args.per_device_train_batch_size, built.trainer.args.gradient_accumulation_steps) == \
        (inp.plan.micro_batch, inp.plan.grad_accum)


@pytest.fixture
def unchecked_model(tiny_model, tmp_path) -> Path:
    """The tiny model asking in its config.json for an attention function a user registered with transformers (SDPA's
    under another name): one packing is not checked for, so it cannot pack (no hybrid does: transformers' Qwen3.5
    refuses flex attention, which packing checks)."""
    import shutil

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("users_attention", sdpa_attention_forward)
    out = tmp_path / "unchecked"
    shutil.copytree(tiny_model, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "attn_implementation": "users_attention"}))
    return out


def test_a_packed_plan_the_worker_refuses_trains_padded_by_length_as_its_plan_says(data, unchecked_model, tmp_path):
    """A packed plan reaching a worker whose model cannot pack (here: an attention packing is not checked for)
    trains padded by length (memory/stage_plan.binned, trainer_kit/length_bins.py): micro-batches of as many
    bins as the plan had rows, each bin at most a packed row's tokens, with the packed plan's checkpointing (the
    fallback's plan is what trains: the H200's Qwen3.5 runs once trained another plan's fraction). The plan goes to
    the driver, which writes it to plan.json (run/job.py take_worker_plan). The batches are checked, not trained."""
    from dataclasses import replace

    from medgpt_ray.memory.lengths import BUCKET
    from medgpt_ray.memory.stage_plan import packed_rows
    from medgpt_ray.trainer_kit.checkpointing import SelectiveCheckpointing
    from medgpt_ray.trainer_kit.length_bins import LengthBinSampler

    inp = stage_inputs(data, unchecked_model, tmp_path, "auto")
    inp = replace(inp, plan=packed_rows(replace(inp.plan, ckpt_fraction=0.5, micro_batch=2), inp.cfg, 2, 2.0))
    records: list[dict] = []
    built = build_stage(inp, records.append)
    assert "padded by length" in built.extras["packing"]["planned_packed"]
    assert "attention 'users_attention' is not one packing is checked for" in built.extras["packing"]["why"]
    sent = [r["worker_plan"] for r in records if "worker_plan" in r]
    assert len(sent) == 1 and sent[0]["packing"] is None and sent[0]["length_bins"]["bin_tokens"] == SEQ_LEN
    bins = sent[0]["length_bins"]
    assert sent[0]["micro_batch"] * sent[0]["grad_accum"] == bins["bins_per_step"]
    selective = [cb.fraction for cb in built.trainer.callback_handler.callbacks
                 if isinstance(cb, SelectiveCheckpointing)]
    assert selective == [0.5] and sent[0]["ckpt_fraction"] == 0.5
    loader = built.trainer.get_train_dataloader()
    sampler = loader.base_dataloader.batch_sampler if hasattr(loader, "base_dataloader") else loader.batch_sampler
    assert isinstance(sampler, LengthBinSampler)
    for batch in loader:
        rows, width = batch["input_ids"].shape
        assert rows * (-(-width // BUCKET) * BUCKET) <= sent[0]["micro_batch"] * SEQ_LEN
    assert len(loader) == len(sampler) > 0 and max(len(b) for b in sampler) > sent[0]["micro_batch"]


def test_the_moe_family_gets_the_same_layer_and_packs_exactly():
    """Qwen3.5-MoE's Gated DeltaNet and decoder layers are their own classes in transformers: they get the layer too,
    and a packed row's loss equals its conversations' alone."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from tests.stages.hybrid_models import LINEAR

    cfg = Qwen3_5MoeTextConfig(vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=32, **LINEAR)
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(cfg).float().eval()
    assert hybrid_layers.install(model) == 3
    convs = _conversations(cfg.vocab_size)
    with torch.no_grad():
        packed = model(**_packed_row(convs, 96), use_cache=False).logits[0, 11:81]
        alone = model(input_ids=convs[1][None], use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-4)


def test_flex_attention_asked_of_a_hybrid_is_a_sentence_naming_the_key(hybrid):
    """transformers' Qwen3.5 cannot run flex attention: `attention: flex` on it is a ConfigError naming the key and
    the model class, not a traceback from inside transformers."""
    from medgpt_ray.config import ConfigError
    from medgpt_ray.trainer_kit.packed_attention import use_attention

    model = load(hybrid)
    with pytest.raises(ConfigError, match=r"stages\.sft\.attention: flex, but Qwen3_5ForCausalLM cannot run it"):
        use_attention(model, "flex")
