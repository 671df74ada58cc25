"""The engine's batch decoding: one model, loaded once (a Ray Data actor's in infer/batch.py, the eval stage's in its
own process), prompts rendered with the chat template the model was trained with, left-padded batches through HF's
generate.

A batch in: prompt_id, conversations and tools (JSON text). A batch out: one row per sample (prompt_id, sample,
response, prompt_tokens, new_tokens, finished: the sample ended on its own stop token rather than at the limit;
batch_seconds: the generate call's time, and decode_path: the path and why (DecodePath.describe), on the batch's
first row, 0 and "" on the others; warmup, on every row of the batch: whether its call built the static cache, so
its seconds include compiling the decode step and capturing its graphs).

The decode path (generation/decode_path.py) is chosen once, when the model is loaded: static on a GPU (one static
cache for every batch, the decode step compiled by transformers with CUDA graphs), dynamic on the CPU or for a
hybrid model, unless `generation_path` says. On the static path the cache is sized by the first batch: its longest
prompt rounded up to a power of two (PROMPT_BUCKET at least) + max_new_tokens, for the first batch's prompts; a
shorter batch is filled up with copies of its last prompt (their answers dropped) so every batch replays the one
compiled step, and only a batch with a longer prompt or more prompts makes a larger cache (and compiles again). A
cache that would not fit the device's free memory is never built: the run goes on the dynamic path (no plan sizes
`generate`'s or the eval stage's batches; the dynamic cache grows only as far as the answers do).
Prompts are not padded to the bucket: the prefill runs eagerly, and the decode step's shapes are the cache's."""

from __future__ import annotations

import json
import time
from typing import Any

from medgpt_ray.generation.decode_path import (
    DYNAMIC,
    DecodePath,
    StaticDecoder,
    choose,
    free_device_bytes,
    is_hybrid,
    static_cache_bytes,
)
from medgpt_ray.generation.loading import generation_device, load_model, load_tokenizer
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.prompts import answer_until_stop, prompt_token_ids, render_prompt, stop_token_ids

ROW_COLUMNS = ("prompt_id", "sample", "response", "prompt_tokens", "new_tokens", "finished", "batch_seconds",
               "warmup", "decode_path")
PROMPT_BUCKET = 128  # the static cache's least prompt room (tokens)


def prompt_room(longest: int) -> int:
    """The static cache's prompt room for a batch whose longest prompt has `longest` tokens: a power of two."""
    return max(PROMPT_BUCKET, 1 << max(longest - 1, 0).bit_length())


class Generator:
    """A model ready to answer: built once (Ray Data builds one per actor from its constructor arguments), called on
    every batch. `params` is the decoding of the next calls; a caller may replace it between batches."""

    def __init__(self, model_path: str, template: str | None, params: dict[str, Any], generation_path: str = "auto"):
        import torch

        from medgpt_ray import templates

        self.params = GenerationParams(**params)
        self.device = generation_device()
        self.tok = load_tokenizer(model_path)
        self.template = templates.get_template(template) if template else None
        self.model = load_model(model_path, self.device)
        self.stops = stop_token_ids(self.tok, self.template)
        self.path = choose(generation_path, cuda=self.device == "cuda", hybrid=is_hybrid(self.model.config))
        self.decoder: Any = None  # the static path's StaticDecoder, made by the first batch
        self.rows = 0  # prompts per generate call on the static path (the cache's batch / num_samples)
        self.compile_config: Any = None  # transformers' CompileConfig for the decode step (None: its default)
        self.memory_room: int | None = None  # bytes a static cache may take (None: what the device has free)
        self.warmup = False  # the last call built a static cache (its time includes compiling the decode step)
        if self.params.seed is not None:
            torch.manual_seed(self.params.seed)  # after loading: sampled answers depend on the seed alone

    def render(self, turns: list[dict], tools: list[dict]) -> str:
        return render_prompt(self.tok, self.template, turns, tools)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        import torch

        p = self.params
        # A prompt's text stays text: content typing the model's control tokens is tokenized as its characters
        # (prompt_token_ids; the same ids as the rendered prompt's for any other content).
        ids = [prompt_token_ids(self.tok, self.template, json.loads(c), json.loads(t))
               for c, t in zip(batch["conversations"], batch["tools"], strict=True)]
        enc = self.tok.pad({"input_ids": ids}, return_tensors="pt").to(self.device)
        t0, self.warmup = time.monotonic(), False
        kw = dict(max_new_tokens=p.max_new_tokens, num_return_sequences=p.num_samples, eos_token_id=self.stops,
                  pad_token_id=self.tok.pad_token_id, **p.sampling())
        with torch.no_grad():
            out = self.model.generate(**enc, **kw) if self.path.name == DYNAMIC else self._static(enc, kw)
        seconds = time.monotonic() - t0
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        return self._rows(batch["prompt_id"], new, enc["attention_mask"].sum(-1).tolist(), seconds)

    def _static(self, enc: Any, kw: dict[str, Any]) -> Any:
        """generate on the static path: the batch filled up to the cache's prompts (copies of its last prompt),
        the answers of the fill dropped. A batch the run's cache cannot serve gets a larger one, unless that would
        not fit the device (_fits): then this batch and the rest of the run decode on the dynamic path."""
        import torch

        ids, mask = enc["input_ids"], enc["attention_mask"]
        rows, width = ids.shape
        d, new = self.decoder, kw["max_new_tokens"]
        if d is None or rows > self.rows or width + new > d.max_len:  # a larger cache: the first, or grown
            cache_rows, max_len = max(rows, self.rows), max(prompt_room(width), d.max_len - new if d else 0) + new
            if not self._fits(cache_rows * self.params.num_samples, max_len):
                return self.model.generate(**enc, **kw)
            self.decoder, self.rows = StaticDecoder(max_len, self.compile_config), cache_rows
            self.warmup = True
        fill = self.rows - rows
        if fill:
            ids = torch.cat([ids, ids[-1:].expand(fill, -1)])
            mask = torch.cat([mask, mask[-1:].expand(fill, -1)])
        out = self.decoder.generate(self.model, ids, attention_mask=mask, **kw)
        return out[:rows * self.params.num_samples]

    def _fits(self, batch: int, max_len: int) -> bool:
        """Whether a static cache of `batch` sequences x `max_len` tokens fits what the device has free (at most
        90 %: the decode step's own tensors sit beside it); if not, the run goes back to the dynamic path, which says
        why: the faster path must never become an OOM, and the dynamic cache grows only as far as the answers do."""
        need = static_cache_bytes(self.model.config, batch, max_len, next(self.model.parameters()).element_size())
        room = self.memory_room if self.memory_room is not None else free_device_bytes(self.device)
        if room is None or need <= 0.9 * room:
            return True
        self.decoder = None
        self.path = DecodePath(DYNAMIC, f"static refused: its cache of {batch} x {max_len} tokens takes "
                               f"{need / 2**30:.2f} GiB, more than 90 % of the {room / 2**30:.2f} GiB free")
        return False

    def _rows(self, prompt_ids: list, new: list[list[int]], prompt_tokens: list[int], seconds: float) -> dict:
        """One row per sample, the samples of a prompt together in order (generate's num_return_sequences order)."""
        n_samples = self.params.num_samples
        rows: dict[str, list] = {k: [] for k in ROW_COLUMNS}
        for i, ids in enumerate(new):
            text, n, finished = answer_until_stop(self.tok, self.stops, ids)
            prompt = i // n_samples
            rows["prompt_id"].append(str(prompt_ids[prompt]))
            rows["sample"].append(i % n_samples)
            rows["response"].append(text)
            rows["prompt_tokens"].append(int(prompt_tokens[prompt]))
            rows["new_tokens"].append(n)
            rows["finished"].append(finished)
            rows["batch_seconds"].append(seconds if i == 0 else 0.0)  # summed by the driver: once per batch
            rows["warmup"].append(self.warmup)
            rows["decode_path"].append(self.path.describe() if i == 0 else "")  # the driver reports it
        return rows
