"""The engine's batch decoding: one model, loaded once (a Ray Data actor's in infer/batch.py, the eval stage's in its
own process), prompts rendered with the chat template the model was trained with, left-padded batches through HF's
generate.

A batch in: prompt_id, conversations and tools (JSON text). A batch out: one row per sample (prompt_id, sample,
response, prompt_tokens, new_tokens, finished: the sample ended on its own stop token rather than at the limit;
batch_seconds: the generate call's time on the batch's first row, 0 on the others)."""

from __future__ import annotations

import json
import time
from typing import Any

from medgpt_ray.generation.loading import generation_device, load_model, load_tokenizer
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.prompts import answer_until_stop, render_prompt, stop_token_ids

ROW_COLUMNS = ("prompt_id", "sample", "response", "prompt_tokens", "new_tokens", "finished", "batch_seconds")


class Generator:
    """A model ready to answer: built once (Ray Data builds one per actor from its constructor arguments), called on
    every batch. `params` is the decoding of the next calls; a caller may replace it between batches."""

    def __init__(self, model_path: str, template: str | None, params: dict[str, Any]):
        import torch

        from medgpt_ray import templates

        self.params = GenerationParams(**params)
        self.device = generation_device()
        self.tok = load_tokenizer(model_path)
        self.template = templates.get_template(template) if template else None
        self.model = load_model(model_path, self.device)
        self.stops = stop_token_ids(self.tok, self.template)
        torch.manual_seed(self.params.seed)  # after loading: sampled answers depend on the seed alone

    def render(self, turns: list[dict], tools: list[dict]) -> str:
        return render_prompt(self.tok, self.template, turns, tools)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        import torch

        p = self.params
        texts = [self.render(json.loads(c), json.loads(t)) for c, t in zip(batch["conversations"], batch["tools"],
                                                                            strict=True)]
        enc = self.tok(texts, add_special_tokens=False, return_tensors="pt", padding=True).to(self.device)
        t0 = time.monotonic()
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=p.max_new_tokens, num_return_sequences=p.num_samples,
                                      eos_token_id=self.stops, pad_token_id=self.tok.pad_token_id, **p.sampling())
        seconds = time.monotonic() - t0
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        return self._rows(batch["prompt_id"], new, enc["attention_mask"].sum(-1).tolist(), seconds)

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
        return rows
