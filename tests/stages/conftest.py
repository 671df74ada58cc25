"""Fixtures the stage tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread, as a Ray worker of one CPU gets: on a busy 2-core box two threads are ~10x slower (the rloo
    stage's 2 steps: 19 s in two threads, 1.1 s in one, while another training run shared the box)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
