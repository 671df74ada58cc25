"""A real Prometheus server for tests: loopback only, temporary storage, stopped afterwards."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PromServer:
    def __init__(self, workdir: Path, scrape: dict):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus not found: install Debian's prometheus package (.ci/run does)")
        self.port, self.config = free_port(), workdir / "prometheus.yml"
        self._write_config([scrape])
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _write_config(self, scrape_configs: list[dict]) -> None:
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
        self.config.write_text(json.dumps(cfg))

    def stop_scraping(self, timeout: float = 30) -> None:
        """Keep what was scraped, queryable, and scrape nothing more (a config without targets, reloaded on
        SIGHUP). A Ray metrics agent renders all its series on each scrape: scraped every second for a whole test
        session it took a quarter of one of CI's two cores by the end."""
        self._write_config([])
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._active_targets():
            assert time.monotonic() < deadline, f"prometheus still scrapes {timeout}s after its reload"
            time.sleep(0.2)

    def _active_targets(self) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/targets?state=active"
        return json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]["activeTargets"]

    def _wait_ready(self) -> None:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 90) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(1)
        raise AssertionError(f"no result for {promql} within {timeout}s")

    def settle(self, queries: list[str], timeout: float = 90) -> bool:
        """Whether every query has a result within `timeout` (no error either way: the test that reads them
        asserts, this only decides how long to keep scraping)."""
        deadline = time.monotonic() + timeout
        while not all(self.query(q) for q in queries):
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def tiny_run_series(run: str) -> list[str]:
    """What the shared tiny run leaves in Prometheus (tests/ray/test_prometheus_scrape.py reads these): sft's loss
    from rank 0, its tokens/s, and the pipeline's done state for sft, the last series the run exports. The window
    reaches back an hour: scraping stops once these are in, and the test may run minutes after the run."""
    return [f'last_over_time(ray_medgpt_train_loss{{run="{run}", stage="sft"}}[1h])',
            f'max(last_over_time(ray_medgpt_train_tokens_per_second{{run="{run}"}}[1h]))',
            f'last_over_time(ray_medgpt_pipeline_stage_state{{run="{run}", stage="sft", state="done"}}[1h]) == 1']
