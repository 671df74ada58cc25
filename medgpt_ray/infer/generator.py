"""The model side of batch generation: one model per Ray Data actor (a GPU's when the actor has one, else the CPU),
prompts rendered with the chat template the model was trained with, left-padded batches through HF's generate.

A batch in: prompt_id, conversations and tools (JSON text). A batch out: one row per sample (prompt_id, sample,
response, prompt_tokens, new_tokens, finished: the sample ended on its own stop token rather than at the limit;
batch_seconds: the generate call's time on the batch's first row, 0 on the others)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples > 1 and self.temperature <= 0:
            raise ValueError(f"--num-samples {self.num_samples} with --temperature 0: greedy decoding gives every "
                             "sample the same answer; set a temperature > 0 (e.g. 0.7)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stop_token_ids(tok: Any, template: Any | None) -> list[int]:
    """EOS, and the first token of the template's end of turn (chatml's <|im_end|>): where an answer ends."""
    from medgpt_ray import templates

    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if template is not None:
        suffix = templates.resolved_suffix(template, tok).strip()
        if suffix:
            ids.add(tok(suffix, add_special_tokens=False)["input_ids"][0])
    return sorted(ids)


class Generator:
    """A Ray Data callable class: built once per actor, called on every batch."""

    def __init__(self, model_path: str, template: str | None, params: dict[str, Any]):
        import torch
        from transformers.utils import logging as hf_logging

        from medgpt_ray import models, templates

        hf_logging.disable_progress_bar()  # our progress lines say what happens
        self.params = GenerationParams(**params)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tok = models.load_tokenizer(Path(model_path))
        self.tok.padding_side = "left"  # new tokens continue every prompt at the same position
        self.template = templates.get_template(template) if template else None
        precision = "bf16" if self.device == "cuda" else "fp32"
        self.model = models.load_causal_lm(Path(model_path), precision, "full").to(self.device).eval()
        self.stops = stop_token_ids(self.tok, self.template)
        torch.manual_seed(self.params.seed)

    def render(self, turns: list[dict], tools: list[dict]) -> str:
        from medgpt_ray import templates

        if self.template is not None:
            return templates.render_prompt(self.template, self.tok, turns, tools or None)
        return self.tok.apply_chat_template(turns, tools=tools or None, add_generation_prompt=True, tokenize=False)

    def _answer(self, ids: list[int]) -> tuple[str, int, bool]:
        """The sample's text up to its first stop token, its token count, and whether it stopped by itself."""
        for n, t in enumerate(ids):
            if t in self.stops:
                return self.tok.decode(ids[:n], skip_special_tokens=True), n, True
        return self.tok.decode(ids, skip_special_tokens=True), len(ids), False

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        import torch

        p = self.params
        texts = [self.render(json.loads(c), json.loads(t)) for c, t in zip(batch["conversations"], batch["tools"],
                                                                            strict=True)]
        enc = self.tok(texts, add_special_tokens=False, return_tensors="pt", padding=True).to(self.device)
        sample = {"do_sample": True, "temperature": p.temperature, "top_p": p.top_p} if p.temperature > 0 else \
            {"do_sample": False}
        t0 = time.monotonic()
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=p.max_new_tokens, num_return_sequences=p.num_samples,
                                      eos_token_id=self.stops, pad_token_id=self.tok.pad_token_id, **sample)
        seconds = time.monotonic() - t0
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        rows: dict[str, list] = {k: [] for k in ("prompt_id", "sample", "response", "prompt_tokens", "new_tokens",
                                                 "finished", "batch_seconds")}
        prompt_tokens = enc["attention_mask"].sum(-1).tolist()
        for i, ids in enumerate(new):
            text, n, finished = self._answer(ids)
            prompt = i // p.num_samples
            rows["prompt_id"].append(str(batch["prompt_id"][prompt]))
            rows["sample"].append(i % p.num_samples)
            rows["response"].append(text)
            rows["prompt_tokens"].append(int(prompt_tokens[prompt]))
            rows["new_tokens"].append(n)
            rows["finished"].append(finished)
            rows["batch_seconds"].append(seconds if i == 0 else 0.0)  # summed by the driver: once per batch
        return rows


class StreamedAnswer:
    """One answer generated in a thread and read piece by piece as it grows (chat, serving). After the pieces:
    prompt_tokens, new_tokens (up to the stop token) and finished (it stopped on its own, not at the limit)."""

    def __init__(self, gen: Generator, turns: list[dict], tools: list[dict] | None, params: GenerationParams):
        import threading

        from transformers import TextIteratorStreamer

        enc = gen.tok(gen.render(turns, tools or []), add_special_tokens=False, return_tensors="pt").to(gen.device)
        self.prompt_tokens = int(enc["input_ids"].shape[1])
        self._gen, self._ids, self._error = gen, [], None
        self._streamer = TextIteratorStreamer(gen.tok, skip_prompt=True, skip_special_tokens=True)
        sample = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p} \
            if params.temperature > 0 else {"do_sample": False}
        kwargs = {**enc, "max_new_tokens": params.max_new_tokens, "eos_token_id": gen.stops,
                  "pad_token_id": gen.tok.pad_token_id, "streamer": self._streamer, **sample}
        self._thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)
        self._thread.start()

    def _run(self, kwargs: dict[str, Any]) -> None:
        import torch

        try:
            with torch.no_grad():
                self._ids = self._gen.model.generate(**kwargs)[0, self.prompt_tokens:].tolist()
        except BaseException as e:  # raised again in the reader's thread, after the pieces so far
            self._error = e
            self._streamer.end()

    def __iter__(self):
        yield from self._streamer
        self._thread.join()
        if self._error is not None:
            raise self._error

    @property
    def new_tokens(self) -> int:
        return next((n for n, t in enumerate(self._ids) if t in self._gen.stops), len(self._ids))

    @property
    def finished(self) -> bool:
        return self.new_tokens < len(self._ids)
