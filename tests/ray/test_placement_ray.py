"""Ray Train workers land on exactly the GPUs the placement policy chose (logical GPUs on one node)."""

from __future__ import annotations

import threading

import pytest

from medgpt_ray.placement.device import StagePlacement
from medgpt_ray.placement.policy import partition_gpus, place_stage
from medgpt_ray.placement.topology import load_topology_file
from tests.placement_probe import run_placed

pytestmark = pytest.mark.ray

CASES = [
    ("8x4090-switches-single-socket", 4, None, [0, 2, 4, 6]),
    ("8x4090-dual-socket", 2, None, [0, 2]),
    ("8x4090-dual-socket", 2, [5, 7], [5, 7]),
]


def run_side_by_side(placements: list[StagePlacement], tmp_path, name: str) -> list[list[dict]]:
    """Each placement as its own Ray Train run, all at once."""
    results: dict[int, list[dict]] = {}

    def go(i: int) -> None:
        results[i] = run_placed(placements[i], tmp_path / f"{name}{i}", tmp_path / "storage", f"{name}{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(placements))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return [results[i] for i in range(len(placements))]


@pytest.mark.parametrize("topology,workers,explicit,expected", CASES)
def test_the_policy_chooses_these_gpus(topology, workers, explicit, expected):
    assert place_stage(load_topology_file(topology), workers, explicit, {}).gpus == expected


def test_concurrent_stages_bind_their_own_chosen_gpus(ray_cluster, tmp_path):
    # One pair of Ray Train runs at once, not a run per case: 4 workers on the switches box's choice [0, 2, 4, 6]
    # beside 2 on the explicit [5, 7] of the dual-socket box (disjoint sets, as two concurrent jobs hold). The
    # remaining case ([0, 2], 2 workers, the same box) hands Ray the same shape as [5, 7] (ray_train_resources
    # reads only the placement); its choice is checked above.
    cases = (CASES[0], CASES[2])
    placements = [place_stage(load_topology_file(topology), workers, explicit, {})
                  for topology, workers, explicit, _ in cases]
    results = run_side_by_side(placements, tmp_path, "probe")
    for (_, _, _, expected), seen in zip(cases, results, strict=True):
        assert [w["physical_gpu"] for w in seen] == expected  # rank r drives chosen[r]
        assert {w["node_id"] for w in seen} == {seen[0]["node_id"]}
        for w in seen:
            # The device the trainer will use (ACCELERATE_TORCH_DEVICE within the CUDA_VISIBLE_DEVICES that Ray
            # left alone under NOSET) is the chosen GPU of this local rank.
            assert w["device_index"] == w["local_rank"] and w["device_gpu"] == expected[w["local_rank"]]
            assert w["nccl_p2p_disable"] == "1"
            # Bound by the backend before the train function (where Ray's own set_device would have run).
            assert w["bound_before"] == f"cuda:{w['local_rank']}"


def test_concurrent_jobs_are_given_disjoint_gpu_sets():
    # Which sets two 4-GPU jobs get; that Ray Train holds concurrent runs to their sets is the test above.
    jobs, _ = partition_gpus(load_topology_file("8x4090-dual-socket"), [4, 4])
    assert jobs == [[0, 1, 2, 3], [4, 5, 6, 7]]
