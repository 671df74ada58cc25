"""A run's data, for the pipeline and for Tune sweeps alike: `data.raw` cleaned by Ray Data, then every data kind's
train/held-out split from the same paths (the config's own files and the cleaned ones), and the fingerprint of
those paths (docs/ARCHITECTURE.md: the data flow)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError, PipelineConfig, stage_kind
from medgpt_ray.data import prepare
from medgpt_ray.data.kinds import KINDS, DataFileError, source_kinds
from medgpt_ray.run.manifest import sha256_json, write_json_atomic
from medgpt_ray.run.upstream import PipelineError


class RunData:
    """The data side of one run (or sweep): `clean_dir` holds the cleaned `data.raw`, `data_dir` the splits."""

    def __init__(self, cfg: PipelineConfig, clean_dir: Path, data_dir: Path, echo: Callable[[str], None]):
        self.cfg, self.clean_dir, self.data_dir, self.echo = cfg, clean_dir, data_dir, echo

    def clean_raw(self, prov: dict[str, Any]) -> None:
        """Clean `data.raw` with Ray Data (nothing when the config has none); skipped when the sources, the cleaning
        options and the code are unchanged since the last cleaning into `clean_dir`."""
        if not self.cfg.data.raw:
            return
        from medgpt_ray.data.clean import clean_corpus
        from medgpt_ray.run.progress import LiveProgress

        clean_cfg = self.cfg.data.clean_config()  # its PII step off iff data.redact_pii is
        try:
            sources = prepare.sources_fingerprint(self.cfg.data.raw)
        except DataFileError as e:
            raise ConfigError(f"data.raw: {e}") from None
        fp = sha256_json({"sources": sources, "clean": clean_cfg.model_dump(mode="json"),
                          "code": {"git_commit": prov["git_commit"], "packages": prov["packages"]}})
        stamp = self.clean_dir / "fingerprint.json"
        if stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == fp:
            self.echo(f"[clean] raw sources unchanged since the last cleaning, using {self.clean_dir / 'data'}")
            return
        stamp.unlink(missing_ok=True)
        report = clean_corpus(self.cfg.data.raw, self.clean_dir, "auto", clean_cfg, echo=self.echo,
                              live_progress=LiveProgress, overwrite=True)  # clean_dir is this run's own
        if not report["adds_up"]:
            raise PipelineError(f"cleaning of data.raw does not add up; see {self.clean_dir / 'report.json'}")
        write_json_atomic(stamp, {"fingerprint": fp})

    def own_paths(self, kind: str) -> list[str]:
        """data.<kind>'s files, and the cleaned `data.raw` records of that kind once they exist."""
        cleaned = self.clean_dir / "data" / kind
        return self.cfg.data.paths(kind) + ([str(cleaned)] if self.cfg.data.raw and cleaned.is_dir() else [])

    def paths(self, kind: str) -> list[str]:
        """The files prepared as `kind` data: its own and those of the kinds also read as it (data/kinds.py)."""
        return [p for k in source_kinds(kind) for p in self.own_paths(k)]

    def kinds(self) -> list[str]:
        """The kinds an enabled stage trains on, and every other kind the config gives data for (read, cleaned
        and split now, so a bad file shows before the stage that needs it exists or is enabled)."""
        needed = {stage_kind(s).data_kind for s in self.cfg.enabled_stages()}
        return sorted(needed | {k for k in KINDS if k not in needed and self.own_paths(k)})

    def prepare(self, kinds: Iterable[str]) -> dict[str, prepare.PreparedData]:
        """The train/held-out split of each of `kinds`, PII-redacted unless data.redact_pii is false (said once)."""
        data, kinds = self.cfg.data, list(kinds)
        if not data.redact_pii and kinds:
            self.echo(prepare.not_redacted_line((["raw"] if data.raw else []) + kinds))
        prepared: dict[str, prepare.PreparedData] = {}
        for kind in kinds:
            try:
                d = prepare.prepare_kind(kind, self.paths(kind), self.data_dir, data.eval_fraction, data.max_records,
                                         data.pii_types())
            except DataFileError as e:  # a file's own error names the file; the key is said once
                key = f"data.{kind}:"
                raise ConfigError(str(e) if str(e).startswith(key) else f"{key} {e}") from None
            self.echo(prepare.prepared_line(d))
            prepared[kind] = d
        return prepared

    def fingerprint(self, kind: str) -> str:
        """Of the bytes of `kind`'s sources and the preparation options (data/prepare.py data_fingerprint)."""
        try:
            return prepare.data_fingerprint(self.paths(kind), self.cfg.data)
        except DataFileError as e:
            raise ConfigError(f"data.{kind}: {e}") from None
