"""Ray's own log lines go to a file; the terminal keeps our progress lines, summaries and warnings.

Ray (`ray` logger: "Started a local Ray instance", ...) and Ray Data (`ray.data`: execution plans, "Progress
will be logged ...", a `logging_progress.py` block every few seconds when stdout is not a terminal) log at
INFO to the console by default: hundreds of lines for a 1,000-record cleaning. Ray Data configures its
logger from RAY_DATA_LOGGING_CONFIG when `ray.data` is imported, and again with dictConfig: both ways are
covered here. `verbose` keeps the console at INFO as Ray ships it.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
from pathlib import Path

import yaml

FORMAT = "%(asctime)s\t%(levelname)s %(name)s %(filename)s:%(lineno)s -- %(message)s"


class HideOurChoices(logging.Filter):
    """Warnings about what we chose on purpose: Ray Data's progress bars are off (our own progress line replaces
    them) and token authentication is on (docs/security.md); and one that is wrong for us: "no available
    CPUs ... the Dataset job will hang" when a Dataset starts while our warm-up tasks (clean) or the actor pool
    being built (generate) hold the CPUs for a moment. They stay in the log file."""

    CHOSEN = ("Progress bars disabled", "Token authentication is enabled for this Ray cluster",
              "Warning: The Ray cluster currently does not have any available CPUs")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.CHOSEN)


def _ray_data_config(log_file: Path, console_level: str) -> dict:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"ray": {"format": FORMAT}},
        "filters": {"console_filter": {"()": "ray.data._internal.logging.HiddenRecordFilter"},
                    "our_choices": {"()": "medgpt_ray.run.ray_logs.HideOurChoices"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "formatter": "ray", "filename": str(log_file),
                     "encoding": "utf-8"},
            "console": {"class": "logging.StreamHandler", "formatter": "ray", "level": console_level,
                        # stderr, the default: an "ext://sys.stderr" stream in this YAML reached Ray Data's
                        # handler as a plain string ("'str' object has no attribute 'write'" on its first warning)
                        "filters": ["console_filter", "our_choices"]},
        },
        "loggers": {"ray.data": {"level": "DEBUG" if console_level == "INFO" else "INFO",
                                 "handlers": ["file", "console"], "propagate": False}},
    }


# transformers' loggers whose warnings read like errors but are not: "Token indices sequence length is longer than
# the specified maximum sequence length" when the driver measures records longer than the tokenizer's
# model_max_length (the lengths profile: records are cut or left out by the stage's own rule, not by this).
QUIET_LIBRARY_LOGGERS = ("transformers.tokenization_utils_base",)


def _library_warnings_to(log_file: Path) -> None:
    for name in QUIET_LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(log_file) for h in logger.handlers):
            handler = logging.FileHandler(log_file, encoding="utf-8")
            handler.setFormatter(logging.Formatter(FORMAT))
            logger.addHandler(handler)
        logger.propagate = False  # not up to transformers' console handler


def route_ray_logs(log_file: Path, verbose: bool = False) -> Path:
    """Send Ray's and Ray Data's log records to `log_file` (appended); the console shows WARNING and above
    (INFO with `verbose`). Call before `ray.init` so the start-up lines follow the same rule."""
    log_file = Path(log_file).resolve()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    console_level = "INFO" if verbose else "WARNING"
    config = _ray_data_config(log_file, console_level)
    config_path = log_file.with_name(f".{log_file.stem}-ray-data-logging.yaml")
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    os.environ["RAY_DATA_LOGGING_CONFIG"] = str(config_path)
    if "ray.data" in sys.modules:  # already configured from Ray's defaults: apply ours now
        logging.config.dictConfig(config)

    import ray  # noqa: F401  (sets up the `ray` logger's console handler, which we then turn down)

    ray_logger = logging.getLogger("ray")
    for handler in ray_logger.handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(console_level)
            if not verbose and not any(isinstance(f, HideOurChoices) for f in handler.filters):
                handler.addFilter(HideOurChoices())
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(log_file) for h in ray_logger.handlers):
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter(FORMAT))
        ray_logger.addHandler(file_handler)
    if not verbose:
        _library_warnings_to(log_file)
    if not verbose:  # Ray Data's progress bars (or their logged form): our own progress line says more
        os.environ["RAY_DATA_DISABLE_PROGRESS_BARS"] = "1"
        if "ray.data" in sys.modules:
            from ray.data import DataContext

            DataContext.get_current().enable_progress_bars = False
    return log_file
