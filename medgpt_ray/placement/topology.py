"""A node's GPU topology: the `nvidia-smi topo -m` matrix, read live or from a saved file.

Indices are PCI bus order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`), the numbering nvidia-smi
prints, so a choice made here names the same cards everywhere. Saved topologies
(cluster/topologies/) carry two header comments the matrix lacks:
`# gpu_name: ...` and `# p2p: on|off`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

LINK_TYPES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "cluster" / "topologies"


class TopologyError(ValueError):
    pass


class NoGPUError(TopologyError):
    pass


@dataclass
class Topology:
    links: list[list[str]]  # links[i][j]: X, PIX, PXB, PHB, NODE, SYS or NV<n>
    gpu_name: str = "unknown"
    p2p: bool | None = None  # None: unknown (decided from the GPU model)
    numa: list[str] = field(default_factory=list)
    cpu_affinity: list[str] = field(default_factory=list)
    source: str = ""
    bus_ids: list[str] = field(default_factory=list)  # PCI bus ids, when read from the machine

    @property
    def n(self) -> int:
        return len(self.links)

    def link(self, i: int, j: int) -> str:
        return self.links[i][j]

    def p2p_available(self) -> bool:
        """GeForce 40-series cards have no peer-to-peer; NVLink-bridged pairs do; datacenter cards do."""
        if self.p2p is not None:
            return self.p2p
        name = self.gpu_name.lower()
        if "geforce" in name or "rtx" in name:
            return any(self.links[i][j].startswith("NV") for i in range(self.n) for j in range(self.n))
        return True

    def switch_groups(self) -> list[list[int]]:
        """GPUs behind one PCIe switch (PIX to each other): they share that switch's uplink to the CPU."""
        groups: list[list[int]] = []
        seen: set[int] = set()
        for i in range(self.n):
            if i in seen:
                continue
            group = [i] + [j for j in range(self.n) if j != i and self.links[i][j] == "PIX"]
            seen.update(group)
            groups.append(sorted(group))
        return groups

    def matrix_text(self) -> str:
        head = "      " + " ".join(f"GPU{j:<3d}" for j in range(self.n))
        rows = [head] + [f"GPU{i:<3d}" + " ".join(f"{self.links[i][j]:<6s}" for j in range(self.n))
                         for i in range(self.n)]
        return "\n".join(rows)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo_matrix(text: str, source: str = "<text>") -> Topology:
    """Parse `nvidia-smi topo -m` output (GPU rows; NIC rows/columns, the legend and CPU/NUMA columns too)."""
    meta: dict[str, str] = {}
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    extras: dict[int, list[str]] = {}
    # nvidia-smi underlines the header row with ANSI escapes (\x1b[4m ... \x1b[0m), even into a pipe.
    text = ANSI_ESCAPE.sub("", text)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\n")
        if line.startswith("#"):
            m = re.match(r"#\s*([\w-]+)\s*:\s*(.+)", line)
            if m:
                meta[m.group(1).lower()] = m.group(2).strip()
            continue
        if not line.strip() or line.strip().startswith("Legend"):
            if header is not None and rows:
                break  # the legend follows the matrix
            continue
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = cells
            continue
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue  # NIC rows
        gpu_cols = [k for k, c in enumerate(header) if re.fullmatch(r"GPU\d+", c)]
        try:
            links = [cells[k] for k in gpu_cols]
        except IndexError:
            raise TopologyError(f"{source}:{lineno}: row {cells[0]} has fewer columns than the header") from None
        for c in links:
            if c not in LINK_TYPES and not re.fullmatch(r"NV\d+", c):
                raise TopologyError(f"{source}:{lineno}: unknown link type {c!r} (expected one of "
                                    f"{', '.join(LINK_TYPES)} or NV<n>)")
        rows[int(cells[0][3:])] = ["X" if c == "X" else c for c in links]
        named = {h: cells[k] for k, h in enumerate(header) if k < len(cells) and h}
        extras[int(cells[0][3:])] = [named.get("CPU Affinity", ""), named.get("NUMA Affinity", "")]
    if header is None or not rows:
        raise NoGPUError(f"{source}: no GPU matrix found (is this `nvidia-smi topo -m` output?)")
    n = len(rows)
    if sorted(rows) != list(range(n)) or any(len(r) != n for r in rows.values()):
        raise TopologyError(f"{source}: the GPU matrix is not square over GPU0..GPU{n - 1}")
    links = [rows[i] for i in range(n)]
    for i in range(n):
        for j in range(n):
            if links[i][j] != links[j][i]:
                raise TopologyError(f"{source}: GPU{i}-GPU{j} is {links[i][j]} but GPU{j}-GPU{i} is {links[j][i]}")
    p2p = {"on": True, "off": False}.get(meta.get("p2p", "").lower())
    return Topology(links, meta.get("gpu_name", "unknown"), p2p, [extras[i][1] for i in range(n)],
                    [extras[i][0] for i in range(n)], source)


def load_topology_file(path: str | Path) -> Topology:
    p = Path(path)
    if not p.is_file() and (SHIPPED_DIR / f"{path}.txt").is_file():
        p = SHIPPED_DIR / f"{path}.txt"  # a shipped topology by name, e.g. 8x4090-dual-socket
    if not p.is_file():
        raise TopologyError(f"topology file not found: {path} (shipped: {', '.join(shipped_topologies())})")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TopologyError(f"{p}: not a text file (byte {e.start}); expected the output of `nvidia-smi topo -m`") \
            from None
    return parse_topo_matrix(text, str(p))


def shipped_topologies() -> list[str]:
    return sorted(f.stem for f in SHIPPED_DIR.glob("*.txt"))


def read_local_topology(nvidia_smi: str | None = None) -> Topology:
    """This machine's topology: `nvidia-smi topo -m`, the GPU name and P2P support from nvidia-smi/NVML."""
    smi = nvidia_smi or shutil.which("nvidia-smi")
    if not smi:
        raise NoGPUError("no GPU here: nvidia-smi is not installed; pass --topology-file to plan for a saved "
                         f"topology ({', '.join(shipped_topologies())})")
    try:
        text = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=30, check=True).stdout
        listing = subprocess.run([smi, "--query-gpu=name,pci.bus_id", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError) as e:
        raise NoGPUError(f"no GPU here: `nvidia-smi topo -m` failed ({e})") from None
    topo = parse_topo_matrix(text, "nvidia-smi topo -m")
    rows = [[c.strip() for c in line.rsplit(",", 1)] for line in listing if line.strip()]
    if rows:
        topo.gpu_name = rows[0][0]
        topo.bus_ids = [r[1] for r in rows if len(r) == 2]
    topo.p2p = _nvml_p2p(topo.n)
    return topo


def _nvml_int(value) -> int:
    """pynvml's constants as plain ints: some builds (the H200 image's) define NVML_P2P_CAPS_INDEX_READ as a
    1-tuple or an enum member, which ctypes cannot pass."""
    while isinstance(value, tuple):
        value = value[0]
    return int(getattr(value, "value", value))


def _nvml_p2p(n: int) -> bool | None:
    """Whether every pair can read peer-to-peer (NVML); None when NVML is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                                       _nvml_int(pynvml.NVML_P2P_CAPS_INDEX_READ))
                if _nvml_int(status) != _nvml_int(pynvml.NVML_P2P_STATUS_OK):
                    return False
        return True
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - NVML may not have initialised; nothing to release then
            pass
