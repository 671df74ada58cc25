"""The run manifest: which stages finished, under which fingerprint, with provenance.

An entry is written only after a stage's outputs are complete, and the file is
replaced atomically, so a crash never leaves a half-written manifest and a
re-run can trust every entry it finds.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_PACKAGES = ("medgpt-ray", "ray", "torch", "transformers", "trl", "peft", "deepspeed", "datasets",
                    "accelerate", "tokenizers")


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def package_versions() -> dict[str, str]:
    out = {}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def git_commit() -> str:
    """The code's commit; a `ray job submit` working-dir copy has no .git, so the env may carry it."""
    if os.environ.get("MEDGPT_RAY_COMMIT"):
        return os.environ["MEDGPT_RAY_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def provenance() -> dict[str, Any]:
    return {"git_commit": git_commit(), "packages": package_versions(), "driver_host": socket.gethostname()}


def write_json_atomic(path: Path, obj: Any, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True), encoding="utf-8")
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


class Manifest:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"stages": {}}
        if path.is_file():
            self.data = json.loads(path.read_text(encoding="utf-8"))
            self.data.setdefault("stages", {})

    def entry(self, stage: str) -> dict[str, Any] | None:
        return self.data["stages"].get(stage)

    def is_done(self, stage: str, fingerprint: str) -> bool:
        e = self.entry(stage)
        return bool(e and e.get("fingerprint") == fingerprint and Path(e.get("output_model", "")).is_dir())

    def record(self, stage: str, entry: dict[str, Any]) -> None:
        self.data["stages"][stage] = {**entry, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.save()

    def forget(self, stage: str) -> None:
        if self.data["stages"].pop(stage, None) is not None:
            self.save()

    def set_run_info(self, info: dict[str, Any]) -> None:
        self.data["run"] = info
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

