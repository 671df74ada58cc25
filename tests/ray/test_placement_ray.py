"""Ray Train workers land on exactly the GPUs the placement policy chose (logical GPUs on one node)."""

from __future__ import annotations

import threading

import pytest

from medgpt_ray.placement.policy import partition_gpus, place_stage
from medgpt_ray.placement.topology import load_topology_file
from tests.placement_probe import run_placed

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("topology,workers,explicit,expected", [
    ("8x4090-switches-single-socket", 4, None, [0, 2, 4, 6]),
    ("8x4090-dual-socket", 2, None, [0, 2]),
    ("8x4090-dual-socket", 2, [5, 7], [5, 7]),
])
def test_workers_bind_the_chosen_gpus(ray_cluster, tmp_path, topology, workers, explicit, expected):
    placement = place_stage(load_topology_file(topology), workers, explicit, {})
    assert placement.gpus == expected
    seen = run_placed(placement, tmp_path / "out", tmp_path / "storage", f"probe-{len(expected)}")
    assert [w["physical_gpu"] for w in seen] == expected  # rank r drives chosen[r]
    assert {w["node_id"] for w in seen} == {seen[0]["node_id"]}
    for w in seen:
        # The device the trainer will use (ACCELERATE_TORCH_DEVICE within the CUDA_VISIBLE_DEVICES that Ray
        # left alone under NOSET) is the chosen GPU of this local rank.
        assert w["device_index"] == w["local_rank"] and w["device_gpu"] == expected[w["local_rank"]]
        assert w["nccl_p2p_disable"] == "1"


def test_concurrent_jobs_get_disjoint_sets(ray_cluster, tmp_path):
    topo = load_topology_file("8x4090-dual-socket")
    jobs, _ = partition_gpus(topo, [4, 4])
    results: dict[int, list[dict]] = {}

    def go(i: int) -> None:
        results[i] = run_placed(place_stage(topo, 4, None, {}, gpus=jobs[i]), tmp_path / f"out{i}",
                                tmp_path / "storage", f"job{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert [[w["physical_gpu"] for w in results[i]] for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
