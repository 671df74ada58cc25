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
- the call's settings are generate's own (`_prepare_generation_config`, `_prepare_special_tokens`), its logits
  processors are the list generate builds (`_get_logits_processor`), used as they are;
- a token is drawn as torch.multinomial draws one sample (an Exp(1) race: probs / Exp(1), argmax; the same random
  numbers, so a seeded call samples the tokens generate samples) without its checks; a probability that is not
  finite is still refused, as soon as the flag below is read;
- the prefill runs eagerly and every decode step through the model's own compiled call (`get_compiled_call`, the
  graphs generate replays), given what generate gives it: the step's mask built outside the graph by transformers'
  `create_masks_for_generate` (about 60 us of host time on this CPU, now beside the GPU's work instead of before it);
- whether every sequence has stopped is copied to the host without waiting and read once it is there (a step or
  so late: DeferredFlags); steps past the last stop only add padding, which is cut, so the sequences are generate's.
Anything else (beams, a streamer, stop strings, a processor that is not sync-free) is generate's: `prepare` says
why, and StaticDecoder records it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOOP, GENERATE = "medgpt", "generate"  # the decode loop a StaticDecoder call ran: this one, or transformers'
# generate's logits processors that only queue GPU work (no host read of a device value), by class name.
SYNC_FREE = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
             "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "RepetitionPenaltyLogitsProcessor"}
CALL_KEYS = {"attention_mask"}  # generate's keyword arguments the loop takes besides the generation config


@dataclass
class DecodeCall:
    """One generate call as the loop runs it: generate's processors and special tokens for this config."""

    processors: Any  # transformers' LogitsProcessorList
    do_sample: bool
    max_new_tokens: int
    expand: int  # num_return_sequences: each prompt repeated, as generate does
    eos: Any  # the stop token ids (a tensor) or None
    pad: int
    compiled_step: Any  # the decode step: the model's compiled call, or the model itself
    as_output: bool = False  # return_dict_in_generate: the sequences in generate's output object (GKD asks for it)


def text_model(model: Any) -> Any:
    """The transformers model whose generate a call would run: a PeftModel's base (LoRA's layers inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def prepare(model: Any, input_ids: Any, config: Any, kwargs: dict[str, Any], cache_kwarg: str,
            cache: Any) -> tuple[DecodeCall | None, str]:
    """(the call, "") when the loop can decode it exactly as generate would, else (None, why not). `config` is the
    caller's generation config (not changed); `kwargs` what generate would get beside it."""
    from transformers import LogitsProcessorList
    from transformers.generation.configuration_utils import GenerationMode

    if set(kwargs) - CALL_KEYS:
        return None, f"generate's arguments {sorted(set(kwargs) - CALL_KEYS)}"
    if kwargs.get("attention_mask") is None:
        return None, "no attention mask"
    peft = model.active_peft_config if hasattr(model, "active_peft_config") else None
    if peft is not None and peft.is_prompt_learning:
        return None, "a prompt-learning adapter"
    base = text_model(model)
    if base.config.is_encoder_decoder:
        return None, "an encoder-decoder model"
    config, extra = base._prepare_generation_config(config)
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        return None, f"generation mode {mode.value}"
    if extra or config.output_scores or config.output_logits or config.stop_strings or config.max_time \
            or config.token_healing:
        return None, "outputs beyond the sequences, or stopping beyond stop tokens"
    if config.max_new_tokens is None:
        return None, "no max_new_tokens"
    base._prepare_special_tokens(config, True, device=input_ids.device, batch_size=input_ids.shape[0])
    processors = base._get_logits_processor(
        generation_config=config, input_ids_seq_length=input_ids.shape[1], encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(), device=input_ids.device,
        model_kwargs={"attention_mask": kwargs["attention_mask"]})
    waits = sorted({type(p).__name__ for p in processors} - SYNC_FREE)
    if waits:
        return None, f"logits processors {waits}"
    compiled = base._valid_auto_compile_criteria({cache_kwarg: cache}, config)
    step = base.get_compiled_call(config.compile_config) if compiled else base
    pad = config._pad_token_tensor
    return DecodeCall(processors, bool(config.do_sample), int(config.max_new_tokens),
                      max(1, config.num_return_sequences or 1), config._eos_token_tensor,
                      int(pad) if pad is not None else 0, step, bool(config.return_dict_in_generate)), ""


def draw(scores: Any, do_sample: bool, bad: Any) -> Any:
    """The next token of each row: the argmax, or one sample as torch.multinomial(softmax(scores), 1) draws it (its
    one-sample algorithm, the same random numbers) without reading its validity checks; `bad` (a device flag) turns
    true on probabilities that are not finite or negative (DeferredFlags reads it)."""
    import torch

    if not do_sample:
        return torch.argmax(scores, dim=-1)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    bad |= ~(torch.isfinite(probs) & (probs >= 0)).all()
    race = torch.empty_like(probs).exponential_(1)
    return (probs / race).argmax(dim=-1)


def decode(model: Any, input_ids: Any, attention_mask: Any, call: DecodeCall, cache_kwarg: str, cache: Any,
           cache_len: int) -> Any:
    """generate's sequences (prompt, then the new tokens; padding after a row's stop token; as long as the longest
    row) from `cache` (a reset StaticCache of `cache_len` positions, at least prompt + max_new_tokens - 1)."""
    import torch

    base = text_model(model)
    if call.expand > 1:
        input_ids = input_ids.repeat_interleave(call.expand, dim=0)
        attention_mask = attention_mask.repeat_interleave(call.expand, dim=0)
    rows, width = input_ids.shape
    out = torch.full((rows, width + call.max_new_tokens), call.pad, dtype=input_ids.dtype, device=input_ids.device)
    out[:, :width] = input_ids
    padding = torch.ones(rows, cache_len, dtype=attention_mask.dtype, device=input_ids.device)
    padding[:, :width] = attention_mask
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    forward = {cache_kwarg: cache, "use_cache": True, "return_dict": True, **logits_to_keep(base)}
    logits = base(input_ids=input_ids, attention_mask=padding, position_ids=positions, **forward).logits
    following = positions[:, -1:] + 1
    unfinished = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    bad = torch.zeros((), dtype=torch.bool, device=input_ids.device)
    flags, steps = DeferredFlags(input_ids.device), 0
    for i in range(call.max_new_tokens):
        scores = call.processors(out[:, :width + i], logits[:, -1].to(copy=True, dtype=torch.float32))
        logits = None  # the graph's output, copied: none may be alive at the next replay (CUDA graph trees)
        token = draw(scores, call.do_sample, bad)
        if call.eos is not None:
            token = torch.where(unfinished, token, call.pad)
            unfinished &= ~torch.isin(token, call.eos)
        out[:, width + i] = token
        steps = i + 1
        flags.push(unfinished, bad)
        if steps == call.max_new_tokens or flags.stopped(call):
            break
        step_positions = following + i
        mask = step_mask(base, padding, step_positions, cache_kwarg, cache)
        logits = call.compiled_step(input_ids=token[:, None], attention_mask=mask, position_ids=step_positions,
                                    **forward).logits
    refuse(bool(bad), call)  # the last steps' probabilities too: one wait for the GPU, at the end
    sequences = out[:, :width + generated_length(out[:, width:width + steps], call.eos)]
    if call.as_output:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


class DeferredFlags:
    """"Every row has stopped" and "a probability was refused", copied to the host without waiting (pinned memory,
    an event) and read once the GPU has written them, a step or so after: the loop learns it may stop without ever
    waiting for the GPU (transformers' DeferredStopCheck does this on MPS only). On the CPU the copy is the value."""

    def __init__(self, device: Any):
        import torch

        cuda = device.type == "cuda"
        self.slots = [torch.zeros(2, dtype=torch.bool, pin_memory=cuda) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)] if cuda else None
        self.pushed = 0

    def push(self, unfinished: Any, bad: Any) -> None:
        import torch

        slot = self.pushed % 2
        self.slots[slot].copy_(torch.stack([~unfinished.any(), bad]), non_blocking=True)
        if self.events:
            self.events[slot].record()
        self.pushed += 1

    def stopped(self, call: DecodeCall) -> bool:
        """Whether every row had stopped as of the latest push the GPU has carried out (False while it has not);
        raises on a refused probability."""
        slot = (self.pushed - 1) % 2
        if self.events and not self.events[slot].query():
            return False
        every_row, bad = self.slots[slot].tolist()
        refuse(bad, call)
        return call.eos is not None and every_row


def refuse(bad: bool, call: DecodeCall) -> None:
    """Raise on probabilities generate's torch.multinomial would have refused."""
    if call.do_sample and bad:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0 (the model's logits, "
                           "as generate's torch.multinomial would have refused them)")


def generated_length(new: Any, eos: Any) -> int:
    """Where generate would have stopped: after the token that stopped the last row to stop (every row padded past
    its stop token), or all of `new` if a row never stopped."""
    import torch

    if eos is None or new.shape[1] == 0:
        return new.shape[1]
    is_stop = torch.isin(new, eos)
    ends = torch.where(is_stop.any(dim=1), is_stop.int().argmax(dim=1) + 1, new.shape[1])
    return int(ends.max())


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
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}
