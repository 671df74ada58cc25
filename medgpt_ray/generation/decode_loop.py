"""The static path's own decode loop: transformers' generate for greedy and sampled decoding, without the host
stalls of its loop.

On the H200 a static decode step of Qwen2.5-1.5B took 5.5 ms at 16 sequences against 0.77 ms of weights to read
(bench/results/generation_1.5b_h200.json); the throughput model's fit (memory/throughput.py) puts 4 ms of every step
on the host, for every model and batch. transformers' `_sample` makes the host wait for the GPU three times a token:
its stop check (`unfinished.max() == 0`, read every step; 5.24 defers it on MPS only, "we should enable it for cuda
if we observe perf gains") and torch.multinomial, whose one-sample path reads two validity checks (`.item()`). A host
that waits cannot queue the next step, so the Python of every step (preparing inputs, building the 4-D mask,
logits processors) adds to the GPU's time instead of overlapping it.

This loop keeps what generate decides and drops the waits:
- the call's settings are generate's own (`_prepare_generation_config`, `_prepare_special_tokens`), read from the
  logits processors generate builds for it (`_get_logits_processor`) into the one sampler (sampler.py), which draws
  as generate does (the same random numbers, so a seeded call samples the tokens generate samples) without its
  checks; a probability that is not finite is still refused, as soon as the flag below is read;
- the prefill runs eagerly and every decode step through the model's own compiled call (`get_compiled_call`, the
  graphs generate replays), given what generate gives it: the step's mask built outside the graph by transformers'
  `create_masks_for_generate` (about 60 us of host time on this CPU, now beside the GPU's work instead of before it);
- whether every sequence has stopped is copied to the host without waiting and read once it is there (a few steps
  late at most: the host runs at most 3 steps in front of the GPU, generation/deferred.py); steps past the last stop
  only add padding, which is cut, so the sequences are generate's; a streamer (a batch of one: chat) is fed each
  token the same way;
- stopping criteria are taken when they read only the host (`host_only`: chat's cancel and deadline).
Anything else (beams, stop strings, a processor or criterion that may read the GPU) is generate's: `prepare` says
why, and StaticDecoder records it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.generation import sampler
from medgpt_ray.generation.deferred import DeferredFlags, DeferredStream

LOOP, GENERATE = "medgpt", "generate"  # the decode loop a StaticDecoder call ran: this one, or transformers'
# generate's keyword arguments the loop takes besides the generation config (a streamer: a batch of one)
CALL_KEYS = {"attention_mask", "streamer", "stopping_criteria"}


@dataclass
class DecodeCall:
    """One generate call as the loop runs it: generate's sampling and special tokens for this config."""

    settings: sampler.Settings  # what generate's logits processors for this call would do
    held: list[int]  # the ids its min-length processors hold back
    penalty_skips_padding: bool  # its repetition penalty reads each row's real tokens only
    max_new_tokens: int
    expand: int  # num_return_sequences: each prompt repeated, as generate does
    eos: Any  # the stop token ids (a tensor) or None
    pad: int
    compiled_step: Any  # the decode step: the model's compiled call, or the model itself
    as_output: bool = False  # return_dict_in_generate: the sequences in generate's output object (GKD asks for it)
    streamer: Any = None  # fed each token a step or so late (deferred.DeferredStream)
    # Stopping criteria marked `host_only` (they read a flag or the clock, never a device value: a cancel, a deadline).
    criteria: list = field(default_factory=list)


def text_model(model: Any) -> Any:
    """The transformers model whose generate a call would run: a PeftModel's base (LoRA's layers inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def refusal(model: Any, input_ids: Any, kwargs: dict[str, Any]) -> str | None:
    """Why the loop cannot take a call of these arguments (None: it can, as far as they go)."""
    if set(kwargs) - CALL_KEYS:
        return f"generate's arguments {sorted(set(kwargs) - CALL_KEYS)}"
    if kwargs.get("attention_mask") is None:
        return "no attention mask"
    if not all(getattr(criterion, "host_only", False) for criterion in kwargs.get("stopping_criteria") or ()):
        return "stopping criteria that may read the GPU"
    peft = model.active_peft_config if hasattr(model, "active_peft_config") else None
    if peft is not None and peft.is_prompt_learning:
        return "a prompt-learning adapter"
    if text_model(model).config.is_encoder_decoder:
        return "an encoder-decoder model"
    return None


def prepare(model: Any, input_ids: Any, config: Any, kwargs: dict[str, Any], cache_kwarg: str,
            cache: Any) -> tuple[DecodeCall | None, str]:
    """(the call, "") when the loop can decode it exactly as generate would, else (None, why not). `config` is the
    caller's generation config (not changed); `kwargs` what generate would get beside it."""
    from transformers import LogitsProcessorList
    from transformers.generation.configuration_utils import GenerationMode

    if (why := refusal(model, input_ids, kwargs)) is not None:
        return None, why
    base = text_model(model)
    config, extra = base._prepare_generation_config(config)
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        return None, f"generation mode {mode.value}"
    if extra or config.output_scores or config.output_logits or config.stop_strings or config.max_time \
            or config.token_healing:
        return None, "outputs beyond the sequences, or stopping beyond stop tokens"
    if config.max_new_tokens is None:
        return None, "no max_new_tokens"
    expand = max(1, config.num_return_sequences or 1)
    if kwargs.get("streamer") is not None and input_ids.shape[0] * expand > 1:
        return None, "a streamer of more than one row"
    base._prepare_special_tokens(config, True, device=input_ids.device, batch_size=input_ids.shape[0])
    processors = base._get_logits_processor(
        generation_config=config, input_ids_seq_length=input_ids.shape[1], encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(), device=input_ids.device,
        model_kwargs={"attention_mask": kwargs["attention_mask"]})
    settings, why = sampler.from_processors(processors, bool(config.do_sample), input_ids.shape[1])
    if settings is None:
        return None, why
    compiled = base._valid_auto_compile_criteria({cache_kwarg: cache}, config)
    pad = config._pad_token_tensor
    return DecodeCall(settings, sampler.held_back(processors), sampler.penalty_skips_padding(processors),
                      int(config.max_new_tokens), expand,
                      config._eos_token_tensor, int(pad) if pad is not None else 0,
                      base.get_compiled_call(config.compile_config) if compiled else base,
                      bool(config.return_dict_in_generate), kwargs.get("streamer"),
                      list(kwargs.get("stopping_criteria") or ())), ""


def prompt_positions(attention_mask: Any) -> Any:
    """Left-padded prompts' position ids as generate makes them: counted over the real tokens, 0 on the padding."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def decode(model: Any, input_ids: Any, attention_mask: Any, call: DecodeCall, cache_kwarg: str, cache: Any,
           cache_len: int) -> Any:
    """generate's sequences (prompt, then the new tokens; padding after a row stops; as long as the last row to
    stop) from `cache` (a reset StaticCache of `cache_len` positions, at least prompt + max_new_tokens - 1)."""
    import torch

    base = text_model(model)
    if call.expand > 1:
        input_ids = input_ids.repeat_interleave(call.expand, dim=0)
        attention_mask = attention_mask.repeat_interleave(call.expand, dim=0)
    rows, width = input_ids.shape
    device = input_ids.device
    out = torch.full((rows, width + call.max_new_tokens), call.pad, dtype=input_ids.dtype, device=device)
    out[:, :width] = input_ids
    padding = torch.ones(rows, cache_len, dtype=attention_mask.dtype, device=device)
    padding[:, :width] = attention_mask
    positions = prompt_positions(attention_mask)
    forward = {cache_kwarg: cache, "use_cache": True, "return_dict": True, **logits_to_keep(base)}
    stream = DeferredStream(call.streamer, device) if call.streamer is not None else None
    if stream is not None:
        call.streamer.put(input_ids.cpu())  # as generate does: a streamer skips the prompt itself
    # The prefill sees the prompt's own mask, as generate's does: a linear-attention layer's padding mask is the 2D
    # mask's trailing columns (transformers' create_recurrent_attention_mask), which over the cache-wide `padding`
    # would be columns past the prompt, and the left padding would enter its recurrent state.
    scores = last_scores(base(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                              **forward).logits)
    following = positions[:, -1:] + 1
    rows_state = RowState(rows, call.max_new_tokens, device)
    draws = sampler.Sampler(rows, scores.shape[-1], device, call.held)
    draws.take(list(range(rows)), [call.settings] * rows, seen_tokens(input_ids, attention_mask, call))
    flags, steps = DeferredFlags(device), 0
    for i in range(call.max_new_tokens):
        token, running = rows_state.next(draws.draw(scores, rows_state.bad), call, out, width + i, i)
        if stream is not None:
            stream.push(token, running)
        steps = i + 1
        flags.push(rows_state.unfinished, rows_state.bad)
        every_row, bad = flags.read()
        refuse(bad, call)
        if steps == call.max_new_tokens or every_row:
            break
        scores = decode_step(call.compiled_step, base, token[:, None], following + i, padding, cache_kwarg, cache)
    refuse(bool(rows_state.bad), call)  # the last steps' probabilities too: one wait for the GPU, at the end
    if stream is not None:
        stream.close()
    sequences = out[:, :width + rows_state.length(steps)]
    if call.as_output:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def seen_tokens(input_ids: Any, attention_mask: Any, call: DecodeCall) -> Any:
    """What generate's repetition penalty counts as seen before the first new token (None: there is no penalty)."""
    if call.settings.repetition_penalty == 1:
        return None
    if call.penalty_skips_padding:
        return [row[keep.bool()] for row, keep in zip(input_ids, attention_mask, strict=True)]
    return input_ids


class RowState:
    """Which rows still run, the step each stopped at (the output is cut after the last), and whether a sampled
    probability was refused: device tensors, never read by the loop while it decodes."""

    def __init__(self, rows: int, max_new_tokens: int, device: Any):
        import torch

        self.unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        self.stopped_at = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
        self.bad = torch.zeros((), dtype=torch.bool, device=device)

    def next(self, token: Any, call: DecodeCall, out: Any, column: int, step: int) -> tuple[Any, Any]:
        """Step `step`'s token of each row written to `out[:, column]` (padding for a row that had stopped), the
        rows its stop tokens and the host-only criteria stop; (the token, whether each row was running)."""
        import torch

        running = self.unfinished
        if call.eos is not None:  # as generate: padding after a stop only where stop tokens are among its criteria
            token = torch.where(running, token, call.pad)
        out[:, column] = token
        unfinished = running & ~torch.isin(token, call.eos) if call.eos is not None else running
        for criterion in call.criteria:
            unfinished = unfinished & ~criterion(out[:, :column + 1], None)
        self.stopped_at = torch.where(running & ~unfinished, step, self.stopped_at)
        self.unfinished = unfinished
        return token, running

    def length(self, steps: int) -> int:
        """Where generate would have stopped: after the step the last row stopped at, or all `steps` if one ran on
        (one wait for the GPU)."""
        import torch

        last = torch.where(self.unfinished, steps - 1, self.stopped_at).max()
        return int(last) + 1 if steps else 0


def refuse(bad: bool, call: DecodeCall) -> None:
    """Raise on probabilities generate's torch.multinomial would have refused."""
    if call.settings.sampled and bad:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0 (the model's logits, "
                           "as generate's torch.multinomial would have refused them)")


def decode_step(step: Any, base: Any, tokens: Any, positions: Any, padding: Any, cache_kwarg: str,
                cache: Any) -> Any:
    """One decode step, the one both loops run (this module's batch loop, slot_engine.py's continuous one): each
    row's token ([rows, 1]) at its position, attending to `padding`'s columns of the cache, through `step` (the
    model's compiled call, or the model); the last position's logits as float32 scores for the sampler."""
    forward = {cache_kwarg: cache, "use_cache": True, "return_dict": True, **logits_to_keep(base)}
    mask = step_mask(base, padding, positions, cache_kwarg, cache)
    return last_scores(step(input_ids=tokens, attention_mask=mask, position_ids=positions, **forward).logits)


def last_scores(logits: Any) -> Any:
    """The last position's logits, copied out as float32: no output of a CUDA graph may stay alive to its next
    replay (CUDA graph trees)."""
    import torch

    return logits[:, -1].to(copy=True, dtype=torch.float32)


def step_mask(base: Any, padding: Any, positions: Any, cache_kwarg: str, cache: Any) -> Any:
    """A one-token decode step's attention masks, as generate's prepare_inputs_for_generation makes them for a
    compilable cache (outside the compiled step, whose graphs are then the ones generate replays): from the 2-D
    `padding` over the cache's columns and the cache's own position."""
    import torch
    from transformers.masking_utils import create_masks_for_generate

    make = base.create_masks_for_generate if hasattr(base, "create_masks_for_generate") else create_masks_for_generate
    empty = torch.empty((padding.shape[0], 1, 0), dtype=base.dtype, device=padding.device)
    mask = make(config=base.config, inputs_embeds=empty, attention_mask=padding, position_ids=positions,
                **{cache_kwarg: cache})
    if isinstance(mask, dict):  # one mask per layer type; flex attention's BlockMask has no memory layout
        return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in mask.items()}
    return mask.contiguous() if isinstance(mask, torch.Tensor) else mask


def logits_to_keep(base: Any) -> dict[str, int]:
    """generate's `logits_to_keep=1` for a model whose forward takes it: the last position's logits only."""
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(base)) else {}


@functools.cache
def _takes_logits_to_keep(model_class: type) -> bool:  # read once a class: a decode step asks every token
    import inspect

    return "logits_to_keep" in inspect.signature(model_class.forward).parameters
