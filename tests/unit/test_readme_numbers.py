"""The numbers README.md quotes from GPU runs are the committed results' (issue 48: a number quoted from a run is
generated or checked by a test): the side-by-side table of bench/peers/ and the opd big-teacher peak."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = ROOT / "bench" / "results"

PEER_ROWS = {  # the README row's first cell -> the result it quotes
    "medgpt-ray (ours, in the torchtune call)": "peers_h100/ours_qwen2.5-7b.json",
    "torchtune 0.6.1": "peers_h100/torchtune_qwen2.5-7b.json",
    "medgpt-ray (ours, in the Unsloth call)": "peers_h100_call2/ours_qwen2.5-7b.json",
    "Unsloth 2026.10.9": "peers_h100_call2/unsloth_qwen2.5-7b.json",
}


def readme_row(first_cell: str) -> list[str]:
    for line in README.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"README.md has no table row {first_cell!r}")


@pytest.mark.parametrize("first_cell", list(PEER_ROWS))
def test_the_peers_table_quotes_the_committed_runs(first_cell):
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    import table

    doc = json.loads((RESULTS / PEER_ROWS[first_cell]).read_text(encoding="utf-8"))
    row = table.row(doc)
    _, rate, peak, mfu_6n, mfu_lora, first_step, padding = readme_row(first_cell)
    assert int(rate.replace(",", "")) == row["tokens_per_s"]
    assert float(peak) == row["peak_gib"]
    assert (mfu_6n, mfu_lora) == (table.pct(row["mfu_6n"]), table.pct(row["mfu_lora"]))
    assert first_step == f"{row['first_step_s']:.1f} s"
    assert float(padding.removesuffix(" %")) == round(100 * row["padding_share"], 1)


def test_the_opd_big_teacher_peak_is_the_runs():
    doc = json.loads((RESULTS / "opd_7b_nf4_teacher_h100" / "rl_stage_run.json").read_text(encoding="utf-8"))
    measured = doc["stages"]["opd"]["measured_peak_gib"]
    quoted = re.search(r"7B\s+teacher in 4-bit over a 1\.5B student fits one 24 GB card \(([\d.]+) GiB measured",
                       README)
    assert quoted, "README.md no longer quotes the 7B teacher's peak"
    assert float(quoted.group(1)) == round(measured, 2)
    assert doc["stages"]["opd"]["plan"]["micro_batch"] == 8 and "micro-batch 8" in README
