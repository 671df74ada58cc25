"""Rollouts on the static decode path (generation/decode_path.py): trainer behaviours for TRL's GRPOTrainer and
RLOOTrainer (StaticRollouts) and GKDTrainer (opd's student samples: StaticStudentSamples), for a plan whose
`generation_path` is static.

TRL 1.16 builds its trainers' GenerationConfig with `disable_compile=True`, and its `cache_implementation` makes a
new static cache every generate call: no CUDA graphs, and graphs re-recorded for every new cache if they were on. So
the generate call is ours here: the run's one StaticDecoder (a static cache of `decode_max_len` tokens, prompt room
+ completion length, built at the first rollout for the fixed generation batch and reset for every later one;
compilation on, transformers' own). GRPO's and RLOO's text rollouts are TRL's regular generation path (prompts
left-padded to the longest, completions cut after the first stop token) with that call; what the path does not
cover goes to TRL's own (vLLM, continuous batching, images and multimodal fields, a multi-turn tool prompt longer
than the cache's room). GKD's student samples are TRL's own function given the model behind a proxy whose generate
is the decoder's. Composed after MergedRollouts/MergedStudentSamples, the rollout decodes the merged weights: PEFT's
merge adds into the base tensors in place, so the graphs read them at their captured addresses."""

from __future__ import annotations

from typing import Any

from medgpt_ray.generation.decode_path import StaticDecoder


def static_decoding(plan: Any, cfg: Any) -> dict[str, int] | None:
    """The static behaviours' keyword for a plan on the static path (None otherwise): the cache as long as the plan
    priced it (its TrainSetup's seq_len: grpo's the data's planned length, prompt + completion, memory/lengths.py;
    opd's seq_len, which its prompts + max_new_tokens fit). A cache at seq_len instead made every grpo decode step
    attend over twice the planned length (the H200's 1.5B grpo: 1,024 positions for rows of at most 382 tokens) and
    held twice the KV cache the plan counted. A prompt batch longer than the room decodes on TRL's own path."""
    if plan.generation_path != "static":
        return None
    return {"decode_max_len": plan.train_setup(cfg).seq_len}


class _StaticDecoding:
    """The run's StaticDecoder, made with the trainer (its cache at the first rollout)."""

    def __init__(self, *args: Any, decode_max_len: int, compile_config: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.static_decoder = StaticDecoder(decode_max_len, compile_config)


class StaticRollouts(_StaticDecoding):
    """GRPO's and RLOO's `_generate_single_turn` on the static decode path. GRPO's returns (completion ids,
    logprobs: None on this path, as on TRL's own) and is called with num_generations; RLOO's returns the ids alone."""

    def _generate_single_turn(self, prompt_ids: list, images: Any, multimodal_fields: Any, *args: Any,
                              **kwargs: Any) -> Any:
        longest = max((len(p) for p in prompt_ids), default=0)
        if (self.use_vllm or getattr(self, "use_transformers_continuous_batching", False) or images is not None
                or multimodal_fields or longest + self.max_completion_length > self.static_decoder.max_len):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
        completions = self._static_completions(prompt_ids)
        return (completions, None) if args or kwargs else completions

    def _static_completions(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        import torch
        from trl.extras.profiling import profiling_context
        from trl.models import unwrap_model_for_generation

        device = self.accelerator.device
        width = max(len(p) for p in prompt_ids)
        pad_id = self._tokenizer.pad_token_id
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompt_ids], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
        with (profiling_context(self, "transformers.generate"),
              unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                          generation_kwargs=self.generation_kwargs,
                                          gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
              as unwrapped, torch.no_grad()):
            out = self.static_decoder.generate(unwrapped, ids, self.generation_config, attention_mask=mask)
        return until_stop(out[:, width:], self.eos_token_ids)


def until_stop(completion_ids: Any, stops: list[int]) -> list[list[int]]:
    """Each completion up to and with its first stop token (TRL's masking), as lists."""
    import torch

    is_stop = torch.isin(completion_ids, torch.tensor(stops, device=completion_ids.device))
    ends = torch.where(is_stop.any(dim=1), is_stop.int().argmax(dim=1) + 1, completion_ids.shape[1]).tolist()
    return [row[:end] for row, end in zip(completion_ids.tolist(), ends, strict=True)]


class _DecoderModel:
    """A model whose generate is the static decoder's: what GKD's own sampling function is handed."""

    def __init__(self, model: Any, decoder: StaticDecoder):
        self._model, self._decoder = model, decoder

    def generate(self, input_ids: Any, generation_config: Any, **kwargs: Any) -> Any:
        return self._decoder.generate(self._model, input_ids, generation_config, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class StaticStudentSamples(_StaticDecoding):
    """GKD's student samples (TRL's `generate_on_policy_outputs(model, inputs, generation_config)`) decoded on the
    static path; a prompt batch longer than the cache's room, and the teacher's samples (seq_kd: another model, the
    cache is the student's), decode on TRL's own."""

    def generate_on_policy_outputs(self, model: Any, inputs: Any, generation_config: Any, *args: Any,
                                   **kwargs: Any) -> Any:
        width = inputs["prompts"].shape[1]
        student = getattr(model, "config", None) is getattr(self.model, "config", False)
        if student and width + generation_config.max_new_tokens <= self.static_decoder.max_len:
            model = _DecoderModel(model, self.static_decoder)
        return super().generate_on_policy_outputs(model, inputs, generation_config, *args, **kwargs)
