"""Seconds to encode a stage's SFT conversations (issue 48: a warm first step spent ~2-3 s of its 27 s encoding 3,000
conversations): one tokenizer call a conversation (templates.encode_sft, as the sft stage did) against a block of
conversations a call (templates.encode_sft_many, BLOCK at a time, as it does now), each with the tokenizer's Rust
threads off (what the stage workers set: TOKENIZERS_PARALLELISM=false) and on. Each setting in a fresh process; the
fastest of --repeat. The conversations: bench/make_real_length_corpus.py's SFT mix; the tokenizer: the tiny
preset's (--tokenizer DIR for another).

    python3 bench/encode_speed.py --records 1000 --out $OUT/encode_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def conversations(work: Path, records: int) -> list[dict]:
    from make_real_length_corpus import make_corpus

    if not (work / "sft.jsonl").is_file():
        make_corpus(work, records, 0)
    lines = (work / "sft.jsonl").read_text(encoding="utf-8").splitlines()
    return [{"conversations": [{"role": ROLES[t["from"]], "content": t["value"]}
                               for t in json.loads(line)["conversations"]]} for line in lines if line.strip()]


def measure(path: str, work: Path, records: int, repeat: int, tokenizer_dir: str | None) -> dict[str, object]:
    from medgpt_ray import models, templates
    from medgpt_ray.stages.conversation_rows import BLOCK
    from medgpt_ray.tiny import ensure_tiny

    recs = conversations(work, records)
    tok = models.load_tokenizer(Path(tokenizer_dir) if tokenizer_dir else ensure_tiny())
    template = templates.get_template("chatml")

    def one_call_each() -> int:
        return sum(len(templates.encode_sft(tok, template, r["conversations"])["input_ids"]) for r in recs)

    def blocks() -> int:
        blocks_ = [[(r["conversations"], None) for r in recs[i:i + BLOCK]] for i in range(0, len(recs), BLOCK)]
        return sum(len(e["input_ids"]) for block in blocks_ for e in templates.encode_sft_many(tok, template, block))

    run = one_call_each if path == "per_conversation" else blocks
    seconds, tokens = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        tokens = run()
        seconds.append(round(time.perf_counter() - t, 3))
    return {"path": path, "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"), "seconds": seconds,
            "best_s": min(seconds), "conversations": len(recs), "tokens": tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1000, help="make_real_length_corpus records (x3 conversations)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/encode_speed"))
    ap.add_argument("--tokenizer", help="a tokenizer directory (default: the tiny preset's)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # PATH: measure it in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.work, args.records, args.repeat, args.tokenizer)), flush=True)
        return 0
    results = []
    for parallel in ("false", "true"):
        for path in ("per_conversation", "batched"):
            cmd = [sys.executable, __file__, "--one", path, "--records", str(args.records), "--repeat",
                   str(args.repeat), "--work", str(args.work)] + (["--tokenizer", args.tokenizer] if args.tokenizer
                                                                  else [])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "TOKENIZERS_PARALLELISM": parallel})
            lines = done.stdout.strip().splitlines()
            results.append(json.loads(lines[-1]) if done.returncode == 0 and lines else
                           {"path": path, "tokenizers_parallelism": parallel,
                            "failed": done.stderr.strip().splitlines()[-3:]})
            print(results[-1], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "cpus": os.cpu_count(),
                                        "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
