"""Load models and tokenizers from local directories only; attach LoRA/QLoRA; merge adapters.

Nothing here downloads: a model path that is not a local checkpoint directory
is an error, and loads pass `local_files_only=True`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from medgpt_ray.config.lora_targets import expert_parameters, resolve_lora_targets
from medgpt_ray.hybrid.layers import install as install_hybrid_layers


class ModelPathError(FileNotFoundError):
    pass


class QLoRAUnavailable(RuntimeError):
    pass


def resolve_model_path(path: str) -> Path:
    """`tiny` -> the cached tiny preset (built if needed); anything else must be a local HF directory."""
    if path == "tiny":
        from medgpt_ray.tiny import ensure_tiny

        return ensure_tiny()
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ModelPathError(
            f"model.path '{path}' is not a local Hugging Face checkpoint directory (no config.json there); "
            f"medgpt-ray never downloads models: point model.path at a directory or use the preset 'tiny'"
        )
    return p.resolve()


def model_config_dict(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text(encoding="utf-8"))


def torch_dtype(precision: str) -> torch.dtype:
    # amp-bf16 keeps fp32 master weights (autocast does the bf16 math); bf16 holds weights in bf16.
    return torch.bfloat16 if precision == "bf16" else torch.float32


def context_length(model: Any) -> int | None:
    """The tokens the model reads at most (its position embeddings), where its config says; a composite model's
    text part."""
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return int(context) if isinstance(context, int) and context > 0 else None


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.pad_token is None:
        # Reusing EOS as padding is safe here: labels of padding are always -100.
        tok.pad_token = tok.eos_token
    return tok


def vocabulary_difference(a: Path, b: Path) -> str | None:
    """Why two model directories' tokenizers do not encode alike (their vocabularies or special tokens differ), None
    when they do: a distillation's teacher and student must score the same token ids."""
    ta, tb = load_tokenizer(a), load_tokenizer(b)
    if len(ta) != len(tb):
        return f"{len(ta):,} tokens in {a}, {len(tb):,} in {b}"
    va, vb = ta.get_vocab(), tb.get_vocab()
    if va != vb:
        differ = sum(1 for t, i in va.items() if vb.get(t) != i)
        return f"{differ:,} of the {len(va):,} tokens have other ids in {b} than in {a}"
    if ta.all_special_tokens != tb.all_special_tokens:
        return f"the special tokens differ: {ta.all_special_tokens} in {a}, {tb.all_special_tokens} in {b}"
    return None


def _quantization_config(method: str):
    if method != "qlora":
        return None
    if not torch.cuda.is_available():
        raise QLoRAUnavailable(
            "method 'qlora' needs a CUDA GPU (bitsandbytes 4-bit); this process has none. "
            "Use method 'lora' on CPU."
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise QLoRAUnavailable(
            "method 'qlora' needs bitsandbytes: pip install 'medgpt-ray[gpu]'"
        ) from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_causal_lm(path: Path, precision: str, method: str):
    """The checkpoint's causal LM. Of a composite vision-language checkpoint (Qwen3.5's `qwen3_5`, a vision tower
    and a `text_config`) transformers builds the text model alone (`Qwen3_5ForCausalLM`) and leaves the vision
    weights unread: stages train and save the text model; `medgpt-ray export` puts the base's vision tower back
    (run/export.py)."""
    from transformers import AutoModelForCausalLM

    quant = _quantization_config(method)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(precision), "local_files_only": True}
    if quant is not None:
        kwargs["quantization_config"] = quant
    # No peft.prepare_model_for_kbit_training under QLoRA: it would upcast the embeddings, the LM head
    # and the norms to fp32 (+2.2 GB on a 7B); they stay bf16 like the LoRA path, and PEFT freezes the base. TRL's
    # ORPO and CPO trainers would call it themselves: orpo and simpo go through lora_without_kbit_prep.
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    # A hybrid's linear-attention layers keep packed conversations apart and pick their kernels per call
    # (hybrid/layers.py); a dense model is left as it is.
    install_hybrid_layers(model)
    # Every generate on this model (rollouts, held-out greedy answers, the engine) keeps the KV cache. The Trainer
    # writes `use_cache: false` into every checkpoint's config.json (transformers 5.24's TrainingArguments.use_cache
    # defaults to False); a directory without generation_config.json gets its generation config from config.json,
    # and generate then re-runs the whole prefix at every new token (tests/stages/test_rollout_kv_cache.py).
    model.generation_config.use_cache = True
    return model


def load_reward_model(path: Path, precision: str, method: str, pad_token_id: int):
    from transformers import AutoModelForSequenceClassification

    quant = _quantization_config(method)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(precision), "local_files_only": True, "num_labels": 1}
    if quant is not None:
        kwargs["quantization_config"] = quant
    model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
    model.config.pad_token_id = pad_token_id
    install_hybrid_layers(model)
    return model


def lora_config(lora, task_type: str, model):
    """PEFT LoraConfig from our LoraConfig for the loaded `model`; SEQ_CLS keeps the fresh reward head trainable and
    saved. `all-linear` on a mixture-of-experts family becomes its explicit targets (config/lora_targets.py): the
    planner counts the same ones (memory/shape_model.py); `lora.experts` adds the routed experts' fused tensors."""
    from peft import LoraConfig as PeftLoraConfig

    text = model.config.get_text_config()  # a composite (vision-language) model's decoder
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=resolve_lora_targets(lora.targets, getattr(text, "model_type", None)),
        target_parameters=expert_parameters(lora.experts, getattr(text, "model_type", None)),
        task_type=task_type,
        modules_to_save=["score"] if task_type == "SEQ_CLS" else None,
    )


def is_kbit(model) -> bool:
    """The flags TRL and PEFT read to tell a bitsandbytes 4/8-bit model (transformers sets them on a quantized load)."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def lora_without_kbit_prep(model, peft_config, seed: int):
    """(model, peft_config) for a TRL trainer that, given a k-bit model and a `peft_config`, runs
    peft.prepare_model_for_kbit_training itself (TRL 1.16's experimental ORPOTrainer and CPOTrainer): that casts every
    bf16 parameter that is not 4-bit to fp32, the embeddings, LM head and norms, and a MoE's routed experts, which
    bitsandbytes leaves bf16 (a 30B-A3B's ~54 GiB of experts would become ~108 GiB), all priced bf16 by the planner
    (see load_causal_lm). On a k-bit model the PeftModel is built here and the trainer gets peft_config None, a path
    TRL accepts (it then only enables input grads for checkpointing, as on the LoRA path). Seeded as TRL seeds it,
    so the adapter starts where TRL's would. Any other model goes to the trainer as before, TRL's own path."""
    if peft_config is None or not is_kbit(model):
        return model, peft_config
    from peft import get_peft_model
    from transformers import set_seed

    set_seed(seed)
    return get_peft_model(model, peft_config), None


def save_merged(model, tokenizer, out_dir: Path, dtype: torch.dtype) -> Path:
    """Merge a PEFT adapter (if any) and save a plain HF directory that `from_pretrained` loads."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model = model.to(dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@contextlib.contextmanager
def without_zero3_init() -> Iterator[None]:
    """Load a whole model in this process alone while a DeepSpeed ZeRO-3 run is configured. Transformers builds
    every model under `deepspeed.zero.Init` while ZeRO-3 is on (its global HF DeepSpeed config), and that partitions
    each parameter with a broadcast to every rank: on rank 0 alone it waits forever for the others (the merge at
    the end of every multi-worker ZeRO-3 LoRA stage hung so). The config is put back after."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = getattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref", None)
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if ref is not None and ref() is not None:
            hf_deepspeed.set_hf_deepspeed_config(ref())


def merge_adapter_from_disk(base: Path, adapter: Path, out_dir: Path, dtype: torch.dtype, seq_cls: bool = False):
    """Reload the base in `dtype` (never 4-bit, also after QLoRA) and merge the saved adapter into it; on the rank
    that calls it alone, whatever the run's ZeRO stage."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    tok = load_tokenizer(adapter if (adapter / "tokenizer_config.json").is_file() else base)
    with without_zero3_init():
        if seq_cls:
            base_model = AutoModelForSequenceClassification.from_pretrained(
                base, dtype=dtype, num_labels=1, local_files_only=True
            )
            base_model.config.pad_token_id = tok.pad_token_id
        else:
            base_model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, local_files_only=True)
        merged = PeftModel.from_pretrained(base_model, adapter, local_files_only=True).merge_and_unload()
    return save_merged(merged, tok, out_dir, dtype)
