"""Topology parsing, the placement policy on the shipped box shapes, NCCL presets and the `topo` command."""

from __future__ import annotations

import json
import os
import stat

import pytest

from medgpt_ray.cli import main
from medgpt_ray.placement.device import StagePlacement, ray_train_resources
from medgpt_ray.placement.nccl import nccl_env
from medgpt_ray.placement.policy import (
    PlacementError,
    choose_gpus,
    partition_gpus,
    place_stage,
    set_cost,
)
from medgpt_ray.placement.topology import (
    NoGPUError,
    TopologyError,
    load_topology_file,
    parse_topo_matrix,
    read_local_topology,
    shipped_topologies,
)

# What `nvidia-smi topo -m` prints on a box with a NIC (driver 550): tabs, NIC rows/columns, a legend.
REAL_SHAPE = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPIX\tSYS\tSYS\tPIX\t0-15\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tSYS\tSYS\tPIX\t0-15\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tNV4\tSYS\t16-31\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tNV4\t X \tSYS\t16-31\t1\t\tN/A\n"
    "NIC0\tPIX\tPIX\tSYS\tSYS\t X \t\t\t\t\n\n"
    "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def test_parse_real_output_with_nic_columns_and_legend():
    t = parse_topo_matrix(REAL_SHAPE)
    assert t.n == 4 and t.link(0, 1) == "PIX" and t.link(2, 3) == "NV4" and t.link(0, 0) == "X"
    assert t.numa == ["0", "0", "1", "1"] and t.cpu_affinity[2] == "16-31"
    assert t.switch_groups() == [[0, 1], [2], [3]]


def test_bad_matrices_name_the_problem():
    with pytest.raises(TopologyError, match=r"<text>:2: unknown link type 'QQQ'"):
        parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tQQQ\nGPU1\tQQQ\t X \n")
    with pytest.raises(TopologyError, match="GPU0-GPU1 is PIX but GPU1-GPU0 is SYS"):
        parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tSYS\t X \n")
    with pytest.raises(NoGPUError, match="no GPU matrix"):
        parse_topo_matrix("No devices were found\n")


def test_every_shipped_topology_parses():
    names = shipped_topologies()
    assert set(names) >= {"4x4090-single-socket", "8x4090-switches-single-socket", "8x4090-dual-socket",
                          "2x3090-nvlink"}
    for name in names:
        t = load_topology_file(name)
        assert t.gpu_name.startswith(("NVIDIA GeForce", "NVIDIA H200")) and t.n in (2, 4, 8)
    assert not load_topology_file("8x4090-dual-socket").p2p_available()
    assert load_topology_file("2x3090-nvlink").p2p_available()


def test_captured_h200_topology_with_nvidia_smis_escape_codes():
    """Captured on the lent 2x H200 machine (issue 8): nvidia-smi underlines the header with ANSI escapes
    even into a pipe, which the first real run tripped over."""
    from medgpt_ray.placement.topology import SHIPPED_DIR

    raw = (SHIPPED_DIR / "2xh200-nvlink-captured.txt").read_text()
    assert "\x1b[4m" in raw  # the file is the raw capture
    t = load_topology_file("2xh200-nvlink-captured")
    assert t.links == [["X", "NV18"], ["NV18", "X"]] and t.p2p_available()
    assert choose_gpus(t, 2).gpus == [0, 1]


def test_nvml_constants_of_every_pynvml_build_become_ints():
    import enum

    from medgpt_ray.placement.topology import _nvml_int

    class Caps(enum.Enum):
        READ = 0

    assert _nvml_int(0) == 0 and _nvml_int((0,)) == 0 and _nvml_int(Caps.READ) == 0  # the H200 image's: a tuple


def test_switch_box_spreads_a_job_over_switches():
    t = load_topology_file("8x4090-switches-single-socket")
    two, four = choose_gpus(t, 2), choose_gpus(t, 4)
    # No P2P on GeForce 40: two GPUs behind one switch share its uplink, so pick different switches.
    assert two.gpus == [0, 2] and two.cost < set_cost(t, (0, 1))
    assert four.gpus == [0, 2, 4, 6] and four.runner_up == [0, 1, 2, 3] and four.cost < four.runner_up_cost
    # With P2P the same-switch pair talks through the switch alone and wins.
    t.p2p = True
    assert choose_gpus(t, 2).gpus == [0, 1]


def test_dual_socket_box_keeps_concurrent_jobs_on_their_own_socket():
    t = load_topology_file("8x4090-dual-socket")
    jobs, cost = partition_gpus(t, [4, 4])
    assert jobs == [[0, 1, 2, 3], [4, 5, 6, 7]]
    crossed = set_cost(t, (0, 2, 4, 6), set(range(8))) + set_cost(t, (1, 3, 5, 7), set(range(8)))
    assert cost < crossed
    assert choose_gpus(t, 2).gpus == [0, 2]  # same socket, different switches


def test_partitions_are_disjoint_and_cover_requests():
    t = load_topology_file("8x4090-switches-single-socket")
    jobs, _ = partition_gpus(t, [2, 2, 2, 2])
    assert sorted(g for j in jobs for g in j) == list(range(8))
    assert all(t.link(a, b) != "PIX" for a, b in jobs)  # each pair on distinct switches
    jobs3, _ = partition_gpus(t, [4, 2])
    assert len(jobs3[0]) == 4 and len(jobs3[1]) == 2 and not set(jobs3[0]) & set(jobs3[1])
    with pytest.raises(PlacementError, match="the node has 8"):
        partition_gpus(t, [4, 4, 2])


def test_nvlink_pair_is_a_bonus():
    t = load_topology_file("2x3090-nvlink")
    assert choose_gpus(t, 2).cost < 1.0


def test_nccl_presets_never_override_the_user():
    t = load_topology_file("8x4090-dual-socket")
    env = nccl_env(t, 1, environ={})
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    multi = nccl_env(t, 3, environ={})
    assert multi["NCCL_SOCKET_NTHREADS"] == "4" and multi["NCCL_NSOCKS_PERTHREAD"] == "4"
    mine = nccl_env(t, 1, user_env={"NCCL_P2P_DISABLE": "0"}, environ={"NCCL_IB_DISABLE": "0"})
    assert mine["NCCL_P2P_DISABLE"] == "0" and "NCCL_IB_DISABLE" not in mine
    assert "NCCL_P2P_DISABLE" not in nccl_env(load_topology_file("2x3090-nvlink"), 1, environ={})


def test_stage_placement_checks_explicit_lists_and_builds_ray_resources():
    t = load_topology_file("8x4090-switches-single-socket")
    with pytest.raises(PlacementError, match=r"in 0..7"):
        place_stage(t, 2, [0, 9], {})
    with pytest.raises(PlacementError, match="3 workers do not split evenly"):
        place_stage(t, 3, [0, 1], {})
    assert place_stage(t, 4, [1, 3], {}).nodes == 2  # an explicit list names the GPUs of every node
    p = place_stage(t, 4, None, {})
    assert p.gpus == [0, 2, 4, 6] and p.nodes == 1
    advertised = {f"medgpt_gpu_{i}": 1.0 for i in range(8)}
    scaling, env = ray_train_resources(p, 4, True, 2, advertised, {"A": "1"})
    assert scaling["resources_per_worker"] == {"CPU": 2, "GPU": 1, "medgpt_gpu_0": 0.25, "medgpt_gpu_2": 0.25,
                                               "medgpt_gpu_4": 0.25, "medgpt_gpu_6": 0.25}
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2,4,6,1,3,5,7"
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["A"] == "1" and env["NCCL_P2P_DISABLE"] == "1"
    # A cluster that does not advertise the tokens still runs (Ray counts GPUs; the env picks them).
    assert "medgpt_gpu_0" not in ray_train_resources(p, 4, True, 2, {}, {})[0]["resources_per_worker"]
    two_nodes = place_stage(t, 16, None, {})
    assert two_nodes.nodes == 2 and len(two_nodes.gpus) == 8
    back = StagePlacement.from_dict(p.to_dict())
    assert (back.gpus, back.node_gpus, back.num_workers, back.nccl_env) == (p.gpus, 8, 4, p.nccl_env)


def _topo_json(capsys, *argv) -> dict:
    assert main(["topo", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_topo_cli_contract(capsys):
    one = _topo_json(capsys, "--topology-file", "8x4090-switches-single-socket", "--gpus", "4")
    assert one["gpus"] == [0, 2, 4, 6] and one["cost"] > 0 and one["nccl_env"]["NCCL_P2P_DISABLE"] == "1"
    many = _topo_json(capsys, "--topology-file", "8x4090-dual-socket", "--gpus", "4,4")
    assert many["jobs"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and "nccl_env" in many
    p2p = _topo_json(capsys, "--topology-file", "8x4090-switches-single-socket", "--gpus", "2", "--p2p", "on")
    assert p2p["gpus"] == [0, 1] and "NCCL_P2P_DISABLE" not in p2p["nccl_env"]
    assert main(["topo", "--topology-file", "8x4090-dual-socket", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "GPU0  X" in out and "choice for 2 GPU(s): [0, 2]" in out and "runner-up" in out
    assert main(["topo", "--topology-file", "nope"]) == 2
    assert "topology file not found" in capsys.readouterr().err


def test_topo_without_a_gpu_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert main(["topo"]) == 1
    assert "no GPU here" in capsys.readouterr().err


def test_local_topology_is_read_through_nvidia_smi(tmp_path):
    fake = tmp_path / "nvidia-smi"
    matrix = load_topology_file("4x4090-single-socket").source
    listing = "".join(f"NVIDIA GeForce RTX 4090, 00000000:{0x41 + i:02X}:00.0\\n" for i in range(4))
    fake.write_text("#!/bin/sh\nif [ \"$1\" = topo ]; then cat '" + matrix + "'; "
                    f"else printf '{listing}'; fi\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    t = read_local_topology(str(fake))
    assert t.n == 4 and t.gpu_name == "NVIDIA GeForce RTX 4090" and t.link(0, 2) == "NODE"
    assert t.bus_ids == ["00000000:41:00.0", "00000000:42:00.0", "00000000:43:00.0", "00000000:44:00.0"]
    assert os.path.basename(t.source) == "nvidia-smi topo -m"


def test_a_wave_of_side_by_side_stages_gets_disjoint_gpus():
    from medgpt_ray.config import ConfigError, PipelineConfig
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.run.gpu_placement import place_wave

    def cfg(**stages):
        return PipelineConfig.model_validate({
            "model": {"path": "tiny"}, "resources": {"num_workers": 4, "use_gpu": True,
                                                     "topology_file": "8x4090-dual-socket"},
            "stages": {s: {"method": "lora", "effective_batch": 8, **kw} for s, kw in stages.items()}})

    c = cfg(rm={}, dpo={})
    budget = make_budget(24, 2, "rtx4090", True, "test")
    plans = {s: plan_stage(s, c.stages.get(s), 4, True, load_shape("qwen2.5-0.5b"), budget) for s in ("rm", "dpo")}
    lines: list[str] = []
    topo = load_topology_file("8x4090-dual-socket")
    placed = place_wave(c, topo, ["rm", "dpo"], plans, True, lines.append)
    assert [placed[s].placement.gpus for s in ("rm", "dpo")] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(plans[s].placement is None for s in plans)  # new plans; the planner's are not mutated
    saved = placed["dpo"].to_dict()  # what plan.json will hold (run/job.py writes it)
    assert saved["placement"]["gpus"] == [4, 5, 6, 7] and saved["placement"]["nccl_env"]["NCCL_P2P_DISABLE"] == "1"
    assert lines[0].startswith("[ rm] GPUs [0, 1, 2, 3] on each of 1 node(s)")
    clash = cfg(rm={"placement": [0, 1, 2, 3]}, dpo={"placement": [2, 3, 4, 5]})
    with pytest.raises(ConfigError, match="overlapping GPUs"):
        place_wave(clash, topo, ["rm", "dpo"], plans, True, lines.append)
    with pytest.raises(ConfigError, match=r"stages.rm.placement: .*in 0..7"):
        place_wave(cfg(rm={"placement": [0, 8, 1, 2]}), topo, ["rm"], plans, False, lines.append)


def test_a_reward_model_of_its_own_gets_a_gpu_no_worker_uses_or_the_stage_is_refused():
    from medgpt_ray.config import ConfigError, PipelineConfig
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.run.gpu_placement import place_wave

    def cfg(workers: int) -> PipelineConfig:
        return PipelineConfig.model_validate({
            "model": {"path": "tiny"}, "resources": {"num_workers": workers, "use_gpu": True},
            "stages": {"rm": {"method": "lora"}, "rloo": {"enabled": True, "method": "lora", "reward_model_gpu": True,
                                                         "effective_batch": 8 * workers, "seq_len": 512}}})

    topo = load_topology_file("4x4090-single-socket")
    budget = make_budget(24, 2, "rtx4090", True, "test")
    lines: list[str] = []
    c = cfg(3)
    plans = {"rloo": plan_stage("rloo", c.stages.rloo, 3, True, load_shape("qwen2.5-1.5b"), budget)}
    placed = place_wave(c, topo, ["rloo"], plans, False, lines.append)["rloo"]
    assert placed.reward_model_gpu not in placed.placement.gpus and 0 <= placed.reward_model_gpu < 4
    assert placed.reward_model_on.startswith(f"GPU {placed.reward_model_gpu}, its own (a Ray actor): ")
    saved = placed.to_dict()  # what plan.json will hold (run/job.py writes it)
    assert saved["reward_model_gpu"] == placed.reward_model_gpu
    assert lines[-1] == (f"[rloo] reward model on GPU {placed.reward_model_gpu}, its own (a Ray actor beside the "
                         f"workers on GPUs {placed.placement.gpus})")
    # Four workers take the box's four GPUs: no GPU is left for the reward model.
    c4 = cfg(4)
    plans4 = {"rloo": plan_stage("rloo", c4.stages.rloo, 4, True, load_shape("qwen2.5-1.5b"), budget)}
    with pytest.raises(ConfigError, match=r"stages\.rloo\.reward_model_gpu: the reward model needs a GPU of its own "
                                          r"and the node's 4 GPU\(s\) are taken \(\[0, 1, 2, 3\]\)"):
        place_wave(c4, topo, ["rloo"], plans4, False, lines.append)
