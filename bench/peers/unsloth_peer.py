"""Issue 50's Unsloth peer: the common job (common.JOB) by Unsloth 2026.10.9's own API, as its notebooks train.

`FastLanguageModel.from_pretrained` (the local model dir, offline, bf16, max_seq_length 2048; --quant 4bit loads it
in 4-bit: QLoRA), `FastLanguageModel.get_peft_model` (r 16, alpha 32, dropout 0 on q,k,v,o,gate,up,down, bias none,
use_gradient_checkpointing "unsloth"), the ShareGPT file rendered to a "text" column by the tokenizer's own chat
template (tokenize=False, the notebooks' formatting step), TRL's SFTTrainer / SFTConfig as Unsloth patches them:
3 packed rows of 2048 a step (packing=True: Unsloth turns it into padding-free rows with packed_seq_lengths), no
accumulation, bf16, JOB.lr, linear schedule without warmup, adamw_8bit (the notebooks') when bitsandbytes imports,
else adamw_torch. `import unsloth` comes first (before transformers, trl, peft), after common.cap_memory.

    bash bench/peers/wheels_unsloth.sh        # once: .whl-peer-unsloth/ (~14 MB)
    # GPU (image: Python 3.12, torch 2.11, transformers 5.17), as bench/peers/run.sh runs it:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-unsloth .whl-peer-unsloth/*.whl
    PYTHONPATH=/tmp/peer-unsloth python3 bench/peers/unsloth_peer.py --model-dir MODEL --data sft.jsonl \
        --work /tmp/us-work --out $OUT/unsloth.json [--quant 4bit] [--profile 2]
    # CPU, without Unsloth: the data conversion and the token check only (Unsloth's tokenization rule, replayed)
    .venv/bin/python bench/peers/unsloth_peer.py --model-dir TINY --data sft.jsonl --out /tmp/us.json --check-only
    # CPU with Unsloth (a side site of transformers 5.17, trl 1.15, datasets 4.8.5 and the two unsloth wheels): it
    # picks its CPU backend (stock transformers + PEFT + TRL, packing off), so this smokes the script, not the GPU path
    PYTHONPATH=SIDE_SITE .venv/bin/python bench/peers/unsloth_peer.py --model-dir TINY --data sft.jsonl --steps 3 \
        --out /tmp/us.json --work /tmp/us-work
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    JOB,
    LINEAR_MODULES,
    StepClock,
    cap_memory,
    compare_counts,
    load_conversations,
    reference_token_counts,
    write_result,
)

# Before anything imports huggingface_hub or unsloth. The offline switches stop Unsloth's network use: its statistics
# ping (get_statistics: snapshot_download of unslothai/<environment> repos, up to 120 s without network) and its
# has_internet() probe of 8.8.8.8:53 return early under HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, as does the mapper
# refresh from raw.githubusercontent.com in get_model_name; UNSLOTH_DISABLE_STATISTICS stops the ping by itself too.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "UNSLOTH_DISABLE_STATISTICS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
STAGE = {"at": "start"}  # where a failed run stopped, for its "failed" JSON


def render(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[str]:
    """The notebooks' formatting step: each conversation as the chat template's text, no generation prompt."""
    return [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=False) for c in conversations]


def replayed_counts(tokenizer: Any, texts: list[str]) -> list[int]:
    """unsloth_zoo.dataset_utils.sft_prepare_dataset's rule for a "text" column, replayed: tokenizer(text,
    truncation at max_length, add_special_tokens unless the template or the text already carries the BOS)."""
    bos = getattr(tokenizer, "bos_token", None)
    special = not (bos and (bos in (tokenizer.chat_template or "") or any(t.startswith(bos) for t in texts[:1])))
    out = tokenizer(texts, truncation=True, max_length=JOB.seq_len, add_special_tokens=special)["input_ids"]
    return [len(ids) for ids in out]


def unsloth_counts(tokenizer: Any, texts: list[str]) -> tuple[list[int], str]:
    """Per-conversation tokens by Unsloth's own SFT dataset preparation (the function its patched SFTTrainer runs
    in place of TRL's _prepare_dataset), unpacked so they stay in file order; the replayed rule if that fails."""
    try:
        from datasets import Dataset
        from unsloth_zoo.dataset_utils import sft_prepare_dataset

        cfg = SimpleNamespace(max_length=JOB.seq_len, dataset_text_field="text", dataset_num_proc=1,
                              assistant_only_loss=False, completion_only_loss=None)
        ds = sft_prepare_dataset(SimpleNamespace(model=None), Dataset.from_dict({"text": texts}), tokenizer, cfg,
                                 packing=False, formatting_func=None, dataset_name="token-check")
        return [len(ids) for ids in ds["input_ids"]], "unsloth_zoo.dataset_utils.sft_prepare_dataset (packing off)"
    except Exception as e:  # noqa: BLE001 - the check must not cost the run
        return replayed_counts(tokenizer, texts), f"replayed rule ({type(e).__name__}: {e})"


def attention_path() -> dict[str, Any]:
    """Which attention Unsloth's packed rows take (attention_dispatch.select_attention_backend): flash-attn varlen,
    xformers' block-diagonal mask, or SDPA (torch's varlen_attn, which needs torch >= 2.12, or one call a segment)."""
    try:
        from unsloth.models import _utils as u
        from unsloth.utils import attention_dispatch as ad

        return {"packed_backend": ad.select_attention_backend(use_varlen=True),
                "flash_attn": bool(getattr(u, "HAS_FLASH_ATTENTION", False)),
                "xformers": getattr(u, "xformers_version", None), "xformers_usable": bool(ad.HAS_XFORMERS),
                "torch_varlen_attn": getattr(ad, "_TORCH_VARLEN_ATTN", None) is not None,
                "sdpa_packed_segments": getattr(ad, "_SDPA_PACKED_SEGMENTS", None)}
    except Exception as e:  # noqa: BLE001 - a record, not a requirement
        return {"error": f"{type(e).__name__}: {e}"}


def profile_top(prof: Any, seconds: float, top: int = 12) -> dict[str, Any]:
    import torch

    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    rows = sorted((e for e in prof.key_averages() if getattr(e, key, 0) > 0), key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in rows) or 1
    return {"wall_s": round(seconds, 3), "by": key, "top": [
        {"name": e.key[:120], "us": round(getattr(e, key)), "share": round(getattr(e, key) / total, 4),
         "calls": e.count} for e in rows[:top]]}


def train(args: argparse.Namespace, conversations: list[list[dict[str, str]]]) -> None:
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", str(work / "unsloth_compiled_cache"))
    # unsloth_zoo sets this at import on torch >= 2.10 when unset; set here first because cap_memory starts CUDA
    # (and its allocator reads the variable then), before `import unsloth` could.
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    import torch

    fraction = cap_memory(args.cap_gib)  # before Unsloth allocates anything
    STAGE["at"] = "import unsloth"
    t0 = time.perf_counter()
    import unsloth  # noqa: I001 - first: it patches transformers, trl and peft as they import
    from unsloth import FastLanguageModel

    import_s = time.perf_counter() - t0
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    STAGE["at"], t0 = "load", time.perf_counter()
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(args.model_dir.resolve()), max_seq_length=JOB.seq_len, dtype=torch.bfloat16,
        load_in_4bit=args.quant == "4bit", local_files_only=True)
    model = FastLanguageModel.get_peft_model(
        model, r=JOB.lora_r, lora_alpha=JOB.lora_alpha, lora_dropout=JOB.lora_dropout,
        target_modules=list(LINEAR_MODULES), bias="none", use_gradient_checkpointing="unsloth",
        random_state=JOB.seed)
    load_s = time.perf_counter() - t0

    texts = render(tokenizer, conversations)
    counts, counted_by = unsloth_counts(tokenizer, texts)
    optim = args.optim
    if optim == "auto":
        try:
            import bitsandbytes  # noqa: F401

            optim = "adamw_8bit"
        except Exception:  # noqa: BLE001 - missing or unloadable: either way not usable
            optim = "adamw_torch"
    config = SFTConfig(
        output_dir=str(work / "output"), per_device_train_batch_size=JOB.packed_rows_per_step,
        gradient_accumulation_steps=1, max_steps=args.steps, learning_rate=JOB.lr, lr_scheduler_type="linear",
        warmup_steps=0, weight_decay=0.001, optim=optim, bf16=cuda, logging_steps=1, report_to="none",
        save_strategy="no", seed=JOB.seed, dataset_text_field="text", max_length=JOB.seq_len, packing=True,
        dataset_num_proc=1, disable_tqdm=True)

    clock = StepClock()
    prof: dict[str, Any] = {}

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            clock.start()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            clock.step()  # losses come from on_log: the step's own log follows on_step_end
            n = len(clock.seconds)
            if args.profile and n == 3:
                acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
                prof["p"], prof["t"] = torch.profiler.profile(activities=acts), time.perf_counter()
                prof["p"].start()
            elif args.profile and n == 3 + args.profile and "p" in prof:
                prof["p"].stop()
                prof["summary"] = profile_top(prof["p"], time.perf_counter() - prof["t"])

        def on_log(self, *_: Any, logs: dict[str, Any] | None = None, **__: Any) -> None:
            if logs and "loss" in logs:
                clock.losses.append(float(logs["loss"]))

    STAGE["at"], t0 = "SFTTrainer", time.perf_counter()
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_dict({"text": texts}),
                         args=config, callbacks=[Clock()])
    prepare_s = time.perf_counter() - t0

    seen: set[str] = set()

    def count(_m: torch.nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
        ids = kw.get("input_ids", a[0] if a else None)
        if ids is None:
            return
        lengths, mask = kw.get("packed_seq_lengths"), kw.get("attention_mask")
        real = int(lengths.sum()) if lengths is not None else int(mask.sum()) if mask is not None else ids.numel()
        clock.add_batch(real, ids.numel())
        seen.update(k for k, v in kw.items() if v is not None)

    STAGE["at"] = "train"
    hook = trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    trainer.train()
    hook.remove()

    STAGE["at"] = "token check and result"
    packed = trainer.train_dataset
    packed_lengths = sorted(n for row in packed["seq_lengths"] for n in row) if "seq_lengths" in packed.column_names \
        else None
    reference = reference_token_counts(args.model_dir.resolve(), conversations, JOB.seq_len)
    check = compare_counts(reference, counts)
    check["counted_by"] = counted_by
    check["packed_dataset_same_lengths"] = None if packed_lengths is None else packed_lengths == sorted(counts)
    targs = trainer.args
    settings = {
        "quant": args.quant, "steps": args.steps, "memory_fraction": fraction, "optim": optim,
        "ckpt_fraction": 1.0,  # use_gradient_checkpointing "unsloth": every decoder layer, its inputs offloaded
        "packing": bool(getattr(targs, "packing", False)), "padding_free": bool(getattr(targs, "padding_free", False)),
        "packing_strategy": getattr(targs, "packing_strategy", None), "packed_rows": len(packed),
        "batch_keys": sorted(seen), "attention": attention_path(),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "trainer_class": type(trainer).__name__, "trl": _version("trl"), "transformers": _version("transformers"),
        "peft": _version("peft"), "datasets": _version("datasets"), "unsloth_zoo": _version("unsloth_zoo"),
        "bitsandbytes": _version("bitsandbytes"), "triton": _version("triton"),
        "env": {k: os.environ.get(k) for k in (*OFFLINE_ENV, "UNSLOTH_COMPILE_LOCATION", "PYTORCH_ALLOC_CONF")},
        "import_s": round(import_s, 1), "load_s": round(load_s, 1), "prepare_s": round(prepare_s, 1),
        "profile": prof.get("summary"),
        "sft_config": {k: getattr(targs, k, None) for k in (
            "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "learning_rate",
            "lr_scheduler_type", "warmup_steps", "weight_decay", "bf16", "max_length", "dataset_text_field",
            "gradient_checkpointing", "seed", "remove_unused_columns")},
    }
    notes = [
        "model and adapters: FastLanguageModel.from_pretrained(local dir, local_files_only, max_seq_length 2048, "
        f"dtype bf16, load_in_4bit {args.quant == '4bit'}) then FastLanguageModel.get_peft_model(r 16, alpha 32, "
        "dropout 0, all 7 linear projections, bias none, use_gradient_checkpointing 'unsloth')",
        "data: ShareGPT -> messages (common.load_conversations) -> tokenizer.apply_chat_template(tokenize=False) as a "
        "'text' column; SFTTrainer(packing=True, max_length 2048): Unsloth tokenizes (truncating at 2048), TRL packs "
        "(bfd) into rows of <= 2048, Unsloth's collator hands a step's 3 rows as one padding-free row with "
        f"packed_seq_lengths; as the trainer ended: packing {bool(getattr(targs, 'packing', False))}, padding_free "
        f"{bool(getattr(targs, 'padding_free', False))}, {len(packed)} rows",
        "timing: StepClock.step in a TrainerCallback's on_step_end (after the optimizer step), clock.start in "
        "on_train_begin; tokens from a forward pre-hook on trainer.model: real = sum(packed_seq_lengths) (else "
        "attention_mask.sum(), else numel), padded = input_ids.numel() (padding-free: the same); losses from on_log",
        f"optimizer: {optim} ({'bitsandbytes imports' if optim == 'adamw_8bit' else 'no bitsandbytes'}); "
        "lr_scheduler linear, warmup 0 (the notebooks: 5), weight_decay 0.001 as the notebooks",
        "network: " + ", ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items()) + " before import",
    ]
    if not sum(clock.real_tokens):
        notes.append("no tokens counted: the forward pre-hook on trainer.model never fired (tokens/s is null)")
    if len(clock.seconds) < args.steps:
        notes.append(f"only {len(clock.seconds)} of {args.steps} steps ran")
    if args.profile:
        notes.append(f"--profile {args.profile}: torch.profiler ran over steps 4-{3 + args.profile}, inside the "
                     "measured range")
    write_result(args.out, tool="unsloth", version=unsloth.__version__,
                 settings=settings, clock=clock, model_dir=args.model_dir.resolve(), data=args.data,
                 token_check=check, notes=notes)


def check_only(args: argparse.Namespace, conversations: list[list[dict[str, str]]]) -> None:
    """No Unsloth: the rendered texts and Unsloth's tokenization rule replayed, against the reference counts."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model_dir), local_files_only=True)
    texts = render(tok, conversations)
    check = compare_counts(reference_token_counts(args.model_dir, conversations, JOB.seq_len),
                           replayed_counts(tok, texts))
    doc = {"mode": "check-only", "conversations": len(conversations), "token_check": check,
           "first_text": texts[0][:300] if texts else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False))
    print(json.dumps(check))


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="ShareGPT jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/unsloth-peer"))
    ap.add_argument("--steps", type=int, default=JOB.steps)
    ap.add_argument("--cap-gib", type=float, default=JOB.cap_gib)
    ap.add_argument("--quant", choices=["none", "4bit"], default="none")
    ap.add_argument("--optim", default="auto", help="auto: adamw_8bit when bitsandbytes imports, else adamw_torch")
    ap.add_argument("--profile", type=int, default=0, help="profile N optimizer steps after step 3")
    ap.add_argument("--check-only", action="store_true", help="no Unsloth: data conversion and token check only")
    args = ap.parse_args()
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    conversations = load_conversations(args.data)
    if args.check_only:
        return check_only(args, conversations)
    try:
        train(args, conversations)
    except BaseException as e:  # a row that did not run: table.py names it with its reason
        import json
        import traceback

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "tool": "unsloth", "version": _version("unsloth"), "model_name": args.model_dir.name,
            "failed": f"{STAGE['at']}: {type(e).__name__}: {str(e)[:300]}", "quant": args.quant,
            "traceback": traceback.format_exc()[-4000:]}, indent=1))
        raise


if __name__ == "__main__":
    main()
