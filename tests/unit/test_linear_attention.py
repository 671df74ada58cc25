"""The pieces of a hybrid's linear-attention layer that need no model (hybrid/segments.py, hybrid/kernels.py,
trainer_kit/linear_attention.py): where a packed row's conversations start, their gather into a batch of their own
and back, which kernels a call takes here, and the refusal of a layer that is not ours. (The layer on real tiny
models: tests/stages/test_hybrid_packing.py.)"""

from __future__ import annotations

import torch

from medgpt_ray.hybrid import kernels
from medgpt_ray.hybrid.segments import SegmentBatch, cu_seqlens, is_packed, row_starts
from medgpt_ray.trainer_kit import linear_attention as la

TYPES = ["linear_attention"] * 3 + ["full_attention"]


def test_segments_start_where_positions_restart_and_at_every_row():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [1, 1, 0, 1, 2, 3]])  # packed; left-padded prompt
    cu = cu_seqlens(positions)
    assert cu.tolist() == [0, 3, 5, 6, 8, 12] and cu.dtype == torch.int32
    assert is_packed(cu, rows=2) and not is_packed(row_starts(2, 6, cu.device), rows=2)
    assert row_starts(2, 6, cu.device).tolist() == [0, 6, 12]


def test_segments_gather_in_batches_of_equal_chunk_counts_and_go_back_in_place():
    cu = torch.tensor([0, 3, 5, 6, 8, 12, 21])  # lengths 3, 2, 1, 2, 4, 9
    flat = torch.arange(21.0)[:, None].repeat(1, 2) + 1
    batches = SegmentBatch.buckets(cu, chunk=4)
    assert [b.valid.sum(1).tolist() for b in batches] == [[3, 2, 1, 2, 4], [9]]  # 1 chunk of 4; 3 chunks
    assert batches[0].gather(flat)[:, :, 0].tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0], [7, 8, 0, 0],
                                                        [9, 10, 11, 12]]
    out = torch.zeros_like(flat)
    for b in batches:
        out = b.scatter_into(out, b.gather(flat))
    assert torch.equal(out, flat)


def test_without_cuda_every_call_takes_the_reference():
    x = torch.randn(2, 4, requires_grad=True)
    assert kernels.route(x) == kernels.REFERENCE
    with torch.no_grad():
        assert kernels.route(x) == kernels.REFERENCE
    if not torch.cuda.is_available():
        found = kernels.probe()
        assert (found.forward, found.backward, found.training) == (False, False, kernels.REFERENCE)
        assert la.kernels_sentence() == f"on the PyTorch reference ({found.why})"


def test_a_layer_that_is_not_ours_or_got_no_boundaries_is_refused():
    plain = torch.nn.Linear(2, 2)
    why = la.refusal(plain, {la.ROWS_KEY: torch.zeros(1, 3)}, TYPES, False, "sdpa")
    assert why.startswith("3 of its 4 layers are linear attention, loaded without medgpt-ray's")


def test_a_kernel_that_fails_after_its_probe_demotes_its_device_to_the_reference(capsys):
    """A device whose probe passed, then whose kernels failed in a call: every later call there takes the reference
    (forward too), and the reason is said once, naming the error."""
    device = torch.device("cuda", 7)  # no such GPU is touched: only this process's record of it
    kernels._PROBED[7] = kernels.KernelProbe("GPU 7", True, True, "matched")
    try:
        found = kernels.demote(device, RuntimeError("Triton: out of shared memory\nmore"))
        assert (found.forward, found.backward, found.training) == (False, False, kernels.REFERENCE)
        assert kernels.probed(device) is found
        assert "failed in a call on GPU 7 (RuntimeError: Triton: out of shared memory)" in found.why
        assert capsys.readouterr().out.startswith("[linear attention] flash-linear-attention failed in a call")
    finally:
        del kernels._PROBED[7]
