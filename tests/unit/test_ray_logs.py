"""Ray's and Ray Data's log lines go to the run's log file; the console keeps warnings (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging, sys
from medgpt_ray.run.ray_logs import route_ray_logs
route_ray_logs(sys.argv[1])
import ray.data  # configures its logger from the YAML route_ray_logs wrote
logging.getLogger("ray.data").info("data-info-line")
logging.getLogger("ray.data").warning("data-warning-line")
logging.getLogger("ray").info("ray-info-line")
logging.getLogger("ray.data").warning("Progress bars disabled. To enable, set ...")
"""


def test_info_goes_to_the_file_and_warnings_stay_on_the_console(tmp_path, repo):
    log = tmp_path / "logs" / "ray.log"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=120,
                       cwd=repo)
    assert p.returncode == 0, p.stderr
    console = p.stdout + p.stderr
    assert "data-warning-line" in console
    assert "data-info-line" not in console and "ray-info-line" not in console
    assert "Logging error" not in console and "Progress bars disabled" not in console
    text = log.read_text(encoding="utf-8")
    assert "data-info-line" in text and "data-warning-line" in text and "ray-info-line" in text
