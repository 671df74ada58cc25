"""On-prem cluster assets: ray_cluster.yaml (checked with Ray's own launcher validation) and
cluster/start-node.sh (run in --dry-run mode against a fake nvidia-smi; no Ray process is started)."""

from __future__ import annotations

import copy
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray._private.label_utils import parse_node_labels_string
from ray.autoscaler._private.local.config import LOCAL_CLUSTER_NODE_TYPE
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.scripts.scripts import start as ray_start_command

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "ray_cluster.yaml"
START_NODE = REPO / "cluster" / "start-node.sh"
SHARED_CHECKOUT = "/mnt/shared/medgpt-ray/"  # where ray_cluster.yaml expects the project on every node

QUERY_ARGS = "--query-gpu=index,name,pci.bus_id --format=csv,noheader"
FOUR_4090 = [
    "0, NVIDIA GeForce RTX 4090, 00000000:01:00.0",
    "1, NVIDIA GeForce RTX 4090, 00000000:21:00.0",
    "2, NVIDIA GeForce RTX 4090, 00000000:41:00.0",
    "3, NVIDIA GeForce RTX 4090, 00000000:61:00.0",
]
FOUR_GPU_RESOURCES = {f"medgpt_gpu_{i}": 1 for i in range(4)}
FOUR_4090_LABELS = {"medgpt.io/gpu-count": "4", "medgpt.io/gpu-name": "rtx4090"}


# ---- ray_cluster.yaml ----------------------------------------------------------------------------


def load_cluster_yaml() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def prepared_config() -> dict:
    # What `ray up` does before anything else (commands._bootstrap_config): fill the local provider's
    # node type and defaults, then validate against ray/autoscaler/ray-schema.json and Ray's own checks.
    config = prepare_config(load_cluster_yaml())
    validate_config(config)
    return config


def test_cluster_yaml_passes_rays_launcher_validation():
    raw = load_cluster_yaml()
    assert raw["provider"]["type"] == "local"
    workers = raw["provider"]["worker_ips"]
    assert len(workers) == 2 and raw["provider"]["head_ip"] not in workers
    assert raw["min_workers"] == raw["max_workers"] == len(workers)
    assert raw["auth"]["ssh_user"]

    config = prepared_config()
    node_type = config["available_node_types"][LOCAL_CLUSTER_NODE_TYPE]
    assert node_type["min_workers"] == node_type["max_workers"] == len(workers)
    assert config["max_workers"] == len(workers)


def test_ray_validator_rejects_a_misspelt_key():
    # The validator is strict (additionalProperties: false), so the test above means something.
    bad = copy.deepcopy(load_cluster_yaml())
    bad["head_start_ray_command"] = bad.pop("head_start_ray_commands")
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(bad))


def test_every_launcher_command_is_valid_bash():
    config = prepared_config()
    keys = ["head_setup_commands", "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands"]
    for key in keys:
        for command in config[key]:
            result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert result.returncode == 0, f"{key}: {command!r}: {result.stderr}"


def test_start_commands_go_through_start_node_with_token_auth():
    config = prepared_config()
    head = "\n".join(config["head_start_ray_commands"])
    worker = "\n".join(config["worker_start_ray_commands"])
    assert "cluster/start-node.sh --head" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head  # the head runs the autoscaler
    assert "cluster/start-node.sh --address=$RAY_HEAD_IP:6379" in worker
    for commands in (head, worker):
        assert "RAY_AUTH_MODE=token" in commands
        assert "ray start" not in commands  # resources and labels come from start-node.sh on each node
    everything = yaml.safe_dump(config)
    assert "RAY_AUTH_MODE=disabled" not in everything
    assert "0.0.0.0" not in everything
    # The token reaches every node.
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # Install order of the Makefile: torch, then DeepSpeed without build isolation, then the project.
    install = next(c for c in config["head_setup_commands"] if "pip install" in c)
    order = [install.index(s) for s in ("torch==2.13.0", "--no-build-isolation deepspeed==0.19.8", "-e '.[gpu]'")]
    assert order == sorted(order)


# ---- cluster/start-node.sh ---------------------------------------------------------------------------


def fake_nvidia_smi(tmp_path: Path, lines: list[str]) -> Path:
    """An nvidia-smi that answers only the query start-node.sh must make."""
    listing = tmp_path / "gpus.csv"
    listing.write_text("".join(line + "\n" for line in lines))
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" != "{QUERY_ARGS}" ]; then echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2; fi\n'
        f'cat "{listing}"\n'
    )
    fake.chmod(0o755)
    return fake


def run_start_node(tmp_path: Path, *args: str, nvidia_smi: Path | None = None, token: bool = True,
                   shell: str | None = None, extra_env: dict[str, str] | None = None):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    if token:
        (home / ".ray" / "auth_token").write_text("test-token")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MEDGPT_NVIDIA_SMI")}
    env["HOME"] = str(home)
    env["MEDGPT_NVIDIA_SMI"] = str(nvidia_smi) if nvidia_smi else str(tmp_path / "no-such-nvidia-smi")
    env.update(extra_env or {})
    argv = ["bash", "-c", shell] if shell else [str(START_NODE), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


def parse_printed_command(stdout: str) -> tuple[dict[str, str], dict]:
    """Split the printed line into its env assignments and `ray start`'s parsed options (Ray's own CLI parser)."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    words = shlex.split(lines[0])
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert Path(words[0]).name == "ray" and words[1] == "start", words
    ctx = ray_start_command.make_context("start", words[2:])  # fails on an option `ray start` does not have
    return env, ctx.params


def test_start_node_is_executable():
    assert os.access(START_NODE, os.X_OK)
    assert START_NODE.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in START_NODE.read_text()


def test_head_dry_run_advertises_every_gpu(tmp_path):
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=fake_nvidia_smi(tmp_path, FOUR_4090))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for i in range(4):
        assert f'"medgpt_gpu_{i}": 1' in out
    assert "medgpt_gpu_4" not in out
    assert "--labels=medgpt.io/gpu-count=4,medgpt.io/gpu-name=rtx4090" in out
    assert "--metrics-export-port=8080" in out
    assert "--dashboard-host=127.0.0.1" in out

    env, params = parse_printed_command(out)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RAY_AUTH_MODE": "token"}
    assert params["head"] is True and params["port"] == 6379
    assert params["dashboard_host"] == "127.0.0.1"
    assert params["metrics_export_port"] == 8080
    assert params["num_gpus"] == 4
    assert json.loads(params["resources"]) == FOUR_GPU_RESOURCES
    assert parse_node_labels_string(params["labels"]) == FOUR_4090_LABELS  # Ray's own label parser/validator


def test_worker_dry_run_joins_the_head(tmp_path):
    smi = fake_nvidia_smi(tmp_path, FOUR_4090)
    result = run_start_node(tmp_path, "--address=192.0.2.10:6379", "--dry-run", nvidia_smi=smi)
    assert result.returncode == 0, result.stderr
    env, params = parse_printed_command(result.stdout)
    assert env["RAY_AUTH_MODE"] == "token" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert params["address"] == "192.0.2.10:6379" and not params["head"]
    assert "--dashboard-host" not in result.stdout and "--port=" not in result.stdout
    assert params["metrics_export_port"] == 8080
    assert json.loads(params["resources"]) == FOUR_GPU_RESOURCES
    assert parse_node_labels_string(params["labels"]) == FOUR_4090_LABELS


def test_launcher_start_commands_produce_the_conventions(tmp_path):
    """The YAML's start commands, pointed at this checkout and given --dry-run, yield the expected `ray start`."""
    config = prepared_config()
    smi = fake_nvidia_smi(tmp_path, FOUR_4090)
    for key, expect_head in (("head_start_ray_commands", True), ("worker_start_ray_commands", False)):
        command = next(c for c in config[key] if "start-node.sh" in c)
        command = command.replace(SHARED_CHECKOUT, f"{REPO}/").replace("start-node.sh ", "start-node.sh --dry-run ", 1)
        result = run_start_node(tmp_path, nvidia_smi=smi, shell=command, extra_env={"RAY_HEAD_IP": "192.0.2.10"})
        assert result.returncode == 0, f"{key}: {result.stderr}"
        _, params = parse_printed_command(result.stdout)
        assert params["metrics_export_port"] == 8080
        assert json.loads(params["resources"]) == FOUR_GPU_RESOURCES
        assert parse_node_labels_string(params["labels"]) == FOUR_4090_LABELS
        if expect_head:
            assert params["head"] and params["dashboard_host"] == "127.0.0.1"
            assert params["autoscaling_config"] == "~/ray_bootstrap_config.yaml"
        else:
            assert params["address"] == "192.0.2.10:6379"


def test_no_gpu_listed_is_an_error(tmp_path):
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=fake_nvidia_smi(tmp_path, []))
    assert result.returncode != 0
    assert "no GPU found" in result.stderr
    assert "--cpu-only" in result.stderr
    assert result.stdout == ""


def test_missing_nvidia_smi_is_an_error(tmp_path):
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=None)
    assert result.returncode != 0
    assert "no GPU found" in result.stderr
    assert result.stdout == ""


def test_cpu_only_needs_no_nvidia_smi(tmp_path):
    result = run_start_node(tmp_path, "--head", "--dry-run", "--cpu-only", nvidia_smi=None)
    assert result.returncode == 0, result.stderr
    _, params = parse_printed_command(result.stdout)
    assert params["num_gpus"] == 0
    assert "medgpt_gpu_" not in result.stdout
    assert parse_node_labels_string(params["labels"]) == {"medgpt.io/gpu-count": "0", "medgpt.io/gpu-name": "none"}


def test_visible_devices_subset_is_refused(tmp_path):
    smi = fake_nvidia_smi(tmp_path, FOUR_4090)
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=smi, extra_env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode != 0
    assert "CUDA_VISIBLE_DEVICES" in result.stderr


def test_mixed_gpu_models_are_labelled_mixed(tmp_path):
    smi = fake_nvidia_smi(tmp_path, [FOUR_4090[0], "1, NVIDIA GeForce RTX 3090, 00000000:21:00.0"])
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=smi)
    assert result.returncode == 0, result.stderr
    _, params = parse_printed_command(result.stdout)
    assert json.loads(params["resources"]) == {"medgpt_gpu_0": 1, "medgpt_gpu_1": 1}
    assert parse_node_labels_string(params["labels"])["medgpt.io/gpu-name"] == "mixed"


def test_head_without_token_would_generate_one_but_dry_run_writes_nothing(tmp_path):
    smi = fake_nvidia_smi(tmp_path, FOUR_4090)
    result = run_start_node(tmp_path, "--head", "--dry-run", nvidia_smi=smi, token=False)
    assert result.returncode == 0, result.stderr
    assert "get-auth-token --generate" in result.stderr
    assert not (tmp_path / "home" / ".ray" / "auth_token").exists()


def test_worker_without_token_is_refused(tmp_path):
    # Not a dry run: the script must stop at the token check, before `ray start`.
    smi = fake_nvidia_smi(tmp_path, FOUR_4090)
    result = run_start_node(tmp_path, "--address=192.0.2.10:6379", nvidia_smi=smi, token=False)
    assert result.returncode != 0
    assert "auth token" in result.stderr and "~/.ray/auth_token" in result.stderr


def test_unknown_argument_is_refused(tmp_path):
    result = run_start_node(tmp_path, "--head", "--dashboard-host=0.0.0.0", "--dry-run",
                            nvidia_smi=fake_nvidia_smi(tmp_path, FOUR_4090))
    assert result.returncode != 0
    assert "unknown argument" in result.stderr


def copy_with_fake_ray(tmp_path: Path) -> Path:
    """start-node.sh in a scratch checkout whose .venv/bin/ray only records its arguments (and, for
    get-auth-token --generate, writes a token under the caller's umask as Ray does): a real, non-dry run."""
    repo = tmp_path / "repo"
    (repo / "cluster").mkdir(parents=True)
    script = repo / "cluster" / "start-node.sh"
    script.write_text(START_NODE.read_text())
    script.chmod(0o755)
    fake = repo / ".venv" / "bin" / "ray"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "$*" >> "$HOME/ray-calls"\n'
                    'if [ "$1" = get-auth-token ]; then echo generated > "$HOME/.ray/auth_token"; fi\n')
    fake.chmod(0o755)
    return script


@pytest.mark.parametrize("has_token", [True, False])
def test_the_token_ends_owner_only_and_the_metrics_exposure_is_said(tmp_path, has_token):
    script = copy_with_fake_ray(tmp_path)
    home = tmp_path / "home"
    if has_token:
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("given")
        (home / ".ray" / "auth_token").chmod(0o644)
    result = run_start_node(tmp_path, token=False, shell=f"umask 022 && {script} --head --cpu-only")
    assert result.returncode == 0, result.stderr
    token = home / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text().strip() == ("given" if has_token else "generated")
    if not has_token:
        assert stat.S_IMODE((home / ".ray").stat().st_mode) == 0o700
    else:
        assert "was mode 644 (readable by others): now 600" in result.stderr
    assert "answers GET /metrics on every interface without a token" in result.stderr
    assert "start" in (home / "ray-calls").read_text()
