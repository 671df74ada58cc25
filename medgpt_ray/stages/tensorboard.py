"""TensorBoard event files of a stage (`report_to: tensorboard`): rank 0 writes the scalars it also exports to
Prometheus, under the same names (medgpt_train_loss, medgpt_train_learning_rate, ...), to runs/<name>/<stage>/tb/.

`tensorboard --logdir runs/<name>` shows every stage of a run side by side. Held-out results, which Prometheus
does not carry, are written as medgpt_eval_<name> (medgpt_eval_loss, ...).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

TB_DIR = "tb"


class TensorBoardScalars:
    """One stage's event file, written synchronously with tensorboardX's EventsWriter (which Ray's tune extra
    installs): SummaryWriter queues events for a thread, and its flush() does not wait for that queue, so what a
    stage logged last could still be in memory when its worker exits."""

    def __init__(self, log_dir: Path):
        from tensorboardX.event_file_writer import EventsWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        # One file per process (a resumed attempt adds its own; TensorBoard reads them all, in order).
        self.writer = EventsWriter(str(log_dir / "events"), filename_suffix=f".{os.getpid()}")

    def add(self, name: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        if math.isfinite(value):
            self.writer.write_event(Event(wall_time=time.time(), step=int(step), summary=scalar(name, value)))

    def add_eval(self, logs: dict[str, Any], step: int) -> None:
        """The held-out results of one evaluation (`eval_loss` -> medgpt_eval_loss)."""
        for key, value in logs.items():
            if key.startswith("eval_") and isinstance(value, int | float) and not isinstance(value, bool):
                self.add("medgpt_eval_" + key.removeprefix("eval_"), float(value), step)

    def flush(self) -> None:
        self.writer.flush()


def tensorboard_for(out_dir: Path, report_to: str, rank_zero: bool) -> TensorBoardScalars | None:
    """The writer when the stage reports to TensorBoard and this process is rank 0, else None."""
    if report_to != "tensorboard" or not rank_zero:
        return None
    return TensorBoardScalars(out_dir / TB_DIR)
