"""The common ground of issue 50's side-by-side runs (bench/peers/README.md): one job, one way to count.

Every peer script (and ours.py, our own run of the same job) imports this file and nothing of medgpt_ray, so it
runs in the peer's own site directory (its TRL, datasets, torchao) with only torch, transformers and the stdlib:

    JOB                      the job: LoRA r 16 / alpha 32 on all linear layers, seq_len 2048, bf16, 30 optimizer
                             steps, ~16 conversations' worth of real tokens a step, measured over steps 6-30
    cap_memory(gib)          the 24 GiB card: torch.cuda.set_per_process_memory_fraction, before any allocation
    load_conversations(p)    MedicalGPT's ShareGPT file as {"role", "content"} messages, in file order
    reference_token_counts   each conversation's tokens by transformers' own chat template: what every tool's
                             per-conversation count is checked against
    StepClock                one call after each optimizer step: its wall time (after a CUDA sync), its real
                             (non-padding) tokens and its padded tokens, its loss
    write_result(...)        the one JSON every tool writes: steps, tokens/s over steps 6-30, first step's time,
                             peak allocated (torch.cuda.max_memory_allocated: the same in-process hook everywhere),
                             padding share, the token-count check

MFU is computed by table.py, which may import medgpt_ray (the parameter counts and the LoRA-honest FLOPs).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Job:
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    seq_len: int = 2048
    steps: int = 30
    # Rows of seq_len packed tokens a step: ~16 conversations of the real-length mix (mean ~330 tokens) fill 2.6.
    packed_rows_per_step: int = 3
    conversations_per_step: int = 16
    measure_from: int = 6  # steps 6..30 (1-based) are timed; step 1 (compiles, autotunes, warms) is reported apart
    lr: float = 2e-4
    cap_gib: float = 24.0
    seed: int = 0


JOB = Job()
# "all linear layers" of a Qwen2/Qwen3 decoder, by the names every tool here uses.
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def cap_memory(gib: float) -> float | None:
    """Cap this process's CUDA allocator at `gib` (the card a user has); returns the fraction, None on CPU."""
    import torch

    if not torch.cuda.is_available() or not gib:
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return fraction


def load_conversations(path: Path) -> list[list[dict[str, str]]]:
    """ShareGPT records ({"conversations": [{"from": "human"|"gpt"|"system", "value"}]}) as chat messages."""
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                turns = json.loads(line)["conversations"]
                out.append([{"role": roles[t["from"]], "content": t["value"]} for t in turns])
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{n}: not a ShareGPT conversation ({type(e).__name__}: {e})") from e
    return out


def reference_token_counts(tokenizer_dir: Path, conversations: list[list[dict[str, str]]], seq_len: int) -> list[int]:
    """Tokens of each whole conversation by the tokenizer's own chat template, cut at seq_len."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    counts = []
    for conv in conversations:
        ids = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers versions differ in what this returns
            ids = ids["input_ids"]
        counts.append(min(len(ids), seq_len))
    return counts


def compare_counts(reference: list[int], tool: list[int]) -> dict[str, Any]:
    """Where a tool's per-conversation token counts differ from the reference: how many, by how much."""
    n = min(len(reference), len(tool))
    diffs = [tool[i] - reference[i] for i in range(n) if tool[i] != reference[i]]
    return {"conversations": n, "differ": len(diffs),
            "differences": {str(d): diffs.count(d) for d in sorted(set(diffs))},
            "reference_tokens": sum(reference[:n]), "tool_tokens": sum(tool[:n])}


@dataclass
class StepClock:
    """Call step() once after each optimizer step (from a callback or hook of the tool's own loop)."""

    real_tokens: list[int] = field(default_factory=list)
    padded_tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    _last: float | None = None
    _pending_real: int = 0
    _pending_padded: int = 0

    def start(self) -> None:
        self._sync()
        self._last = time.perf_counter()

    def add_batch(self, real: int, padded: int) -> None:
        """A micro-batch's non-padding tokens and its tokens as laid out (rows x length); summed until step()."""
        self._pending_real += int(real)
        self._pending_padded += int(padded)

    def step(self, loss: float | None = None) -> None:
        self._sync()
        now = time.perf_counter()
        if self._last is None:
            raise RuntimeError("StepClock.start() was not called before the first step")
        self.seconds.append(now - self._last)
        self._last = now
        self.real_tokens.append(self._pending_real)
        self.padded_tokens.append(self._pending_padded)
        self._pending_real = self._pending_padded = 0
        if loss is not None:
            self.losses.append(float(loss))

    @staticmethod
    def _sync() -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def summary(self, measure_from: int) -> dict[str, Any]:
        i = measure_from - 1
        secs, toks = sum(self.seconds[i:]), sum(self.real_tokens[i:])
        padded = sum(self.padded_tokens)
        return {
            "steps": len(self.seconds),
            "measured_steps": f"{measure_from}-{len(self.seconds)}",
            "tokens_per_s": round(toks / secs) if secs > 0 and toks else None,
            "first_step_s": round(self.seconds[0], 2) if self.seconds else None,
            "median_step_s": round(statistics.median(self.seconds[i:]), 3) if self.seconds[i:] else None,
            "real_tokens_per_step": round(statistics.mean(self.real_tokens)) if self.real_tokens else None,
            "padding_share": round(1 - sum(self.real_tokens) / padded, 4) if padded else None,
            "step_seconds": [round(s, 3) for s in self.seconds],
            "step_real_tokens": self.real_tokens,
            "losses": [round(x, 4) for x in self.losses],
        }


def peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def write_result(out: Path, tool: str, version: str, settings: dict[str, Any], clock: StepClock,
                 model_dir: Path, data: Path, token_check: dict[str, Any] | None, notes: list[str],
                 job: Job = JOB) -> dict[str, Any]:
    import torch

    doc = {"tool": tool, "version": version, "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "device": device_name(), "torch": torch.__version__, "model_dir": str(model_dir),
           "model": json.loads((model_dir / "config.json").read_text()).get("model_type"),
           "data": str(data), "job": asdict(job), "settings": settings,
           "cap_gib": job.cap_gib if torch.cuda.is_available() else None,
           "peak_allocated_gib": peak_gib(), **clock.summary(job.measure_from),
           "token_check": token_check, "notes": notes,
           "pythonpath": os.environ.get("PYTHONPATH", "")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str))
    brief = {k: doc[k] for k in ("tool", "version", "device", "tokens_per_s", "first_step_s", "peak_allocated_gib",
                                 "padding_share", "real_tokens_per_step")}
    print(json.dumps(brief), flush=True)
    return doc
