"""A static KV cache whose rows are slots that requests take and give back while the others decode (the slot engine,
generation/slot_engine.py): continuous batching on transformers' StaticCache and its compiled decode step.

A StaticCache writes every row at one shared position (its layers' `cumulative_length`), so a row does not own a
position of its own; it owns the cache columns its padding mask marks valid, and attention reads only those:
- a request joins by its prompt's K and V (a prefill into a dynamic cache) copied into its row, ending at the shared
  position `t`; a prompt longer than `t` first moves `t` forward for every row (the columns skipped are masked);
- every decode step writes all rows at `t` and moves it on by one;
- when `t` reaches the end, `compact` moves each row's valid columns (in their order) to the front, as far as the
  row that holds the most needs.
Moving a column does not change attention: the keys carry their rotary position from when they were computed, and
each row's position ids are its own (the engine's). The cache's tensors stay where they are (moved in place), so the
compiled decode step's graphs keep reading them. A free row's mask is all ones: it attends to whatever its columns
hold (a row with nothing valid would give NaN), and its tokens are dropped. `slot_length` sizes the rows from the
free memory; `slot_unsupported_reason` names the models whose layers the slots cannot hold (sliding windows). A
hybrid's (Qwen3.5's) linear-attention layers keep no columns but a state per row (its convolution's last inputs and
the delta rule's matrix): a joining request's prefill state is copied into its row, compaction leaves them be."""

from __future__ import annotations

from typing import Any

from medgpt_ray.generation.continuous import PoolLimits
from medgpt_ray.generation.decode_path import kv_bytes_per_token, state_bytes_per_row

MEMORY_SHARE = 0.8  # of the free memory the slot cache may take: the step's own tensors sit beside it


class SlotCache:
    """`rows` slots of `length` columns each on `model`'s device: `cache` (the StaticCache the model's forward
    takes), `padding` ([rows, length], 1 where a row's column is valid, the 2-D attention mask of every step), `t`
    (the next column every row writes)."""

    def __init__(self, model: Any, rows: int, length: int, cache_kwarg: str):
        import torch
        from transformers import StaticCache

        self.rows, self.length = rows, length
        device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)
        self.padding = torch.ones(rows, length, dtype=torch.long, device=device)
        self.active = torch.zeros(rows, dtype=torch.bool, device=device)
        with torch.no_grad():  # one forward allocates the layers' tensors (StaticCache makes them at first use)
            model(input_ids=torch.zeros(rows, 1, dtype=torch.long, device=device), attention_mask=self.padding,
                  position_ids=torch.zeros(rows, 1, dtype=torch.long, device=device), use_cache=True,
                  **{cache_kwarg: self.cache})
        self._reset()
        self.t = 0
        self.compactions = 0

    @property
    def layers(self) -> list[Any]:
        return self.cache.layers

    @property
    def attention_layers(self) -> list[Any]:
        """The layers that keep K and V in columns (a hybrid's linear-attention layers keep a state per row)."""
        return [layer for layer in self.cache.layers if not _is_linear(layer)]

    def _set_position(self, t: int) -> None:
        for layer in self.attention_layers:
            layer.cumulative_length.fill_(t)
        self.t = t

    def _reset(self) -> None:
        """The cache zeroed. A linear-attention layer's zeroed state is an empty history (its convolution over zeros is
        a sequence's left edge, its delta rule starts from the zero matrix), so it stays marked as a state the decode
        step continues from: the compiled step then sees one layout from its warm-up on (no recompilation)."""
        self.cache.reset()
        for layer in self.layers:
            if _is_linear(layer):
                layer.has_previous_state[0] = True

    def room(self, width: int) -> bool:
        """Whether a prompt of `width` columns fits beside the rows' current columns now (else: compact first)."""
        return max(self.t, width) < self.length

    def place(self, rows: list[int], prefill: Any, mask: Any) -> None:
        """Rows `rows` take the prompts of a prefill (`prefill`: the DynamicCache of a forward over the prompts,
        left-padded to one width; `mask`: their [len(rows), width] attention mask), ending at `t`."""
        import torch

        width = mask.shape[1]
        if self.t < width:
            self.padding[self.active, self.t:width] = 0  # the columns skipped: nobody's
            self._set_position(width)
        index = torch.tensor(rows, device=self.padding.device)
        start = self.t - width
        for layer, new in zip(self.layers, prefill.layers, strict=True):
            if _is_linear(layer):
                _place_state(layer, new, index)
                continue
            layer.keys[index, :, start:self.t] = new.keys.to(layer.keys.dtype)
            layer.values[index, :, start:self.t] = new.values.to(layer.values.dtype)
        self.padding[index] = 0
        self.padding[index, start:self.t] = mask.to(self.padding.dtype)
        self.padding[index, self.t:] = 1  # the columns this row's decode steps will write
        self.active[index] = True

    def free(self, row: int) -> None:
        self.active[row] = False
        self.padding[row] = 1

    def restart(self) -> None:
        """No row in use: the next prompts start from the first column."""
        self._set_position(0)

    def clear(self) -> None:
        """Every row given back and the cache zeroed (after a failed step, whose writes are not to be trusted)."""
        self._reset()
        self.active.zero_()
        self.padding.fill_(1)
        self._set_position(0)

    def advance(self) -> None:
        """After a decode step: every row wrote column `t`."""
        self.t += 1

    def compact(self) -> None:
        """Each row's valid columns moved to the front in their order, ending together at the new `t` (the most any
        row holds); the layers' K and V moved alike, in place."""
        import torch

        t = self.t
        valid = self.padding[:, :t].bool() & self.active[:, None]
        keep = int(valid.sum(dim=1).max())
        if keep >= t:
            raise RuntimeError(f"a request holds all {self.length} columns of the slot cache; a request may hold at "
                               "most one less than the cache's length")
        take = torch.sort(valid.int(), dim=1, stable=True).indices[:, t - keep:]  # each row's valid ones, last
        for layer in self.attention_layers:
            for tensor in (layer.keys, layer.values):
                heads, dim = tensor.shape[1], tensor.shape[3]
                moved = tensor[:, :, :t].gather(2, take[:, None, :, None].expand(-1, heads, -1, dim))
                tensor[:, :, :keep] = moved
        self.padding[:, :keep] = valid.gather(1, take).to(self.padding.dtype)
        self.padding[:, keep:] = 1
        self.padding[~self.active] = 1
        self._set_position(keep)
        self.compactions += 1


def _is_linear(layer: Any) -> bool:
    """A cache layer of a hybrid's linear attention (transformers' LinearAttentionLayer, 5.17 and 5.24)."""
    return hasattr(layer, "recurrent_states")


def _place_state(layer: Any, new: Any, index: Any) -> None:
    """The prompts' conv and recurrent states (a prefill's cache layer) into rows `index` of a linear-attention layer,
    in place; from then on the decode steps take the state path (a free row's state runs on unread, as its K/V do)."""
    for mine, theirs in ((layer.conv_states, new.conv_states), (layer.recurrent_states, new.recurrent_states)):
        mine[0][index] = theirs[0].to(mine[0].dtype)
    layer.has_previous_state[0] = True


def slot_unsupported_reason(config: Any) -> str | None:
    """Why a model of this config cannot decode on slots, or None. A hybrid's linear-attention layers can: their
    state is per row, taken with the row and overwritten when the next request joins (SlotCache.place)."""
    if "sliding_attention" in (config.get_text_config().to_dict().get("layer_types") or ()):
        return "sliding-window layers keep a cache shorter than the slots' columns"
    return None


def slot_length(model: Any, limits: PoolLimits, room: int | None) -> int:
    """Columns per slot: twice a request's tokens (so a compaction frees at least half), as far as MEMORY_SHARE of
    `room` (bytes; None: no limit, the CPU) holds for `limits.requests` rows."""
    length = 2 * limits.tokens_per_request
    element = next(model.parameters()).element_size()
    if room is not None:
        per_column = limits.requests * kv_bytes_per_token(model.config, element)
        states = limits.requests * state_bytes_per_row(model.config, element)  # a hybrid's, whatever the length
        length = min(length, int(MEMORY_SHARE * room - states) // per_column)
    if length < min(limits.tokens_per_request + 1, 256):
        raise ValueError(f"the free memory holds a slot cache of {length} tokens for {limits.requests} requests; "
                         f"a request may need {limits.tokens_per_request}: lower --max-concurrent, --max-tokens-limit "
                         "or --max-prompt-tokens")
    return length
