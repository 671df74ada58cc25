"""A stage spread over two nodes: each node's workers bind the chosen GPUs (ray.cluster_utils.Cluster)."""

from __future__ import annotations

import shutil

import pytest

from medgpt_ray.placement.policy import place_stage
from medgpt_ray.placement.topology import load_topology_file
from tests.placement_probe import run_placed
from tests.ray_startup import ray_temp_root


@pytest.fixture
def two_gpu_nodes(own_ray_connection, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    # A CPU-only head and two "4-GPU boxes" advertising their per-GPU tokens, as cluster/start-node.sh does.
    temp_dir = ray_temp_root()  # not /tmp/ray: another cluster on this machine may own it
    # Cluster writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster whatever temp_dir says: ours, not
    # /tmp/ray's (another cluster's file, or no such directory on a fresh machine: FileNotFoundError).
    (temp_dir / "ray").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "temp_dir": str(temp_dir),
                                                            "dashboard_host": "127.0.0.1"})
    nodes = [cluster.add_node(num_cpus=1, num_gpus=4, resources={f"medgpt_gpu_{i}": 1 for i in range(4)})
             for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield [n.node_id for n in nodes]
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.leaves_shared_cluster
def test_each_node_runs_its_share_on_the_chosen_gpus(two_gpu_nodes, tmp_path):
    # ~35-50 s on 2 cores, more on a shared box: three Ray nodes of its own (the one test that needs a multi-node
    # cluster) and a 4-worker Ray Train run across them.
    # 4 workers on GPUs [1, 3] of every node: the tokens (half of medgpt_gpu_1 and _3 per worker) put exactly
    # two workers on each node, and local ranks 0/1 drive GPU 1/3.
    placement = place_stage(load_topology_file("4x4090-single-socket"), 4, [1, 3], {})
    assert placement.nodes == 2
    seen = run_placed(placement, tmp_path / "out", tmp_path / "storage", "two-nodes")
    assert len(seen) == 4
    by_node: dict[str, list[tuple[int, int]]] = {}
    for w in seen:
        assert w["device_gpu"] == w["physical_gpu"]
        by_node.setdefault(w["node_id"], []).append((w["device_index"], w["device_gpu"]))
    assert set(by_node) == set(two_gpu_nodes)
    assert all(sorted(v) == [(0, 1), (1, 3)] for v in by_node.values())
    # Ranks of one node are contiguous (Ray Train orders workers by node).
    assert [w["node_id"] for w in seen][0] == [w["node_id"] for w in seen][1]
