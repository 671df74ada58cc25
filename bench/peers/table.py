"""The side-by-side table of issue 50 from the results of bench/peers/run.sh (one JSON per tool and model), with
MFU counted two ways for every row:

- 6N: 6 x the model's parameters (all of them, the embedding included: Qwen2.5-7B's 7.62 B) FLOPs a token, over
  the GPU's dense bf16 peak (989 TFLOP/s for an H100/H200 SXM). The customary count, which a LoRA run overstates:
  no weight gradients are computed for the frozen base.
- LoRA-honest: what memory/throughput.flops_per_token counts for the tool's own setup: the forward, the input
  gradients, the adapters' weight gradients, and the recomputed forward of the checkpointed share of layers.

A row that did not run (a refused install, an import error) is a JSON with "failed": the reason; it is named in the
table with its reason. Run here (it imports medgpt_ray for the shapes and FLOPs):

    .venv/bin/python bench/peers/table.py bench/results/peers/*.json [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

PEAK_BF16_TFLOPS = 989.0  # H100/H200 SXM, dense


def shape_of(preset: str) -> Any:
    from family_models import FAMILY_MODELS, shape_config, write_config_only

    from medgpt_ray.memory.shapes import load_shape

    with tempfile.TemporaryDirectory() as d:
        if preset in FAMILY_MODELS:  # qwen3-8b, qwen3.5-0.8b: bench/family_models.py's own configs
            return load_shape(str(write_config_only(preset, Path(d))))
        shape_config(preset).save_pretrained(d)
        return load_shape(d)


def mfu(doc: dict[str, Any]) -> dict[str, float | None]:
    from medgpt_ray.memory.setup import TrainSetup
    from medgpt_ray.memory.throughput import flops_per_token

    rate = doc.get("tokens_per_s")
    if not rate:
        return {"mfu_6n": None, "mfu_lora": None}
    shape = shape_of(Path(doc["model_dir"]).name)
    settings = doc.get("settings", {})
    ckpt = settings.get("ckpt_fraction", (settings.get("plan") or {}).get("ckpt_fraction", 1.0))
    method = "qlora" if settings.get("quant") == "4bit" or settings.get("method") == "qlora" else "lora"
    setup = TrainSetup(stage="sft", method=method, precision="bf16", micro_batch=1, seq_len=doc["job"]["seq_len"],
                       ckpt_fraction=float(ckpt), lora_rank=doc["job"]["lora_r"], packed=True)
    peak = PEAK_BF16_TFLOPS * 1e12
    return {"mfu_6n": round(6 * shape.params * rate / peak, 3),
            "mfu_lora": round(flops_per_token(shape, setup) * rate / peak, 3), "params": shape.params}


def row(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("failed"):
        return {"tool": doc["tool"], "version": doc.get("version"), "model": doc.get("model_name"),
                "failed": doc["failed"]}
    m = mfu(doc)
    return {"tool": doc["tool"], "version": doc["version"], "model": Path(doc["model_dir"]).name,
            "device": doc["device"], "tokens_per_s": doc["tokens_per_s"], "peak_gib": doc["peak_allocated_gib"],
            "first_step_s": doc["first_step_s"], "padding_share": doc["padding_share"],
            "real_tokens_per_step": doc["real_tokens_per_step"], "mfu_6n": m["mfu_6n"], "mfu_lora": m["mfu_lora"],
            "tokens_differ": (doc.get("token_check") or {}).get("differ"), "losses": doc.get("losses", [])[:30]}


def pct(x: float | None) -> str:
    return f"{100 * x:.1f} %" if x is not None else "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| tool | model | tokens/s | peak GiB | MFU 6N | MFU LoRA | first step s | padding | tokens/step |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['tool']} {r.get('version') or ''} | {r.get('model') or ''} | did not run: "
                         f"{r['failed']} | | | | | | |")
            continue
        lines.append(f"| {r['tool']} {r['version']} | {r['model']} | {r['tokens_per_s']:,} | {r['peak_gib']} | "
                     f"{pct(r['mfu_6n'])} | {pct(r['mfu_lora'])} | {r['first_step_s']} | "
                     f"{pct(r['padding_share'])} | {r['real_tokens_per_step']:,} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    docs = [json.loads(p.read_text()) for p in a.results]
    rows = [row(d) for d in docs if isinstance(d, dict) and "tool" in d]  # not the corpus or requirement files
    print(markdown(rows) if a.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
