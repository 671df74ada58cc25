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


QUIET_SCRIPT = """
import logging, os, sys
from medgpt_ray.run.native_logs import route_native_stderr
from medgpt_ray.run.ray_logs import route_ray_logs
log = route_ray_logs(sys.argv[1])
assert route_native_stderr(log)
# Ray's core worker writes to fd 2 itself, past Python (when Ray Data starts an actor pool; at exit).
os.write(2, b"[2026-12-04 20:42:11,668 E 22124 22124] core_worker.cc:2465: Actor ... max_restarts > 0. native-line\\n")
os.write(2, b"(raylet) [2026-12-04 20:42:12,001 E 1 1] graceful_shutdown failed native-raylet-line\\n")
logging.getLogger("ray.data.dataset").warning("Warning: The Ray cluster currently does not have any available "
                                              "CPUs. The Dataset job will hang unless more CPUs are freed up.")
# transformers' warning, from its logger (importing transformers and a tokenizer costs ~5-15 s on a busy 2-core box);
# without the routing it would reach the console through logging's last-resort handler (or transformers' own).
logging.getLogger("transformers.tokenization_utils_base").warning(
    "Token indices sequence length is longer than the specified maximum sequence length for this model (40 > 4).")
print("our-own-error-line", file=sys.stderr)
"""


def test_library_and_native_warnings_go_to_the_log_file_and_ours_stay(tmp_path, repo):
    """Issue 36 item 5: transformers' token-length warning, Ray's native core-worker/raylet lines and Ray Data's
    "the Dataset job will hang" go to the command's log file; our own stderr lines reach the terminal."""
    log = tmp_path / "generate.log"
    p = subprocess.run([sys.executable, "-c", QUIET_SCRIPT, str(log)], capture_output=True,
                       text=True, timeout=120, cwd=repo)
    assert p.returncode == 0, p.stderr
    console = p.stdout + p.stderr
    assert "our-own-error-line" in p.stderr
    for quiet in ("native-line", "native-raylet-line", "Dataset job will hang", "Token indices sequence length"):
        assert quiet not in console, console
        assert quiet in log.read_text(encoding="utf-8"), quiet
