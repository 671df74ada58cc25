"""The decision for a hybrid's linear-attention layers (trainer_kit/linear_attention.py): packed only with the
boundaries in hand AND both kernel packages importable; each refusal says which is missing. (The probe that reads
what a real model's layer receives: tests/stages/test_hybrid_packing.py.)"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from medgpt_ray.trainer_kit import linear_attention as la

TYPES = ["linear_attention"] * 3 + ["full_attention"]
BOUNDS = {"cu_seq_lens_q": torch.tensor([0, 3, 5]), "seq_idx": torch.tensor([[0, 0, 0, 1, 1]])}


def test_the_missing_kernels_are_the_packages_this_process_cannot_import():
    def importable(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # fla.ops... when fla itself is absent
            return False

    missing = {dist for dist, _ in la.missing_kernels()}
    for module, _, dist, _ in la.KERNELS:
        if not importable(module):
            assert dist in missing


@pytest.mark.parametrize("missing", [[], [("causal-conv1d", "a CUDA build")],
                                     [("flash-linear-attention", "pip"), ("causal-conv1d", "a CUDA build")]])
def test_boundaries_and_kernels_both_or_refused(missing, monkeypatch):
    monkeypatch.setattr(la, "missing_kernels", lambda: missing)
    with_bounds = la.refusal(BOUNDS, TYPES, True, "flash_attention_2")
    if not missing:
        assert with_bounds is None
    else:
        assert with_bounds.startswith("3 of its 4 layers are linear attention, and the boundary-aware")
        assert all(f"{dist} ({how})" in with_bounds for dist, how in missing)
    for seen in ({}, {"cu_seq_lens_q": BOUNDS["cu_seq_lens_q"]}, {"seq_idx": None, "attention_mask": None}):
        why = la.refusal(seen, TYPES, False, "sdpa")  # one of the two is not enough: conv1d and the delta rule
        assert why is not None and "get no sequence boundaries (cu_seq_lens_q, seq_idx)" in why
        assert "sdpa rows with per-conversation position ids" in why
        assert ("kernels are missing here" in why) == bool(missing)
