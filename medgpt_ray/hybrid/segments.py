"""A row's conversations, from its position ids (trainer_kit/packed_rows.py restarts them at 0 at every
conversation and at the tail padding): as the `cu_seqlens` of one flattened sequence, what flash-linear-attention's
delta rule and causal convolution take (at batch size 1 only), and as a padded batch of segments, what the PyTorch
reference takes (each segment from a zero state, so nothing leaks from one conversation into the next)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """[rows, L] position ids -> int32 [N + 1]: the start of every segment of the rows flattened to [1, rows * L],
    and the end. A segment starts where the position restarts at 0 and at every row's first token (left-padded
    prompts count from their first real token; the padding before it is a segment of its own)."""
    starts = position_ids == 0
    starts[:, 0] = True
    flat = starts.reshape(-1).nonzero().flatten()
    end = torch.tensor([starts.numel()], device=flat.device, dtype=flat.dtype)
    return torch.cat([flat, end]).to(torch.int32)


class LastSegments:
    """The segments of the last position ids seen, kept for the next caller with the same tensor: every
    linear-attention layer of a forward (and a checkpointed layer's recompute) gets the decoder's one position-ids
    tensor, so the segments are found once a pass, not once a layer. The CPU copy is what flash-linear-attention
    takes as `cu_seqlens_cpu` to lay out its chunks without reading the GPU: one device sync a pass (the copy), not
    one in every kernel call of every layer (18 in a 0.8B Qwen3.5's forward, as many again in its backward)."""

    def __init__(self) -> None:
        self._key: tuple[torch.Tensor, int] | None = None
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None

    def of(self, position_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cu_seqlens on `device`, the same on the CPU as int64) for `position_ids` [rows, L]."""
        key = self._key
        if key is not None and key[0] is position_ids and key[1] == position_ids._version and \
                self._value is not None and self._value[0].device == device:
            return self._value
        cu = cu_seqlens(position_ids.to(device))
        self._key, self._value = (position_ids, position_ids._version), (cu, cu.to("cpu", torch.int64))
        return self._value


def row_starts(rows: int, width: int, device: torch.device) -> torch.Tensor:
    """cu_seqlens of `rows` rows of `width` tokens, one sequence a row (no packing)."""
    return torch.arange(0, (rows + 1) * width, width, device=device, dtype=torch.int32)


def is_packed(cu: torch.Tensor, rows: int) -> bool:
    """Whether a row holds more than one segment."""
    return cu.numel() - 1 > rows


@dataclass(frozen=True)
class SegmentBatch:
    """Segments of a flattened sequence gathered into [N, longest] (right-padded with zeros): `index` [N, longest] the
    flat position of each slot, `valid` which slots are real. Causal layers see no padding before a real token, so
    the real slots' outputs are the segment's own."""

    index: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def of(cls, starts: torch.Tensor, lengths: torch.Tensor, total: int) -> SegmentBatch:
        longest = int(lengths.max())
        offsets = torch.arange(longest, device=starts.device)
        valid = offsets[None, :] < lengths[:, None]
        index = (starts[:, None] + offsets[None, :]).clamp(max=total - 1)
        return cls(index, valid)

    @classmethod
    def buckets(cls, cu: torch.Tensor, chunk: int) -> list[SegmentBatch]:
        """The segments of `cu` in batches of the same number of `chunk`-token chunks: each padded by less than one
        chunk (the reference pads every sequence to whole chunks anyway), so memory stays that of the tokens, not of
        as many copies of the longest conversation as the row holds."""
        cu = cu.long()
        starts, lengths = cu[:-1], cu[1:] - cu[:-1]
        chunks = (lengths + chunk - 1) // chunk
        return [cls.of(starts[chunks == n], lengths[chunks == n], int(cu[-1])) for n in chunks.unique().tolist()]

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [N, longest, ...], zeros in the padding slots."""
        out = flat[self.index]
        shape = (*self.valid.shape, *([1] * (flat.dim() - 1)))
        return out * self.valid.reshape(shape).to(out.dtype)

    def scatter_into(self, flat: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
        """`flat` [T, ...] with the real slots of `padded` [N, longest, ...] written at their positions (out of place,
        so gradients flow to both)."""
        return flat.index_put((self.index[self.valid],), padded[self.valid])
