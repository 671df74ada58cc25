"""The `tiny` model preset: a Qwen2-architecture model of a few hundred thousand
parameters and a byte-level BPE tokenizer trained offline on `data/sample`.

Built once into a cache directory keyed by the corpus and builder version, so
tests and demos never touch the network and rebuild only when the data changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

BUILDER_VERSION = "2"  # 2: chatml template renders tools and tool turns
VOCAB_SIZE = 3000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's own pre-tokenizer regex: the tokenizer must round-trip through
# AutoTokenizer, which rebuilds Qwen2Tokenizer's pipeline (FIELD-NOTES).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


def sample_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "sample"


def cache_root() -> Path:
    return Path(os.environ.get("MEDGPT_RAY_CACHE", Path.home() / ".cache" / "medgpt-ray"))


def use_compile_caches() -> dict[str, str]:
    """Keep torch.compile's inductor artefacts and Triton's kernels under the cache directory, shared by every stage
    and run on this machine (a later run's first step loads them instead of compiling: inductor's FX graph and
    autograd caches key on the graph, the versions and the GPU). An environment variable already set wins. Returns
    what this process now uses."""
    caches = {"TORCHINDUCTOR_CACHE_DIR": cache_root() / "inductor", "TRITON_CACHE_DIR": cache_root() / "triton"}
    for name, path in caches.items():
        os.environ.setdefault(name, str(path))
    return {name: os.environ[name] for name in caches}


def _corpus_files(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.glob("*.jsonl") if p.is_file())


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _iter_texts(files: list[Path]) -> Iterator[str]:
    for f in files:
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield from _strings(json.loads(line))


def _fingerprint(files: list[Path]) -> str:
    h = hashlib.sha256(BUILDER_VERSION.encode())
    for f in files:
        h.update(f.name.encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _build_tokenizer(files: list[Path], out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from medgpt_ray.templates import apply_to_tokenizer, get_template

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_iter_texts(files), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=TINY_SHAPE["max_position_embeddings"],
    )
    apply_to_tokenizer(get_template("chatml"), fast)
    fast.save_pretrained(out)
    # Reload the way every stage will, so a round-trip mismatch fails here, at build time.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")


def _build_model(out: Path, vocab_size: int, pad_id: int, eos_id: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        **TINY_SHAPE,
    )
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers 5.17 draws a "Writing model shards" bar for one tiny file
    try:
        Qwen2ForCausalLM(config).save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def ensure_tiny(corpus: Path | None = None) -> Path:
    """Return the tiny model directory, building it when missing (atomic, safe to race)."""
    from transformers import AutoTokenizer

    files = _corpus_files(corpus or sample_dir())
    if not files:
        raise FileNotFoundError(f"no *.jsonl files in {corpus or sample_dir()} to train the tiny tokenizer on")
    target = cache_root() / f"tiny-{_fingerprint(files)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        _build_tokenizer(files, tmp)
        tok = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
        probe = "患者男，45岁，血压150/95mmHg。 Hello"
        if tok.decode(tok.encode(probe, add_special_tokens=False)) != probe:
            raise RuntimeError("tiny tokenizer does not round-trip after reload")
        _build_model(tmp, len(tok), tok.pad_token_id, tok.eos_token_id)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished first; theirs is identical.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
