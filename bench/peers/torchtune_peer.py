"""Issue 50's torchtune peer: the common job (common.JOB) by torchtune 0.6.1's own `lora_finetune_single_device` recipe.

The recipe (LoRAFinetuneRecipeSingleDevice, from the `recipes` folder torchtune's wheel ships) runs in this process
(so common.cap_memory and the hooks apply) with the config torchtune ships for it, qwen2_5/7B_lora_single_device.yaml,
overridden for the job: LoRA r16/alpha32 on q,k,v,output and the MLP, torchtune's chat_dataset over the ShareGPT file,
packed to 2048, 3 packs a step, no accumulation, activation checkpointing, bf16, AdamW at JOB.lr, its chunked CE.
Model: a Qwen2.5-7B config.json (hidden 3584, 28 layers) gets `lora_qwen2_5_7b_instruct` (the shipped config's);
any other Qwen2 config the component builder `lora_qwen2` with its dims; Qwen3 is refused (0.6.1 has no builders).

    bash bench/peers/wheels_torchtune.sh      # once: .whl-peer-torchtune/ (torchtune, torchao 0.15, omegaconf, ...)
    # GPU (image: Python 3.12, torch 2.11):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-torchtune .whl-peer-torchtune/*.whl
    PYTHONPATH=/tmp/peer-torchtune python3 bench/peers/torchtune_peer.py --model-dir MODEL --data sft.jsonl \
        --out $OUT/torchtune.json --work /tmp/tt-work [--compile false] [--quant 4bit] [--profile 3]
    # CPU smoke (.venv is Python 3.11: its own tiktoken/sentencepiece; datasets and Pillow are .venv's):
    .venv/bin/python -m pip install -q --no-deps --target /tmp/peer-tt-cpu .whl-peer-torchtune/{torchtune,torchao,\
torchdata,omegaconf,antlr4}*.whl tiktoken==0.14.0 sentencepiece==0.2.3
    PYTHONPATH=/tmp/peer-tt-cpu .venv/bin/python bench/peers/torchtune_peer.py --model-dir TINY_QWEN2 \
        --data /tmp/ttcorpus/sft.jsonl --steps 3 --compile false --out /tmp/tt.json --work /tmp/ttwork
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    JOB,
    StepClock,
    cap_memory,
    compare_counts,
    load_conversations,
    reference_token_counts,
    write_result,
)

SHIPPED_CONFIG = "recipes/configs/qwen2_5/7B_lora_single_device.yaml"
RECIPE_FILE = "recipes/lora_finetune_single_device.py"


def write_tokenizer_files(model_dir: Path, dest: Path) -> tuple[dict[str, str], list[str]]:
    """vocab.json, merges.txt and a special-tokens file, from the model dir's tokenizer.json (all it carries)."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if tok["model"]["type"] != "BPE":
        raise SystemExit(f"{model_dir}/tokenizer.json: a {tok['model']['type']} model, not the byte-level BPE "
                         "torchtune's Qwen2 tokenizer reads")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "vocab.json").write_text(json.dumps(tok["model"]["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    (dest / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = list(tok["added_tokens"])
    have = {t["content"] for t in added}
    # Qwen2_5Tokenizer.__init__ reads special_tokens["<tool_call>"] and ["</tool_call>"]: a tokenizer.json without
    # them (ours: 3 specials) raises KeyError, so they are added at Qwen2.5's ids (used by tool-call messages only).
    extra = {k: v for k, v in {"<tool_call>": 151657, "</tool_call>": 151658}.items() if k not in have}
    added += [{"id": v, "content": k} for k, v in extra.items()]
    (dest / "special_tokens.json").write_text(json.dumps({"added_tokens": added}), encoding="utf-8")
    notes = [f"tokenizer: vocab.json and merges.txt written from {model_dir.name}/tokenizer.json's BPE model "
             f"({len(tok['model']['vocab'])} tokens, {len(merges)} merges; a conversion: the model dir has no "
             "vocab.json/merges.txt); special_tokens_path is tokenizer.json's added_tokens "
             + (f"plus {sorted(extra)} at Qwen2.5's ids, which Qwen2_5Tokenizer requires" if extra else "")]
    return {"path": str(dest / "vocab.json"), "merges_file": str(dest / "merges.txt"),
            "special_tokens_path": str(dest / "special_tokens.json")}, notes


def model_component(cfg: dict[str, Any], quant: str) -> tuple[dict[str, Any], str]:
    lora = {"lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
            "apply_lora_to_output": False, "lora_rank": JOB.lora_r, "lora_alpha": JOB.lora_alpha,
            "lora_dropout": JOB.lora_dropout, "quantize_base": quant == "4bit"}
    kind = cfg.get("model_type")
    if kind and kind.startswith("qwen3"):
        if importlib.util.find_spec("torchtune.models.qwen3") is None:
            raise SystemExit(f"refused: {kind} config, and torchtune 0.6.1 has no Qwen3 builders (no "
                             "torchtune.models.qwen3); run its Qwen2.5-7B builder on a Qwen2.5-7B model dir instead")
        raise SystemExit(f"refused: {kind}: this torchtune has torchtune.models.qwen3, which this script does not map")
    if kind not in ("qwen2", None):
        raise SystemExit(f"refused: model_type {kind}: only Qwen2/Qwen2.5 configs map to torchtune's Qwen2 builders")
    if cfg["hidden_size"] == 3584 and cfg["num_hidden_layers"] == 28:
        want = {"vocab_size": 152064, "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944}
        bad = {k: cfg.get(k) for k, v in want.items() if cfg.get(k) != v}
        if bad:
            raise SystemExit(f"refused: hidden 3584 x 28 layers but {bad} differ from Qwen2.5-7B's {want}")
        return {"_component_": "torchtune.models.qwen2_5.lora_qwen2_5_7b_instruct", **lora}, "qwen2.5-7b builder"
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e6)
    dims = {"vocab_size": cfg["vocab_size"], "num_layers": cfg["num_hidden_layers"],
            "num_heads": cfg["num_attention_heads"], "num_kv_heads": cfg["num_key_value_heads"],
            "embed_dim": cfg["hidden_size"], "intermediate_dim": cfg["intermediate_size"],
            "max_seq_len": cfg.get("max_position_embeddings", JOB.seq_len), "norm_eps": cfg.get("rms_norm_eps", 1e-6),
            "rope_base": float(rope), "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False))}
    return {"_component_": "torchtune.models.qwen2.lora_qwen2", **dims, **lora}, "qwen2 component builder"


def profile_summary(prof: Any, seconds: float, top: int = 12) -> dict[str, Any]:
    """Top kernels by device time (CPU ops on CPU) and the share of the profiled wall time a kernel was running."""
    import torch
    from torch.autograd import DeviceType

    cuda = torch.cuda.is_available()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = sorted((e for e in prof.key_averages() if getattr(e, key, 0) > 0), key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in rows) or 1
    out: dict[str, Any] = {"wall_s": round(seconds, 3), "by": key, "top": [
        {"name": e.key[:120], "us": round(getattr(e, key)), "share": round(getattr(e, key) / total, 4),
         "calls": e.count} for e in rows[:top]]}
    if cuda:  # union of kernel intervals over the profiled wall time
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == DeviceType.CUDA)
        busy, end = 0.0, float("-inf")
        for s, t in spans:
            if t > end:
                busy += t - max(s, end)
                end = t
        out["gpu_busy_share"] = round(busy / 1e6 / seconds, 4) if seconds > 0 else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="ShareGPT jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=JOB.steps)
    ap.add_argument("--cap-gib", type=float, default=JOB.cap_gib)
    ap.add_argument("--compile", choices=["true", "false"], default="true")
    ap.add_argument("--quant", choices=["none", "4bit"], default="none")
    ap.add_argument("--profile", type=int, default=0, help="profile N optimizer steps after step 3")
    args = ap.parse_args()
    fraction = cap_memory(args.cap_gib)

    import torch
    import torchtune
    from omegaconf import OmegaConf
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torchtune.data import ShareGPTToMessages

    root = Path(torchtune.__file__).parent.parent
    spec = importlib.util.spec_from_file_location("tt_lora_finetune_single_device", root / RECIPE_FILE)
    assert spec is not None and spec.loader is not None
    recipe_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe_mod)

    class Recipe(recipe_mod.LoRAFinetuneRecipeSingleDevice):  # type: ignore[name-defined,misc]
        def save_checkpoint(self, epoch: int) -> None:  # no 15 GB merged checkpoint at the end
            pass

    model_dir, work = args.model_dir.resolve(), args.work.resolve()
    hf_cfg = json.loads((model_dir / "config.json").read_text())
    model_cfg, builder = model_component(hf_cfg, args.quant)
    tok_files, notes = write_tokenizer_files(model_dir, work / "tokenizer")
    cuda = torch.cuda.is_available()
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not shards:
        raise SystemExit(f"{model_dir}: no *.safetensors")
    cfg = OmegaConf.load(root / SHIPPED_CONFIG)
    overrides = {
        "output_dir": str(work / "output"), "model": model_cfg,
        "tokenizer": {"_component_": "torchtune.models.qwen2_5.qwen2_5_tokenizer", **tok_files,
                      "max_seq_len": JOB.seq_len},
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": str(model_dir),
                         "checkpoint_files": shards, "recipe_checkpoint": None, "output_dir": str(work / "output"),
                         "model_type": "QWEN2"},
        "dataset": {"_component_": "torchtune.datasets.chat_dataset", "source": "json",
                    "data_files": str(args.data.resolve()), "split": "train", "conversation_column": "conversations",
                    "conversation_style": "sharegpt", "packed": True},
        "seed": JOB.seed, "shuffle": False, "batch_size": JOB.packed_rows_per_step,
        "optimizer": {"lr": JOB.lr}, "lr_scheduler": {"num_warmup_steps": 0},
        "epochs": 1, "max_steps_per_epoch": args.steps, "gradient_accumulation_steps": 1,
        "compile": args.compile == "true", "device": "cuda" if cuda else "cpu", "dtype": "bf16",
        "enable_activation_checkpointing": True, "enable_activation_offloading": False,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": str(work / "logs")},
        "log_every_n_steps": 1, "log_peak_memory_stats": False, "profiler": {"enabled": False},
    }
    cfg = OmegaConf.merge(cfg, OmegaConf.create(overrides))
    cfg.model = OmegaConf.create(model_cfg)  # replace, not merge: the component builder takes other keys

    recipe = Recipe(cfg=cfg)
    t0 = time.perf_counter()
    recipe.setup(cfg=cfg)
    setup_s = time.perf_counter() - t0
    tokenizer, model = recipe._tokenizer, recipe._model
    pad_id = tokenizer.pad_id

    clock = StepClock()
    prof: dict[str, Any] = {"summary": None}

    def count_tokens(_module: torch.nn.Module, args_: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tokens = kwargs.get("tokens", args_[0] if args_ else None)
        clock.add_batch((tokens != pad_id).sum().item(), tokens.numel())

    def after_step(_opt: torch.optim.Optimizer, _a: Any, _k: Any) -> None:
        clock.step()
        n = len(clock.seconds)
        if args.profile and n == 3:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            prof["p"], prof["t"] = torch.profiler.profile(activities=acts), time.perf_counter()
            prof["p"].start()
        elif args.profile and n == 3 + args.profile and "p" in prof:
            stop_profile()

    def stop_profile() -> None:
        p = prof.pop("p")
        p.stop()
        prof["summary"] = profile_summary(p, time.perf_counter() - prof["t"])

    logger = recipe._metric_logger
    log_dict = logger.log_dict

    def log_and_keep(payload: dict[str, Any], step: int) -> None:
        if "loss" in payload:
            clock.losses.append(float(payload["loss"]))
        log_dict(payload, step)

    logger.log_dict = log_and_keep
    model.register_forward_pre_hook(count_tokens, with_kwargs=True)
    hook = register_optimizer_step_post_hook(after_step)
    clock.start()
    recipe.train()
    hook.remove()
    if "p" in prof:  # fewer steps than 3 + N
        stop_profile()
    recipe.cleanup()
    if len(clock.seconds) < args.steps:
        notes.append(f"only {len(clock.seconds)} of {args.steps} steps: the packed dataset has "
                     f"{len(recipe._dataloader.dataset)} packs of {JOB.seq_len}, {JOB.packed_rows_per_step} a step")

    # Token check: the same messages chat_dataset builds (ShareGPTToMessages, train_on_input False), tokenized by the
    # recipe's own tokenizer (its BPE cache is warm from the dataset pass).
    to_messages = ShareGPTToMessages(train_on_input=False)
    tool_counts = []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids, _ = tokenizer.tokenize_messages(to_messages(json.loads(line))["messages"])
                tool_counts.append(len(ids))
    reference = reference_token_counts(model_dir, load_conversations(args.data), JOB.seq_len)
    check = compare_counts(reference, tool_counts)
    notes += [
        "recipe: torchtune's lora_finetune_single_device (LoRAFinetuneRecipeSingleDevice) in-process, config "
        f"{SHIPPED_CONFIG} with the overrides in settings.overrides; save_checkpoint is a no-op (a subclass), so "
        "no merged checkpoint is written",
        f"model: {model_cfg['_component_']} ({builder}); Qwen2.5-7B base and instruct builders differ only in "
        "max_seq_len (RoPE cache 131072 vs 32768)",
        "timing: StepClock.step from torch.optim's global step post-hook (after optimizer.step, before zero_grad); "
        "real tokens = tokens != pad_id (<|endoftext|>) per micro-batch from a forward pre-hook on the model, "
        "padded = rows x 2048 (PackedDataset pads each pack's tail with pad_id); losses are what the recipe logs "
        "(running loss / unmasked tokens, prompts masked: train_on_input False, chat_dataset's default)",
        "lr_scheduler: the shipped cosine with num_warmup_steps 0 (shipped: 100, longer than the job); shuffle False "
        "(packs in file order); AdamW fused, weight_decay 0.01 as shipped",
        "torchtune's chat format ends the last assistant turn with <|im_end|> as eos and no trailing newline "
        "(the chat template adds <|im_end|>\\n): -1 a conversation in the token check, except those cut at 2048; "
        "it adds no system prompt",
        "packing: torchtune's PackedDataset, greedy in file order (a conversation that does not fit closes the "
        "pack, padded to 2048); tokenizing and packing the whole file happen in setup, untimed",
    ]
    if args.quant == "4bit":
        notes.append("4bit: quantize_base=True on the same builder (torchao NF4 base weights, torchtune's QLoRA; "
                     "0.6.1 has no qlora_qwen2_5 builder)")
    if cuda:
        notes.append("packed batches use flex attention with a block-causal BlockMask, which torchtune always "
                     "compiles (torch.compile(flex_attention)), whatever --compile says")
    else:
        notes.append("CPU: no flex attention; packs get a dense block-causal mask (SDPA); bf16 on CPU")
    settings = {"recipe": RECIPE_FILE, "config": SHIPPED_CONFIG, "overrides": overrides, "builder": builder,
                "resolved_config": OmegaConf.to_container(cfg, resolve=True), "compile": args.compile,
                "quant": args.quant, "steps": args.steps, "memory_fraction": fraction, "setup_s": round(setup_s, 1),
                "packs": len(recipe._dataloader.dataset), "pad_id": pad_id, "eos_id": tokenizer.eos_id,
                "special_tokens": tokenizer.special_tokens,
                "profile": prof["summary"], "torchao": _version("torchao")}
    write_result(args.out, tool="torchtune", version=torchtune.__version__, settings=settings, clock=clock,
                 model_dir=model_dir, data=args.data, token_check=check, notes=notes)


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
