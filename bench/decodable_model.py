"""A random-weight model whose sampled tokens decode to text: serve_load's model on the GPU.

The benches' random shapes (bench/family_models.prepare_model) keep their family's vocabulary (151,936 rows for
Qwen2.5) beside the tiny tokenizer's 3,000 tokens, so about 98 % of the tokens they sample decode to nothing. A
streamed answer then shows its first text only after tens of tokens, and serve_load's time to first token (the first
piece with text) measures the model, not the server: on the H100 (2026-12-05) p50 1.44 s at 32 clients. Here the
output rows of the tokenizer's ordinary tokens are scaled up (their logits dominate: sampling stays on them) and the
rows of its special tokens zeroed (no stop token ends an answer early: every answer runs to max_tokens). Compute and
memory per token are the shape's own; only the weights' values change.

    python bench/decodable_model.py --src /tmp/g/qwen2.5-1.5b --dest /tmp/g/qwen2.5-1.5b-decodable
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.family_models import model_dir_written  # noqa: E402

SCALE = 20.0  # ordinary tokens' logits ~N(0, 16^2) against ~N(0, 0.8^2) for the rows past the tokenizer


def make_decodable(src: Path, dest: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (dest / "config.json").is_file():
        return dest
    tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True, dtype="auto").to(device)
    rows = model.get_output_embeddings().weight
    with torch.no_grad():
        rows[:len(tok)] *= SCALE
        rows[sorted(set(tok.all_special_ids) | set(tok.added_tokens_decoder))] = 0
    with model_dir_written(dest) as part:
        model.save_pretrained(part, safe_serialization=True)
        for f in src.iterdir():  # the tokenizer's files and the chat template
            if f.is_file() and not (part / f.name).exists() and ".safetensors" not in f.name:
                shutil.copy(f, part / f.name)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dest", type=Path, required=True)
    args = ap.parse_args(argv)
    print(make_decodable(args.src, args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
