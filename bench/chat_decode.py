"""`chat`'s decoding per path (issue 35 item 1, `chat`): one conversation of --turns user turns, each answer batch 1
streamed through the product's StreamedAnswer on a DecodeSession (generation/session.py), on the dynamic path (HF
generate's growing cache) and on the static path (one batch-1 static cache for the conversation, reset between
turns, the decode step compiled by transformers with CUDA graphs, all on the session's one thread). Per turn: the
prompt's tokens, new tokens, seconds to the first piece, ms per new token, tokens/s; for the static path also the
caches built so far and the dynamo graphs compiled during the turn (0 after the first turn: the compiled step is
replayed) and inductor's cudagraph skips (0: the graphs ran). Random-init weights (--shape) rarely stop early.

    python bench/chat_decode.py --shape qwen2.5-1.5b --turns 4 --new-tokens 256 --out $OUT/chat_decode_1.5b.json
    python bench/chat_decode.py --model-dir ~/.cache/medgpt-ray/tiny-... --device cpu --turns 2 --new-tokens 8
        # a smoke run of the code paths on CPU (no compilation there)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.generation_throughput import add_model_args, random_model, write_result  # noqa: E402

QUESTIONS = ("头痛三天了，伴有恶心，应该怎么办？", "需要做哪些检查？", "平时饮食要注意什么？", "多久复查一次？")


def conversation(model_dir: Path, path: str, turns: int, new_tokens: int) -> list[dict[str, Any]]:
    """One chat of `turns` turns on `path`; a row per turn."""
    from torch._dynamo.utils import counters

    from medgpt_ray.generation.params import GenerationParams
    from medgpt_ray.generation.stream import StreamedAnswer
    from medgpt_ray.infer.chat import ChatSession
    from medgpt_ray.infer.source import ModelSource

    session = ChatSession(ModelSource(model_dir, "chatml"), GenerationParams(max_new_tokens=new_tokens),
                          generation_path=path)
    gen, rows = session.generator, []
    for turn in range(turns):
        session.history.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        graphs = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        answer = StreamedAnswer(gen, session.history, None, gen.params, session=session.decoding)
        first, pieces = None, []
        for piece in answer:
            first = first if first is not None else time.perf_counter() - t0
            pieces.append(piece)
        seconds = time.perf_counter() - t0
        session.history.append({"role": "assistant", "content": "".join(pieces)})
        n = max(answer.new_tokens + answer.finished, 1)  # the steps decoded: the stop token's too
        row = {"path": path, "turn": turn + 1, "decode_path": session.decoding.path.describe(),
               "prompt_tokens": answer.prompt_tokens, "new_tokens": n, "first_piece_s": round(first or seconds, 3),
               "ms_per_token": round(1000 * seconds / n, 2), "new_tokens_per_s": round(n / seconds, 1)}
        if session.decoding.decoder is not None:
            row.update(cache_len=session.decoding.decoder.max_len, cache_builds=session.decoding.decoder.builds,
                       loop=session.decoding.decoder.loop,
                       graphs_compiled_in_turn=counters["stats"]["unique_graphs"] - graphs,
                       cudagraph_skips=counters["inductor"]["cudagraph_skips"])
        print(json.dumps(row), flush=True)
        rows.append(row)
    session.decoding.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--paths", type=lambda s: s.split(","), default=["dynamic", "static"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if not (a.shape or a.model_dir) or any(p not in ("dynamic", "static") for p in a.paths):
        ap.error("--shape or --model-dir; --paths among dynamic, static")
    import torch

    if (a.device == "cuda") != torch.cuda.is_available():
        ap.error(f"--device {a.device}: the generation engine takes the GPU when there is one, else the CPU")
    if a.device == "cuda" and a.cap_gib:
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    if a.model_dir:
        model_dir = Path(a.model_dir)
    else:
        model_dir = random_model(a.shape, Path(a.work))
    rows = [row for path in a.paths for row in conversation(model_dir, path, a.turns, a.new_tokens)]
    write_result(a.out, argv, {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
                               "model": a.shape or str(model_dir), "cap_gib": a.cap_gib, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
