"""NCCL and CUDA environment presets for a GPU topology (PCIe without P2P, multi-node Ethernet, NVLink)."""

from __future__ import annotations

import os

from medgpt_ray.placement.topology import Topology


def nccl_env(topo: Topology, num_nodes: int = 1, user_env: dict[str, str] | None = None,
             environ: dict[str, str] | None = None) -> dict[str, str]:
    """NCCL and CUDA settings for this topology; a variable the user set (config or environment) is kept."""
    preset: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    name = topo.gpu_name.lower()
    if not topo.p2p_available():
        # GeForce 40-series report P2P but corrupt or hang on it; NCCL must go through host memory.
        preset["NCCL_P2P_DISABLE"] = "1"
    if num_nodes == 1:
        preset["NCCL_IB_DISABLE"] = "1"
    else:
        # Consumer boxes talk over Ethernet: more sockets and threads per connection fill a 10-100 GbE link.
        preset["NCCL_IB_DISABLE"] = "1"
        preset["NCCL_SOCKET_NTHREADS"] = "4"
        preset["NCCL_NSOCKS_PERTHREAD"] = "4"
    if any(x in name for x in ("h100", "h200")) and any(topo.link(i, j).startswith("NV")
                                                         for i in range(topo.n) for j in range(topo.n)):
        # NVLink SHARP/multicast is off on the lent H200 machines (FIELD-NOTES).
        preset.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                       "NVSHMEM_DISABLE_NVLS": "1"})
    env = dict(os.environ if environ is None else environ)
    user = dict(user_env or {})
    out = {k: v for k, v in preset.items() if k not in env and k not in user}
    out.update(user)
    return out
